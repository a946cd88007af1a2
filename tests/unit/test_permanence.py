"""Exit 2 is a closed list in one module (fdl/agent/permanent.py): under the worker unit it powers the box off.

regression: PermanentError was raised in ten modules (a stale mount, a full disk, a published tree's typo, a
libtorch lock on a full disk all powered a worker off). This walks the package's code and fails when a permanent
error is made anywhere else: PermanentError constructed, an FdlError given exit_code=2 (or ExitCode.PERMANENT),
an exit_code attribute set to it, or a class of its own whose code is 2. UsageError, the error of a command line
that does not parse (exit 2 for every command), is not a permanent error of this kind and stays allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO, fdl_modules, repo_relative

THE_MODULE = "fdl/agent/permanent.py"
#: Where the two exit-2 classes themselves are declared.
DECLARED = {("fdl/errors.py", "UsageError"), ("fdl/errors.py", "PermanentError")}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_permanent_code(node: ast.AST | None) -> bool:
    if isinstance(node, ast.Constant):
        return node.value == 2 and not isinstance(node.value, bool)
    return _name(node) == "PERMANENT" if node is not None else False


def permanent_errors(source: str, where: str) -> list[str]:
    """Where a module's source makes a permanent error, as `where:line what`, in the order of its lines."""
    tree = ast.parse(source, where)
    declaration = {id(stmt) for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef) and (where, cls.name) in DECLARED
                   for stmt in cls.body}  # the two classes' own `exit_code = ExitCode.PERMANENT`
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if _name(node.func) == "PermanentError":
                found.append((node.lineno, "PermanentError(...)"))
            found += [(node.lineno, f"exit_code={ast.unparse(k.value)}") for k in node.keywords
                      if k.arg == "exit_code" and _is_permanent_code(k.value)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and id(node) not in declaration:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_name(t) == "exit_code" for t in targets) and _is_permanent_code(node.value):
                found.append((node.lineno, f"exit_code = {ast.unparse(node.value)}"))  # type: ignore[arg-type]
        elif isinstance(node, ast.ClassDef) and any(_name(base) == "PermanentError" for base in node.bases):
            found.append((node.lineno, f"class {node.name}(PermanentError)"))
    return [f"{where}:{line} {what}" for line, what in sorted(found)]


def _scan(path: Path) -> list[str]:
    return permanent_errors(path.read_text(), repo_relative(path))


def test_only_the_permanent_module_makes_a_permanent_error():
    offenders = [hit for path in fdl_modules() if repo_relative(path) != THE_MODULE for hit in _scan(path)]
    assert offenders == [], ("a permanent error (exit 2: poweroff under the worker unit) made outside "
                             f"{THE_MODULE}; add the case to its closed list, or make it transient:\n  "
                             + "\n  ".join(offenders))


def test_the_permanent_module_is_where_the_list_is():
    # the scan above would pass vacuously if the list moved or the class were renamed
    made = _scan(REPO / THE_MODULE)
    assert sum("PermanentError(...)" in hit for hit in made) >= 10, made


def test_the_scan_sees_every_spelling():
    sample = ("from fdl.errors import ExitCode, FdlError, PermanentError, UsageError\n"
              "raise PermanentError('a')\n"
              "err = FdlError('b', exit_code=2)\n"
              "err = FdlError('c', exit_code=ExitCode.PERMANENT)\n"
              "err.exit_code = ExitCode.PERMANENT\n"
              "class Mine(FdlError):\n    exit_code = 2\n"
              "class Other(PermanentError):\n    pass\n"
              "raise UsageError('a command line that does not parse')\n"
              "err = FdlError('d', exit_code=1)\n")
    assert [hit.split(" ", 1)[1] for hit in permanent_errors(sample, "sample.py")] == [
        "PermanentError(...)", "exit_code=2", "exit_code=ExitCode.PERMANENT", "exit_code = ExitCode.PERMANENT",
        "exit_code = 2", "class Other(PermanentError)"]
    declared = _scan(REPO / "fdl" / "errors.py")
    assert declared == []  # UsageError's and PermanentError's own declarations are not a use
