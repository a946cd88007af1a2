"""The code the collection's modules share with fdl ships as module_utils: copies made by the build, standard
library only, and no second copy in the repository."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from fdl import collection

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", ["authorized_keys.py", "doors.py", "sshd_config.py"])
def test_shared_modules_come_from_the_package_and_import_only_the_standard_library(name, tmp_path):
    assert not list(collection.SOURCE_IN_REPO.rglob(name)), "a copy of fdl code is committed in the collection"
    built = collection.assemble(tmp_path) / "plugins" / "module_utils" / "farm" / name
    assert built.read_bytes() == (REPO / "fdl" / "farm" / name).read_bytes() and not built.is_symlink()
    tree = ast.parse(built.read_text())
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


def test_the_collection_version_is_fdls(tmp_path):
    import yaml

    galaxy = yaml.safe_load((collection.SOURCE_IN_REPO / "galaxy.yml").read_text())
    assert galaxy["version"] == collection.version()
    assert (galaxy["namespace"], galaxy["name"]) == ("flodl", "fdl")
    runtime = yaml.safe_load((collection.SOURCE_IN_REPO / "meta" / "runtime.yml").read_text())
    assert runtime["requires_ansible"] == ">=2.17.0,<2.22.0"


def test_the_repository_holds_no_links_into_the_package():
    links = [p for p in collection.SOURCE_IN_REPO.rglob("*") if p.is_symlink()]
    assert links == []
