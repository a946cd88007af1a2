"""The code the fdl_join_door modules share with fdl ships as module_utils: links, standard library only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SHARED = REPO / "roles" / "fdl_join_door" / "module_utils" / "fdl_farm"


@pytest.mark.parametrize("name", ["authorized_keys.py", "doors.py", "sshd_config.py"])
def test_shared_modules_are_links_to_the_package_and_import_only_the_standard_library(name):
    link = SHARED / name
    assert link.is_symlink() and link.resolve() == (REPO / "fdl" / "farm" / name).resolve()
    tree = ast.parse(link.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: a sibling, bundled alongside
                continue
            names = [(node.module or "").split(".")[0]]
        else:
            continue
        for top in names:
            assert top in sys.stdlib_module_names or top == "__future__", f"{name} imports {top}"
