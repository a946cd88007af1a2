"""fdl's directories are named once (fdl/hostside/paths.py): no module of fdl spells them, the Ansible content's
defaults are kept equal to them, and the XDG directories are taken only where the specification says they may be."""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

import yaml

from fdl.hostside import paths
from tests.conftest import REPO, code_strings, fdl_modules, repo_relative

PATHS_FILE = REPO / "fdl" / "hostside" / "paths.py"
SPELLED = re.compile(r"~/\.flodl|/\.flodl\b|^\.flodl$|/flodl/data|^XDG_[A-Z_]+$")


def test_no_module_of_fdl_spells_one_of_its_directories():
    spelled = [f"{repo_relative(path)}:{line}: {text[:60]!r}" for path in fdl_modules() if path != PATHS_FILE
               for line, text in code_strings(path) if SPELLED.search(text)]
    assert spelled == [], "take the path from fdl.hostside.paths:\n" + "\n".join(spelled)


def test_a_spelled_directory_is_caught(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Lives in ~/.flodl/run."""\nfrom pathlib import Path\n\nA = Path.home() / ".flodl"\n'
                      'B = f"default /flodl/data{1}"\nC = "~/.flodl/join"\n')
    assert sorted(line for line, text in code_strings(sample) if SPELLED.search(text)) == [4, 5, 6]


def _yaml(rel: str) -> dict:
    return yaml.safe_load((REPO / rel).read_text())


def _module_parts(rel: str) -> tuple[dict, dict]:
    """An Ansible module's DOCUMENTATION options and its argument_spec's defaults ({name: default})."""
    tree = ast.parse((REPO / rel).read_text())
    doc = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
               and getattr(node.targets[0], "id", "") == "DOCUMENTATION")
    defaults = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and isinstance(node.value, ast.Call) and \
                getattr(node.value.func, "id", "") == "dict":
            for kw in node.value.keywords:
                if kw.arg == "default" and isinstance(kw.value, ast.Constant):
                    defaults[node.arg] = kw.value.value
    return yaml.safe_load(doc)["options"], defaults


def test_the_ansible_contents_defaults_are_the_paths_module():
    launch = paths.LAUNCH_IN_HOME
    assert _yaml("roles/fdl_dispatch/defaults/main.yml")["fdl_dispatch_root"] == launch
    spec = _yaml("roles/fdl_dispatch/meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    assert spec["fdl_dispatch_root"]["default"] == launch
    options, defaults = _module_parts("library/fdl_dispatch_stage.py")
    assert options["root"]["default"] == defaults["root"] == launch
    assert f"| default('{launch}') }}}}" in (REPO / "playbooks" / "dispatch.yml").read_text()

    data = paths.DEFAULT_DATA_PATH
    assert _yaml("roles/fdl_probe/defaults/main.yml")["fdl_probe_data_path"] == (
        f"{{{{ fdl_data_path | default('{data}') }}}}")
    spec = _yaml("roles/fdl_probe/meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    assert spec["fdl_probe_data_path"]["default"] == data
    options, defaults = _module_parts("library/fdl_probe.py")
    assert options["data_path"]["default"] == defaults["data_path"] == data


def test_every_directory_under_flodl_the_repository_names_is_one_the_paths_module_names():
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True, timeout=60).stdout.split()
    named = {paths.LIBTORCH, paths.JOIN, paths.LAUNCH, paths.SERVED, paths.EXECUTION_NODE}
    strays = set()
    for rel in files:
        try:
            text = (REPO / rel).read_text()
        except (UnicodeDecodeError, OSError, IsADirectoryError):
            continue
        for part in re.findall(r"\.flodl/([A-Za-z0-9_.-]+)", text):
            if part.rstrip(".") not in named:
                strays.add(f"{rel}: .flodl/{part}")
    assert strays == set(), "name the directory in fdl/hostside/paths.py first:\n" + "\n".join(sorted(strays))


def test_the_directories_under_a_home():
    env = {"HOME": "/home/op"}
    assert paths.home(env) == "/home/op"
    assert paths.libtorch_root("/home/op") == Path("/home/op/.flodl/libtorch")
    assert paths.join_stage(env) == Path("/home/op/.flodl/join")
    assert paths.launch_runs(env) == Path("/home/op/.flodl/launch/runs")
    assert paths.served(env) == Path("/home/op/.flodl/run")
    for shown, real in ((paths.LIBTORCH_IN_HOME, paths.libtorch_root("~")), (paths.JOIN_IN_HOME, None),
                        (paths.SERVED_IN_HOME, None)):
        assert shown.startswith("~/.flodl/") and (real is None or str(real) == shown)
    assert os.path.expanduser(paths.SERVED_IN_HOME) == str(paths.served())


def test_the_xdg_directories_are_taken_only_when_absolute(tmp_path):
    home = str(tmp_path)
    assert paths.cache_dir({"HOME": home, "XDG_CACHE_HOME": "/c"}) == Path("/c/fdl")
    assert paths.cache_dir({"HOME": home, "XDG_CACHE_HOME": "rel"}) == tmp_path / ".cache" / "fdl"
    assert paths.cache_dir({"HOME": home}) == tmp_path / ".cache" / "fdl"
    assert paths.state_dir({"HOME": home, "XDG_STATE_HOME": "/s"}) == Path("/s/fdl")
    assert paths.state_dir({"HOME": home, "XDG_STATE_HOME": ""}) == tmp_path / ".local" / "state" / "fdl"


def test_a_runtime_directory_others_can_enter_is_not_used(tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(runtime)}
    assert paths.runtime_dir(env) == runtime
    assert paths.launch_live(env) == runtime / "fdl"
    runtime.chmod(0o755)  # anyone may list it: what fdl keeps there must not be findable by others
    assert paths.runtime_dir(env) is None
    assert paths.launch_live(env) == tmp_path / ".flodl" / "launch" / "live"
    link = tmp_path / "link"
    runtime.chmod(0o700)
    link.symlink_to(runtime)
    assert paths.runtime_dir({"XDG_RUNTIME_DIR": str(link)}) is None  # a link someone could point elsewhere
    assert paths.runtime_dir({"XDG_RUNTIME_DIR": "run"}) is None  # relative: the specification says ignore it
    assert paths.runtime_dir({"XDG_RUNTIME_DIR": str(tmp_path / "missing")}) is None
