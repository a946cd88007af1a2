"""Each error class name means one thing: no two modules of fdl define an exception of the same name.

`except BuildError` or a reader's "a BuildError came out of the launch" should point at one class; two
classes of one name (each caught only where its module is imported) read alike and behave apart.
"""

from __future__ import annotations

import ast
from collections import defaultdict

from tests.conftest import REPO


def error_classes() -> dict[str, list[str]]:
    """Class name -> the modules that define it, for every class of fdl/ whose name ends in Error."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted((REPO / "fdl").rglob("*.py")):
        if "_share" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                found[node.name].append(str(path.relative_to(REPO)))
    return found


def test_every_error_class_name_is_defined_once():
    classes = error_classes()
    assert "BuildError" in classes and "FdlError" in classes  # the scan sees the package
    twice = {name: where for name, where in classes.items() if len(where) > 1}
    assert not twice, f"error classes defined in more than one module: {twice}"
