"""The runnable shell recipes of README.md and docs/*.md, each run as written in a fresh directory with what its
marker asks for (tests/recipes.py): a recipe that no longer works fails here, named by file and line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.recipes import STOCK, Recipe, console_steps, file_from_fences, matches, recipes

pytestmark = [pytest.mark.slow, pytest.mark.testbed(hosts=2)]

RUNNABLE = [r for r in recipes(REPO) if r.kind == "run" and not r.problem]
BIN = Path(sys.executable).parent


def clone_into(dest: Path) -> None:
    """This clone's files (tracked, and new ones git does not ignore), nothing built; .venv is the suite's."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    (dest / ".venv").symlink_to(sys.prefix)


def cluster_for_testbed(where: Path, testbed, shared: Path) -> None:
    """fdl.cluster.yml: the testbed's hosts as CPU workers, each probed and run with fdl's Python (torch)."""
    from tests.integration.launch.helpers import torch_python

    python = torch_python(shared)
    workers = testbed.workers(local_devices="cpu:1", python=str(python), data_path=str(testbed.storage))
    (where / "fdl.cluster.yml").write_text(yaml.safe_dump(testbed.cluster(workers), sort_keys=False))
    if not (where / "fdl.yml").exists():
        (where / "fdl.yml").write_text("commands: {}\n")


def environment(home: Path, extra: dict[str, str]) -> dict[str, str]:
    from fdl.launch.plan import free_port_pair

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FDL_", "XDG_", "ANSIBLE_", "LIBTORCH", "CUDA_", "GLOO_", "PYTHON"))}
    for sub in ("tmp", ".cache", "run"):
        (home / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
    env.update(HOME=str(home), TMPDIR=str(home / "tmp"), XDG_CACHE_HOME=str(home / ".cache"),
               XDG_RUNTIME_DIR=str(home / "run"), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
               FDL_PORT=str(free_port_pair()), NO_COLOR="1", LANG="C.UTF-8")
    env.update(extra)
    return env


def prepare(recipe: Recipe, request: pytest.FixtureRequest, root: Path) -> tuple[Path, dict[str, str]]:
    """The fresh directory and environment a recipe runs in."""
    work, home, extra = root / "work", root / "home", {}
    work.mkdir()
    if "clone" in recipe.options:
        clone_into(work)
    for name in recipe.options.get("files", "").split():
        text = file_from_fences(recipe, name)
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text if text is not None else STOCK[name])
    if "testbed" in recipe.options:
        testbed = request.getfixturevalue("testbed")
        cluster_for_testbed(work, testbed, testbed.shared / "recipes")
        extra.update(testbed.home_env(home))
    if "collection" in recipe.options:
        extra["ANSIBLE_COLLECTIONS_PATH"] = str(request.getfixturevalue("installed_collection"))
        extra["ANSIBLE_COLLECTIONS_SCAN_SYS_PATH"] = "False"  # the editable install puts this clone on sys.path
    return work, environment(home, extra)


@pytest.mark.parametrize("recipe", RUNNABLE, ids=[r.name for r in RUNNABLE])
def test_the_recipe_runs_as_written(recipe: Recipe, request: pytest.FixtureRequest, short_tmp: Path) -> None:
    work, env = prepare(recipe, request, short_tmp)
    if recipe.fence.lang == "console":
        for command, expected in console_steps(recipe.fence.text):
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=600)
            got = [line.rstrip() for line in done.stdout.splitlines()]
            assert done.returncode == 0 and matches(expected, got), (
                f"{recipe.where}: `{command}` exited {done.returncode}; it printed:\n{done.stdout}\n"
                f"{done.stderr}\nwhere the page shows:\n" + "\n".join(expected))
        return
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", recipe.fence.text], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (f"{recipe.where}: the recipe exited {done.returncode}:\n{recipe.fence.text}\n"
                                  f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}")
