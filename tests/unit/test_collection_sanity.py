"""The two `ansible-test sanity` findings that ruff and mypy do not see, checked in a second on the collection
tree scripts/build-collection packs (fdl.collection.assemble), so a merge that brings one fails here and not
only in the slow run of every ansible-core line (tests/integration/test_ecosystem.py):

- pep8: ansible-test runs pycodestyle over every Python file of the collection with its own settings (line
  length 160, its ignore list), which flag what ruff's E/W rules let through (E502, a redundant backslash
  between brackets, for one);
- pylint's `ansible-bad-function` (ansible-test 2.21 and later): module code (plugins/modules and
  plugins/module_utils) may not start processes through subprocess or os, exit or print; a call that must
  (no AnsibleModule to call run_command on, a child that runs beside other work or needs a timeout) says so
  with `# pylint: disable=ansible-bad-function` and its reason (docs/ansible.md, "Checks").

Compiling and importing under the oldest target Python is tests/unit/test_target_python.py's.
"""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from fdl import collection

# ansible-test 2.17's pep8 settings (the oldest line claimed; 2.20 and later also ignore E701 and E704)
PEP8_MAX_LINE = 160
PEP8_IGNORE = ("E402", "W503", "W504", "E741", "E203")

# ansible-test 2.21's pylint plugin `unwanted`: functions module code may not call (modules_only entries)
BAD_FUNCTIONS = frozenset(
    [f"subprocess.{name}" for name in ("Popen", "call", "check_call", "check_output", "getoutput",
                                       "getstatusoutput", "run")]
    + [f"os.{name}" for name in ("popen", "posix_spawn", "posix_spawnp", "spawnl", "spawnle", "spawnlp",
                                 "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "system")]
    + ["sys.exit", "builtins.print"])
DISABLE = re.compile(r"#\s*pylint:\s*disable(-next)?=([\w\-, ]+)")


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return collection.assemble(tmp_path_factory.mktemp("collection"))


def python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def module_code(root: Path) -> list[Path]:
    return [p for p in python_files(root) if p.relative_to(root).parts[:2] in
            (("plugins", "modules"), ("plugins", "module_utils"))]


def test_the_tree_holds_the_modules_module_utils_and_the_reader(tree):
    names = {p.relative_to(tree).as_posix() for p in python_files(tree)}
    assert {"plugins/modules/fdl_probe.py", "plugins/module_utils/collective/offer.py",
            "plugins/plugin_utils/fdl/config/schema.py", "plugins/inventory/cluster.py"} <= names, sorted(names)


def test_every_python_file_of_the_collection_passes_ansible_tests_pep8(tree):
    pycodestyle = shutil.which("pycodestyle", path=str(Path(sys.executable).parent)) or shutil.which("pycodestyle")
    assert pycodestyle, "pycodestyle is missing: it is in fdl's test extras (pip install -e '.[test]')"
    done = subprocess.run([pycodestyle, "--max-line-length", str(PEP8_MAX_LINE), "--config", "/dev/null",
                           "--ignore", ",".join(PEP8_IGNORE), *(str(p.relative_to(tree)) for p in python_files(tree))],
                          cwd=tree, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"ansible-test sanity's pep8 would fail on:\n{done.stdout}{done.stderr}"


def _disabled(source: str) -> tuple[set[int], list[int]]:
    """(lines whose own comment disables ansible-bad-function, lines of a comment alone on its line that
    does: pylint then disables it to the end of the block the comment is in)."""
    inline: set[int] = set()
    alone: list[int] = []
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            match = DISABLE.search(token.string)
            if match and "ansible-bad-function" in {name.strip() for name in match[2].split(",")}:
                row = token.start[0]
                if match[1]:
                    inline.add(row + 1)  # disable-next
                elif row in code_lines:
                    inline.add(row)
                else:
                    alone.append(row)
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING):
            code_lines.update(range(token.start[0], token.end[0] + 1))
    return inline, alone


def _names(module: ast.Module) -> dict[str, str]:
    """{local name: dotted name} for what the file imports from subprocess, os and sys, and print."""
    names = {"print": "builtins.print"}
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in ("subprocess", "os", "sys"):
                    names[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module in ("subprocess", "os", "sys") and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def bad_calls(path: Path) -> list[str]:
    """`line: function` for each call in module code that ansible-test's pylint flags and nothing disables."""
    source = path.read_text(encoding="utf-8")
    module = ast.parse(source, str(path))
    names = _names(module)
    inline, alone = _disabled(source)
    blocks = [(node.lineno, node.end_lineno or node.lineno) for node in ast.walk(module)
              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    found: list[tuple[int, str]] = []
    for node in ast.walk(module):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name):
            called = names.get(func.id)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in names:
            called = f"{names[func.value.id]}.{func.attr}"
        else:
            called = None
        if called not in BAD_FUNCTIONS or node.lineno in inline:
            continue
        # a comment alone on its line covers the rest of the innermost definition holding it (or the module)
        covered = False
        for row in alone:
            holders = [b for b in blocks if b[0] <= row <= b[1]]
            start, end = max(holders) if holders else (1, len(source.splitlines()))
            if row < node.lineno <= end and start <= node.lineno:
                covered = True
        if not covered:
            found.append((node.lineno, called))
    return [f"{row}: {called}" for row, called in sorted(found)]


def test_module_code_starts_no_process_exits_or_prints_unless_it_says_why(tree):
    flagged = {p.relative_to(tree).as_posix(): bad_calls(p) for p in module_code(tree)}
    flagged = {path: calls for path, calls in flagged.items() if calls}
    assert flagged == {}, (
        "ansible-test 2.21's pylint (ansible-bad-function) flags these calls in module code: use the module's "
        "run_command, exit_json or module.log, or, where module code cannot, say why beside the call with an "
        f"inline `# pylint: disable=ansible-bad-function`:\n{flagged}")


def test_the_bad_function_guard_flags_what_ansible_test_flags(tmp_path):
    """The guard itself: flagged spellings, an inline and a block disable, and a call in another function."""
    path = tmp_path / "m.py"
    path.write_text(
        "import subprocess\nimport sys as system\nfrom os import system as shell\n"
        "def a():\n    subprocess.Popen(['x'])\n    shell('x')\n"
        "def b():\n    subprocess.run(['x'])  # pylint: disable=ansible-bad-function\n"
        "def c():\n    # pylint: disable=ansible-bad-function\n    print('x')\n    system.exit(1)\n"
        "def d():\n    print('y')\n    subprocess.DEVNULL\n")
    assert bad_calls(path) == ["5: subprocess.Popen", "6: os.system", "14: builtins.print"]
