"""fdl/checks must work outside the fdl package, as Ansible module_utils: standard library and
pynvml only, siblings (and the shipped libtorch core) imported relatively, and a JSON-in JSON-out entry point."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

from fdl.collection import MODULE_UTILS
from tests.conftest import REPO

CHECKS = REPO / "fdl" / "checks"
ALLOWED_THIRD_PARTY = {"pynvml", "ansible_collections"}  # the collection's vendored pynvml, on a host
VENDORED_PYNVML = "ansible_collections.flodl.fdl.plugins.module_utils.pynvml_packed"


def shipped_packages() -> dict[str, list[Path]]:
    """The module_utils packages the probe needs (checks/, libtorch/), as fdl/collection.py ships them."""
    out: dict[str, list[Path]] = {}
    for name in ("checks", "libtorch"):
        files: list[Path] = []
        for part in MODULE_UTILS[name]:
            origin = REPO / "fdl" / part
            files += sorted(origin.glob("*.py")) if origin.is_dir() else [origin]
        out[name] = files
    return out


def module_utils_copy(dest: Path) -> Path:
    """The shipped packages under dest/fdl_module_utils/ (a package named unlike fdl, as on a host)."""
    top = dest / "fdl_module_utils"
    for name, files in shipped_packages().items():
        (top / name).mkdir(parents=True)
        for path in files:
            shutil.copyfile(path, top / name / path.name)
    for name, (part,) in ((n, parts) for n, parts in MODULE_UTILS.items() if n.endswith(".py")):
        shutil.copyfile(REPO / "fdl" / part, top / name)  # single files beside them: paths, envvars, fsio...
    (top / "__init__.py").touch()
    return top


def test_checks_import_only_stdlib_pynvml_and_shipped_siblings() -> None:
    shipped = {f"{name}.{p.stem}" for name, files in shipped_packages().items() for p in files}
    shipped |= {name[:-3] for name in MODULE_UTILS if name.endswith(".py")}  # single files: fsio, supervisor...
    offenders = []
    for package, files in shipped_packages().items():
        for source in files:
            for node in ast.walk(ast.parse(source.read_text(), str(source))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    if node.level:  # relative (. is the package, .. module_utils): it must land on a shipped module
                        base = [package] if node.level == 1 else []
                        target = ".".join([*base, *(node.module or "").split(".")]).strip(".")
                        if target not in shipped and f"{target}.__init__" not in shipped and \
                                not any(f"{target}.{alias.name}" in shipped for alias in node.names):
                            offenders.append(f"{package}/{source.name}:{node.lineno} imports {target}, not shipped")
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
                    offenders.append(f"{package}/{source.name}:{node.lineno} imports {name}")
    assert offenders == []
    assert {"libtorch.variants", "libtorch.resolve", "libtorch.__init__"} <= shipped
    assert "libtorch.install" not in shipped  # requests: never on a host


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
