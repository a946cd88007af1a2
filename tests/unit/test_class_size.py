"""No class in fdl/ holds several jobs: each class is at most MAX_LINES lines long.

The rule: a class's size is the lines from its `class` statement to its last line (docstrings and comments
included), plus those of every class of fdl's it inherits from, so a class split into mixins is measured whole. A
class that would pass the bound holds more than one job: split it by job into classes of their own, each with a
docstring that states its one job, and let the old name compose them where its callers want one object (as
`RunMachine`, `Launcher` and `JoinAgent` do).

LEGACY names the classes that were over the bound when the rule came and are not split yet, each with the size it
may not grow past; a class that shrinks under the bound must leave the list (so the list stays true).

regression (#39 item 7): `RunMachine` (489 lines), `Launcher` (324) and `JoinAgent` (221) each held several jobs.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

MAX_LINES = 200
#: over the bound before the rule, not split yet: class -> the size it may not grow past
LEGACY = {
    "fdl/controller/server.py:ControllerServer": 274,
    "fdl/controller/routes.py:Endpoints": 268,
    "fdl/controller/client.py:ControllerClient": 261,
}


def class_sizes(root: Path) -> dict[str, int]:
    """Every class under root/fdl (the shipped data under _share excluded) -> its size by the rule above."""
    own: dict[str, int] = {}
    bases: dict[str, list[str]] = {}
    by_name: dict[str, list[str]] = {}
    for path in sorted((root / "fdl").rglob("*.py")):
        if "_share" in path.parts:
            continue
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                key = f"{rel}:{node.name}"
                own[key] = (node.end_lineno or node.lineno) - node.lineno + 1
                bases[key] = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                              if isinstance(b, (ast.Name, ast.Attribute))]
                by_name.setdefault(node.name, []).append(key)

    def size(key: str, seen: frozenset[str] = frozenset()) -> int:
        total = own[key]
        for base in bases[key]:
            found = by_name.get(base, [])
            if len(found) == 1 and found[0] not in seen | {key}:  # a name defined twice in fdl/ is not followed
                total += size(found[0], seen | {key})
        return total

    return {key: size(key) for key in own}


def oversized(root: Path) -> dict[str, int]:
    """The classes over the bound that LEGACY does not allow, and LEGACY's classes grown past their size."""
    return {key: n for key, n in class_sizes(root).items() if n > LEGACY.get(key, MAX_LINES)}


def test_no_class_in_fdl_is_over_the_bound() -> None:
    assert oversized(REPO) == {}, f"classes over {MAX_LINES} lines: split them by job (this module's docstring)"


def test_the_legacy_list_is_true() -> None:
    sizes = class_sizes(REPO)
    stale = {key: sizes.get(key) for key in LEGACY if sizes.get(key, 0) <= MAX_LINES}
    assert stale == {}, "these classes are gone or under the bound now: take them off LEGACY"


def test_a_split_into_mixins_is_measured_whole(tmp_path: Path) -> None:
    package = tmp_path / "fdl"
    package.mkdir()
    body = "".join(f"    def m{i}(self) -> None:\n        pass\n" for i in range(60))
    (package / "parts.py").write_text(f"class Left:\n{body}\n\nclass Right:\n{body}\n")
    (package / "whole.py").write_text("from fdl.parts import Left, Right\n\n\nclass Whole(Left, Right):\n    pass\n")
    sizes = class_sizes(tmp_path)
    assert sizes["fdl/parts.py:Left"] < MAX_LINES and sizes["fdl/parts.py:Right"] < MAX_LINES
    assert oversized(tmp_path) == {"fdl/whole.py:Whole": sizes["fdl/parts.py:Left"] * 2 + 2}
