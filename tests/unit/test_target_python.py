"""What fdl sends to target hosts runs there on Python 3.8 (the oldest that ansible-core 2.19 runs modules
on): the role modules and every module_utils file, the check library and the rank supervisor included.

The file list comes from where fdl ships them from (the complete collection tree Ansible runs: its
plugins/modules/ and plugins/module_utils/, which is fdl/hostside/ file for file), not from a list
here. vermin checks the syntax and standard-library use against 3.8; the check library and the supervisor
then run under a real 3.8.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from fdl.resources import collection_root
from tests.platforms import require_python

OLDEST_TARGET = "3.8"


def shipped_to_targets() -> list[Path]:
    """Every Python file a target host receives: the collection's modules and module_utils (real files)."""
    plugins = collection_root() / "plugins"
    files = {p.resolve() for source in (plugins / "modules", plugins / "module_utils") for p in source.rglob("*.py")}
    return sorted(f for f in files if "__pycache__" not in f.parts)


def test_the_shipped_list_holds_the_check_library_supervisor_and_modules():
    names = {str(p.relative_to(p.parents[1])) for p in shipped_to_targets()}
    assert {"checks/probe.py", "checks/nvml.py", "module_utils/supervisor.py", "farm/authorized_keys.py",
            "modules/fdl_probe.py", "modules/fdl_dispatch_stage.py", "module_utils/pynvml_packed.py"} <= names, names


def test_everything_shipped_to_targets_is_python_3_8_compatible():
    files = shipped_to_targets()
    vermin = shutil.which("vermin", path=str(Path(sys.executable).parent)) or shutil.which("vermin")
    assert vermin, "vermin is missing: it is in fdl's test extras (pip install -e '.[test]')"
    done = subprocess.run([vermin, f"--target={OLDEST_TARGET}-", "--violations", "--no-tips", "--no-color",
                           *map(str, files)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"not Python {OLDEST_TARGET} compatible:\n{done.stdout}{done.stderr}"


def module_utils_layout(dest: Path) -> Path:
    """The collection's module_utils tree, copied under dest (a plain import path for a bare interpreter)."""
    shutil.copytree(collection_root() / "plugins" / "module_utils", dest,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_every_module_util_imports_and_the_checks_run_under_python_3_8(tmp_path, fake_nvml):
    """Under a real 3.8: every module_utils module imports (module-level code runs, which vermin cannot
    judge), every role module compiles, and the check library probes the fake GPU."""
    python = require_python(OLDEST_TARGET)
    layout = module_utils_layout(tmp_path / "mu")  # imported as the package mu, as module_utils is on a host
    names = sorted(".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__")
                   for p in layout.rglob("*.py"))
    assert {"mu.checks.probe", "mu.libtorch.resolve", "mu.supervisor", "mu.farm.doors", "mu.pynvml_packed"} <= \
        set(names)
    modules = [p for p in shipped_to_targets() if p.parent.name == "modules"]
    code = ("import importlib, json, sys\n"
            "for name in json.loads(sys.argv[1]): importlib.import_module(name)\n"
            "for path in json.loads(sys.argv[2]): compile(open(path).read(), path, 'exec')\n"
            "import mu.pynvml_packed; mu.pynvml_packed.load()\n"  # pynvml itself, from its packed source under 3.8
            "from mu.checks.probe import ProbeOptions, run_probe\n"
            "report = run_probe(ProbeOptions(skip_mount=True), host='old')\n"
            "print(json.dumps({'python': list(sys.version_info[:2]), 'report': report.to_dict()}))\n")
    env = {**fake_nvml.env("H100:9.0:80G"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([str(python), "-c", code, json.dumps(names), json.dumps(list(map(str, modules)))],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["python"] == [3, 8]
    gpu = next(c for c in doc["report"]["checks"] if c["name"] == "gpu")
    assert gpu["status"] == "ok" and gpu["data"]["devices"][0]["name"] == "H100", gpu
