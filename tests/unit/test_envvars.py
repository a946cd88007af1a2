"""The registry of FDL_* variables (fdl/hostside/envvars.py) is the one place their names are spelled in fdl's code, it
holds every FDL_ name the repository mentions, each entry names exactly the modules that use it, and
docs/cli.md's table is generated from it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fdl.hostside import envvars
from tests.conftest import REPO, code_strings, fdl_modules, repo_relative

PACKAGE = REPO / "fdl"
REGISTRY_FILE = PACKAGE / "hostside" / "envvars.py"
# Rank scripts fdl ships as single files, run where fdl is not installed (they import nothing of fdl): they read
# their variables by name, like any training script would. Their names are checked against the registry.
STANDALONE = {PACKAGE / "hostside" / "collective" / "allreduce.py"}
NAME = re.compile(r"FDL_[A-Z0-9]")
TOKEN = re.compile(r"\bFDL_[A-Z0-9_]*")


def test_no_fdl_variable_is_spelled_as_a_string_outside_the_registry():
    spelled = [f"{repo_relative(path)}:{line}: {text[:60]!r}" for path in fdl_modules()
               if path != REGISTRY_FILE and path not in STANDALONE
               for line, text in code_strings(path) if NAME.search(text)]
    assert spelled == [], "take the name from fdl.hostside.envvars (an f-string for a message):\n" + "\n".join(spelled)


def test_a_name_spelled_in_a_string_is_caught(tmp_path):
    # the check above can fail: a message spelling a name, and a lookup by name, are both found
    sample = tmp_path / "sample.py"
    sample.write_text('"""Docstrings may name FDL_PORT."""\nimport os\n\nHINT = f"set FDL_PORT={1}"\n'
                      'PORT = os.environ.get("FDL_PORT")\n')
    assert sorted(line for line, text in code_strings(sample) if NAME.search(text)) == [4, 5]


def _allowed(token: str) -> bool:
    """A registered name, one matching a registered pattern (FDL_TEST_PYTHON_<M>_<N>), or the head of one
    (a prefix the code builds names from or tests names against)."""
    for name in envvars.REGISTRY:
        head = name.split("<", 1)[0]
        pattern = re.escape(head) + "".join("[0-9]+" + re.escape(sep) for sep in re.findall(r">([^<]*)", name))
        if token == name or re.fullmatch(pattern, token) or head.startswith(token):
            return True
    return False


def test_every_fdl_variable_the_repository_names_is_registered():
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True, timeout=60).stdout.split()
    unknown: dict[str, list[str]] = {}
    for rel in files:
        path = REPO / rel
        if not path.is_file() or path.suffix in (".png", ".gz", ".so"):
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for token in set(TOKEN.findall(text)):
            if token != "FDL_" and not _allowed(token):
                unknown.setdefault(token, []).append(rel)
    assert unknown == {}, "register these in fdl/hostside/envvars.py (with their meaning and readers):\n" + "\n".join(
        f"{token}: {', '.join(sorted(where))}" for token, where in sorted(unknown.items()))


def _users(path: Path, names: set[str]) -> set[str]:
    """The registered names a module uses as values (a lookup, a key, an argument), not only in a message."""
    tree = ast.parse(path.read_text(), str(path))
    if path in STANDALONE:
        return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in names}
    in_message = {id(n) for joined in ast.walk(tree) if isinstance(joined, ast.JoinedStr) for n in ast.walk(joined)}
    found = set()
    for node in ast.walk(tree):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name in names and id(node) not in in_message:
            found.add(name)
    return found


def test_each_variable_names_exactly_the_modules_of_fdl_that_use_it():
    names = {name for name, var in envvars.REGISTRY.items() if var.kind != envvars.SUITE}
    used: dict[str, set[str]] = {name: set() for name in names}
    for path in fdl_modules():
        if path != REGISTRY_FILE:
            for name in _users(path, names):
                used[name].add(repo_relative(path))
    wrong = {name: (sorted(envvars.REGISTRY[name].modules), sorted(found)) for name, found in used.items()
             if set(envvars.REGISTRY[name].modules) != found}
    assert wrong == {}, "fdl/hostside/envvars.py's modules (listed, used):\n" + "\n".join(
        f"{name}: {listed} != {found}" for name, (listed, found) in sorted(wrong.items()))


def test_each_entry_is_complete_and_the_suites_own_name_their_readers():
    for name, var in envvars.REGISTRY.items():
        assert var.name == name and re.fullmatch(r"FDL_[A-Z0-9_]+(<[A-Z]+>_?)*", name), name
        assert var.kind in envvars.KINDS, name
        assert var.meaning.endswith(".") and "|" not in var.meaning, name
        assert var.modules, name
        for rel in var.modules:
            assert (REPO / rel).is_file(), f"{name}: {rel} does not exist"
            if var.kind == envvars.SUITE:
                assert name.split("<", 1)[0] in (REPO / rel).read_text(), f"{name}: {rel} does not read it"
            else:
                assert rel.startswith("fdl/"), name
        if var.kind != envvars.SUITE:  # fdl's own code takes the name from the constant of the same name
            assert getattr(envvars, name) == name


def test_read_gives_the_value_as_it_is_and_refuses_a_name_not_registered():
    assert envvars.read(envvars.FDL_PORT, {"FDL_PORT": " 4000\n"}) == " 4000\n"  # what to strip is the caller's call
    assert envvars.read(envvars.FDL_PORT, {}) == ""
    typo = "FDL_" "PROT"  # spelled in two parts, or the repository scan above would take it for a variable
    with pytest.raises(KeyError, match=f"{typo} is not a registered"):
        envvars.read(typo, {typo: "1"})


def test_the_docs_table_is_the_registry():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "env-variables")], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    doc = (REPO / "docs" / "cli.md").read_text()
    section = doc.split("<!-- env-variables: generated by scripts/env-variables -->", 1)[1]
    section = section.split("<!-- /env-variables -->", 1)[0]
    assert section.strip() == done.stdout.strip(), "docs/cli.md is stale: run scripts/env-variables --write"
    for name in envvars.REGISTRY:
        assert f"`{name}`" in section
