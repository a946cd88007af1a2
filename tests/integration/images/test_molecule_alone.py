"""`molecule test -s NAME` on its own, from the repository root, with nothing set: the scenarios that need no
other host run on this machine in place (the clone's ansible.cfg, no collection, no build step); the ones
that need a host stop at converge and say what to set."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.images.conftest import BIN, tool_env

pytestmark = pytest.mark.slow
ANSI = re.compile(r"\x1b\[[0-9;]*m|\x1b\]8;;[^\x1b]*\x1b\\")


def molecule_alone(scenario: str, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in tool_env(home).items() if not k.startswith(("FDL_MOLECULE_", "ANSIBLE_COLLECTIONS"))}
    done = subprocess.run([str(BIN / "molecule"), "test", "-s", scenario], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    return subprocess.CompletedProcess(done.args, done.returncode, ANSI.sub("", done.stdout + done.stderr), "")


@pytest.mark.parametrize("scenario, steps", [
    ("fdl_probe", ("converge", "idempotence", "verify")),
    ("fdl_prebuild", ("converge", "side_effect", "verify")),
    ("fdl_nccl", ("converge", "side_effect", "verify")),
])
def test_a_scenario_without_a_host_runs_on_its_own(scenario, steps, short_tmp):
    done = molecule_alone(scenario, short_tmp / "home")
    out = done.stdout
    assert done.returncode == 0, out[-5000:]
    for step in steps:
        assert re.search(rf"{scenario} (?:➜|>) {step}: Executed: Successful", out), f"{step}:\n{out[-4000:]}"
    assert "ansible_collections" not in out  # in place: the clone's roles and modules, no collection
    if scenario == "fdl_probe":
        assert re.search(r'"msg": "localhost: (ready|NOT READY)', out), out[-3000:]  # the verdict line


@pytest.mark.parametrize("scenario, group", [("fdl_dispatch", "nodes"), ("fdl_join_door", "doors"),
                                             ("fdl_join_worker", "workers")])
def test_a_scenario_that_needs_a_host_says_what_to_set(scenario, group, short_tmp):
    done = molecule_alone(scenario, short_tmp / "home")
    out = " ".join(done.stdout.split())
    assert done.returncode != 0, out[-3000:]
    assert re.search(rf"{scenario} (?:➜|>) converge: Executed: Failed", out), out[-3000:]
    assert (f"set FDL_MOLECULE_INVENTORY to an inventory that puts one in group {group}" in out), out[-3000:]
