"""fdl/checks must work outside the fdl package, as Ansible module_utils: standard library and
pynvml only, siblings imported relatively, and a JSON-in JSON-out entry point."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

CHECKS = REPO / "fdl" / "checks"
ALLOWED_THIRD_PARTY = {"pynvml", "ansible_collections"}  # the collection's vendored pynvml, on a host
VENDORED_PYNVML = "ansible_collections.flodl.fdl.plugins.module_utils.pynvml_packed"


def test_checks_import_only_stdlib_pynvml_and_siblings() -> None:
    offenders = []
    for source in sorted(CHECKS.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: a sibling
                    continue
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "__future__":
                    continue
                if top in ALLOWED_THIRD_PARTY and (top != "ansible_collections" or name == VENDORED_PYNVML):
                    continue
                offenders.append(f"{source.name}:{node.lineno} imports {name}")
    assert offenders == []


def test_checks_run_as_a_renamed_package_from_json_options(tmp_path: Path, fake_nvml) -> None:
    """What the Ansible probe module does: run_probe(ProbeOptions(**params)) -> report.to_dict()."""
    shutil.copytree(CHECKS, tmp_path / "fdl_module_utils", ignore=shutil.ignore_patterns("__pycache__"))
    data = tmp_path / "data"
    data.mkdir()
    params = {"data_path": str(data), "skip_mount": False, "libtorch_path": None, "docker": None,
              "project_root": str(tmp_path), "gpus": [1]}
    code = (
        "import json, sys\n"
        "from fdl_module_utils.probe import ProbeOptions, run_probe\n"
        "report = run_probe(ProbeOptions(**json.loads(sys.argv[1])), host='node-b')\n"
        "assert not any(m == 'fdl' or m.startswith('fdl.') for m in sys.modules), 'fdl was imported'\n"
        "print(json.dumps(report.to_dict()))\n"
    )
    env = {**fake_nvml.env("H100:9.0:80G,RTX3060:8.6:12G"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(params)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["host"] == "node-b" and doc["schema_version"] == 2
    gpu = next(c for c in doc["checks"] if c["name"] == "gpu")
    assert gpu["status"] == "ok" and [d["selected"] for d in gpu["data"]["devices"]] == [False, True]
    assert [c["name"] for c in doc["checks"]][:4] == ["gpu", "libtorch", "nccl", "data"]
    health = {c["name"]: c["status"] for c in doc["checks"][4:]}
    assert health["gpu_ecc"] == "ok" and health["device_nodes"] == "ok", health  # the healthy fake host


def test_a_host_python_without_pynvml_gets_an_error_not_a_crash(tmp_path: Path) -> None:
    """`python -S` leaves site-packages (pynvml, ansible) out, as on a bare target host."""
    shutil.copytree(CHECKS, tmp_path / "fdl_module_utils", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import json\nfrom fdl_module_utils.probe import ProbeOptions, run_probe\n"
            "print(json.dumps(run_probe(ProbeOptions(skip_mount=True), host='bare').to_dict()))\n")
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env={"HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    gpu = json.loads(done.stdout)["checks"][0]
    assert gpu["status"] == "error" and "pynvml" in gpu["message"] and "nvidia-ml-py" in gpu["hint"]
