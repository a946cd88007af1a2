"""The controller package's shape: files split by idea, and no module reaching into another's private names."""

from __future__ import annotations

import ast
from pathlib import Path

import fdl.controller

SOURCES = sorted(Path(fdl.controller.__file__).parent.glob("*.py"))
MAX_LINES = 600


def test_no_controller_module_is_over_the_line_limit() -> None:
    """regression: server.py (784 lines) and machine.py (641) held several ideas each."""
    lines = {path.name: len(path.read_text(encoding="utf-8").splitlines()) for path in SOURCES}
    assert {name: n for name, n in lines.items() if n > MAX_LINES} == {}


def _own_names(tree: ast.Module) -> set[str]:
    """Every name a module defines itself: functions, classes, class attributes and attributes it assigns."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_no_controller_module_uses_another_modules_private_names() -> None:
    """regression: the HTTP layer called the state machine's private `_refuse`."""
    found = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own = _own_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fdl"):
                found += [f"{path.name}:{node.lineno} imports {alias.name}" for alias in node.names
                          if alias.name.startswith("_")]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and node.attr not in own:
                found.append(f"{path.name}:{node.lineno} reads .{node.attr}")
    assert found == []
