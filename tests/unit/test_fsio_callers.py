"""One durable-write helper: fdl.hostside.fsio's atomic_write/fsync_dir; nothing else in fdl/ fsyncs and renames
on its own."""

from __future__ import annotations

import ast
from pathlib import Path

import fdl

PACKAGE = Path(fdl.__file__).parent

# Where os.fsync/os.replace may appear outside fdl/hostside/fsio.py, and why.
ALLOWED = {
    "hostside/fsio.py": "the helper itself",
    "agent/data.py": "a writability probe: writes, fsyncs and removes a file, renames nothing",
    "publish/run.py": "swaps a whole served tree (a directory) into place",
    "farm/credentials.py": "moves ssh-keygen's own output files into place",
}


def _durable_calls(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{node.func.value.id}.{node.func.attr} at line {node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "os"
            and node.func.attr in ("fsync", "replace")]


def test_durable_writes_go_through_fsio() -> None:
    """regression: libtorch's `.active` and the launcher's live record had their own temp-file/fsync/rename code,
    and libtorch its own directory fsync."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name.startswith("_share/") or name in ALLOWED:
            continue
        calls = _durable_calls(path)
        if calls:
            found[name] = calls
    assert found == {}
