"""Ansible is the one renderer of what goes onto a host (issue 39, item 4): fdl has no template engine of its own
and no copies of Ansible's filters, and the wizard runs no sshd -t of its own."""

from __future__ import annotations

import ast

from tests.conftest import fdl_modules, repo_relative


def test_no_fdl_module_imports_jinja2_or_defines_ansibles_filters():
    """regression: fdl/farm/render.py built a jinja2 environment with copies of the `comment` and `bool` filters."""
    found = []
    for path in fdl_modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                if any(name == "jinja2" or name.startswith("jinja2.") for name in names):
                    found.append(f"{repo_relative(path)}:{node.lineno} imports jinja2")
            if isinstance(node, ast.FunctionDef) and node.name in ("comment", "to_bool"):
                found.append(f"{repo_relative(path)}:{node.lineno} defines {node.name}()")
    assert found == []


def test_the_wizard_runs_no_sshd_t():
    """regression: fdl/farm/wizard/plan.py ran `sshd -t` itself; it runs in the fdl_join_door role's validate:."""
    found = []
    for path in fdl_modules():
        if "farm" not in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.List | ast.Tuple):
                continue
            words = [ast.unparse(item) for item in node.elts]
            if "'-t'" in words and any("sshd" in word for word in words):  # an argv like [sshd, "-t", ...]
                found.append(f"{repo_relative(path)}:{node.lineno}")
    assert found == []
