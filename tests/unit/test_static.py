"""ruff and mypy, as configured in pyproject.toml ([tool.ruff], [tool.mypy]), find nothing.

ruff runs as `ruff check .` at the repository root: the package, the tests, the benches, the examples,
the modules (library/), the inventory plugin, the build hook and the scripts written in Python (named in
[tool.ruff] extend-include, since they carry no .py suffix; a test checks that none is left out). mypy
checks what [tool.mypy] names (`files`), strict where its overrides say so. Both come with fdl's test
extras; a missing tool fails the test (it is a piece of the test command, not an optional extra), and a
finding fails it with the tool's own report.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


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


def test_ruff_at_the_root_covers_every_python_file():
    done = subprocess.run([tool("ruff"), "check", "--no-cache", "--show-files", "."], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    covered = {str(Path(line).relative_to(REPO)) for line in done.stdout.splitlines() if line.startswith("/")}
    missing = [script for script in python_scripts() if script not in covered]
    assert not missing, f"Python scripts ruff does not check: add them to [tool.ruff] extend-include: {missing}"
    assert {"examples/quickstart/train.py", "hatch_build.py", "bench/startup.py"} <= covered


def test_ruff_finds_nothing():
    done = subprocess.run([tool("ruff"), "check", "--no-cache", "--output-format=concise", "."], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"ruff check found problems:\n{done.stdout}{done.stderr}"


def test_mypy_finds_nothing():
    # mypy's incremental cache (.mypy_cache/, ignored by git) makes a rerun take seconds instead of a minute.
    done = subprocess.run([tool("mypy")], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"mypy found problems:\n{done.stdout}{done.stderr}"
