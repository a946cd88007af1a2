"""The check library works outside the fdl package, as Ansible module_utils: the host-side package copied
under another name, run from JSON options, JSON out (fdl/hostside/'s import rules: tests/unit/hostside/
test_imports.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from fdl.collection import module_utils


def module_utils_copy(dest: Path) -> Path:
    """The collection's module_utils (fdl/hostside/, without the packed pynvml) under dest/fdl_module_utils/:
    a package named unlike fdl, as on a host."""
    top = dest / "fdl_module_utils"
    for rel, origin in module_utils().items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(origin, top / rel)
    (top / "__init__.py").touch()
    return top


def test_checks_run_as_a_renamed_package_from_json_options(tmp_path: Path, fake_nvml) -> None:
    """What the Ansible probe module does: run_probe(ProbeOptions(**params)) -> report.to_dict()."""
    module_utils_copy(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    params = {"data_path": str(data), "skip_mount": False, "libtorch_path": None, "docker": None,
              "project_root": str(tmp_path), "gpus": [1]}
    code = (
        "import json, sys\n"
        "from fdl_module_utils.checks.probe import ProbeOptions, run_probe\n"
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
    module_utils_copy(tmp_path)
    code = ("import json\nfrom fdl_module_utils.checks.probe import ProbeOptions, run_probe\n"
            "print(json.dumps(run_probe(ProbeOptions(skip_mount=True), host='bare').to_dict()))\n")
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env={"HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    gpu = json.loads(done.stdout)["checks"][0]
    assert gpu["status"] == "error" and "pynvml" in gpu["message"] and "nvidia-ml-py" in gpu["hint"]
