"""fdl/hostside/ is the one directory of code that runs on managed hosts: it imports the standard library,
pynvml and itself (relatively) and nothing else (but PyTorch in the smoke test's rank program, which is what it
tests), never names where it is deployed, and everything that treats
host-side code apart (the collection's module_utils, ruff's Python 3.8 target, mypy's strict list, the vermin
check through the collection) is derived from that directory."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

from fdl import collection
from tests.conftest import REPO, docstring_ids

HOST_SIDE = REPO / "fdl" / "hostside"
PYNVML = "pynvml"  # the one third-party module: installed, or the packed sibling below
PACKED_SIBLING = Path(collection.PYNVML_PACKED).stem  # shipped beside the package by the collection, not in it
DEPLOYMENTS = ("ansible_collections", "ansible.module_utils", "plugins.module_utils")
#: The one file that imports a third-party package besides pynvml: the all-reduce smoke test's rank program, a
#: standalone program (nothing of the package imports it to run it) whose subject is PyTorch.
RANK_PROGRAM = (Path("collective/allreduce.py"), "torch")


def foreign_imports(root: Path) -> list[str]:
    """Every import under the package at `root` (function-level and TYPE_CHECKING ones included) that is not
    the standard library, pynvml, or a relative import landing on a file of the package (or the packed pynvml
    sibling); and every string in code that names a deployment."""
    offenders = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        package = rel.parent.parts  # the importing module's package, under root
        tree = ast.parse(path.read_text(), str(path))
        docstrings = docstring_ids(tree)
        for node in ast.walk(tree):
            where = f"{rel.as_posix()}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if any(name in node.value for name in DEPLOYMENTS):
                    offenders.append(f"{where} names a deployment: {node.value!r}")
                continue
            if isinstance(node, ast.ImportFrom) and node.level:
                if node.level - 1 > len(package):
                    offenders.append(f"{where} imports from above the package: {ast.unparse(node)}")
                    continue
                base = package[:len(package) - (node.level - 1)]
                target = (*base, *(node.module.split(".") if node.module else ()))
                candidates = [target, *((*target, alias.name) for alias in node.names)]
                if target == (PACKED_SIBLING,) or any(
                        (root.joinpath(*c).with_suffix(".py") if c else root / "__init__.py").is_file()
                        or (root.joinpath(*c) / "__init__.py").is_file() for c in candidates):
                    continue
                offenders.append(f"{where} imports {'.'.join(target)}, which is not in the package")
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if (rel, top) == RANK_PROGRAM:
                    continue
                if top not in sys.stdlib_module_names and top not in ("__future__", PYNVML):
                    offenders.append(f"{where} imports {name}")
    return offenders


def test_host_side_code_imports_only_the_standard_library_pynvml_and_itself():
    assert foreign_imports(HOST_SIDE) == []
    assert {"checks", "libtorch", "farm", "collective"} <= {p.name for p in HOST_SIDE.iterdir() if p.is_dir()}


def test_the_rule_finds_every_kind_of_wrong_way_import(tmp_path):
    """The checker itself: each kind of import that would break on a host is found, and nothing else."""
    package = tmp_path / "hostside"
    (package / "checks").mkdir(parents=True)
    (package / "__init__.py").write_text('"""A docstring may say ansible_collections."""\n')
    (package / "fsio.py").write_text("import os\n")
    (package / "checks" / "__init__.py").write_text("")
    (package / "checks" / "probe.py").write_text(
        "import json\nimport pynvml\nfrom . import gpu\nfrom ..fsio import atomic_write\n"
        "from ..pynvml_packed import load\n"
        "def later():\n    from fdl.errors import FdlError\n"  # the rest of fdl, even lazily
        "    import yaml\n"  # a third-party module
        "    from ..config import schema\n"  # relative, but out of the package
        "    from ... import errors\n"  # above the package
        "    return 'ansible_collections.flodl.fdl.plugins.module_utils.x'\n")  # knows where it is deployed
    (package / "checks" / "gpu.py").write_text("from typing import TYPE_CHECKING\n"
                                               "if TYPE_CHECKING:\n    import requests\n")
    found = foreign_imports(package)
    assert [line.split(" ", 1)[0] for line in found] == [
        "checks/gpu.py:3", "checks/probe.py:7", "checks/probe.py:8", "checks/probe.py:9", "checks/probe.py:10",
        "checks/probe.py:11"], found


def test_the_collection_ships_the_package_file_for_file(tmp_path):
    utils = collection.assemble(tmp_path) / "plugins" / "module_utils"
    shipped = {p.relative_to(utils).as_posix() for p in utils.rglob("*.py")} - {f"{PACKED_SIBLING}.py"}
    package = {p.relative_to(HOST_SIDE).as_posix() for p in HOST_SIDE.rglob("*.py")
               if "__pycache__" not in p.parts} - {"__init__.py"}
    assert shipped == package
    assert all((utils / rel).read_bytes() == (HOST_SIDE / rel).read_bytes() for rel in package)


def test_ruff_and_mypy_name_the_package_not_its_files():
    """The Python 3.8 target and the strict typing cover fdl/hostside/ by its name; no entry names a module
    that does not exist (a file moved out from under its setting)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    targets = config["tool"]["ruff"]["per-file-target-version"]
    assert targets == {"fdl/hostside/**": "py38", "library/**": "py38"}
    overrides = config["tool"]["mypy"]["overrides"]
    strict = next(o for o in overrides if o.get("disallow_untyped_defs"))
    assert "fdl.hostside.*" in strict["module"]
    for entry in (m for o in overrides for m in o["module"] if m.startswith("fdl.")):
        if entry == f"fdl.hostside.{PACKED_SIBLING}":  # the sibling the collection adds on hosts
            continue
        path = REPO.joinpath(*entry.removesuffix(".*").split("."))
        assert path.is_dir() or path.with_suffix(".py").is_file(), entry


def test_nvml_finds_the_packed_pynvml_beside_it_without_knowing_where_it_is(tmp_path):
    """In the collection, under a Python without pynvml installed (`-S`: no site-packages), the GPU check's
    pynvml is the packed sibling module_utils/pynvml_packed.py, found relatively."""
    root = collection.assemble(tmp_path / "tree").parents[2]
    code = ("import json, sys\nsys.path.insert(0, sys.argv[1])\n"
            "from ansible_collections.flodl.fdl.plugins.module_utils.checks.nvml import load_pynvml\n"
            "module = load_pynvml()\n"
            "print(json.dumps([module.__file__, hasattr(module, 'nvmlInit')]))\n")
    done = subprocess.run([sys.executable, "-S", "-c", code, str(root)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    path, complete = json.loads(done.stdout)
    assert Path(path) == root / "ansible_collections/flodl/fdl/plugins/module_utils/pynvml_packed.py"
    assert complete
