"""ruff and mypy, as configured in pyproject.toml ([tool.ruff], [tool.mypy]), find nothing.

ruff runs over every Python file of the repository: the package, the tests, the benches, the
modules and the inventory plugin, the build hook and the scripts written in Python (found by their
shebang, since they carry no .py suffix). mypy checks what [tool.mypy] names (`files`), strict where
its overrides say so. Both come with fdl's test extras; a missing tool fails the test (it is a piece of
the test command, not an optional extra), and a finding fails it with the tool's own report.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

LINTED = ["fdl", "tests", "bench", "library", "inventory_plugins", "hatch_build.py"]


def tool(name: str) -> str:
    """The tool's executable from this interpreter's environment (else PATH); missing: fail, saying how."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is missing: it is in fdl's test extras (pip install -e '.[test]' -c constraints.txt)"
    return found


def python_scripts() -> list[str]:
    """scripts/ files that are Python: a .py suffix or a python shebang."""
    found = []
    for path in sorted((REPO / "scripts").iterdir()):
        if not path.is_file():
            continue
        with path.open("rb") as handle:
            first = handle.readline()
        if path.suffix == ".py" or (first.startswith(b"#!") and b"python" in first):
            found.append(str(path.relative_to(REPO)))
    return found


def test_the_python_scripts_are_found():
    assert "scripts/role-variables" in python_scripts()
    assert "scripts/test.sh" not in python_scripts()


def test_ruff_finds_nothing():
    done = subprocess.run([tool("ruff"), "check", "--no-cache", "--output-format=concise", *LINTED,
                           *python_scripts()], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"ruff check found problems:\n{done.stdout}{done.stderr}"


def test_mypy_finds_nothing():
    # mypy's incremental cache (.mypy_cache/, ignored by git) makes a rerun take seconds instead of a minute.
    done = subprocess.run([tool("mypy")], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"mypy found problems:\n{done.stdout}{done.stderr}"
