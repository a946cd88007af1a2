"""The code the collection's modules share with fdl ships as module_utils: copies made by the build, standard
library only, and no second copy in the repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fdl import collection

REPO = Path(__file__).resolve().parents[4]
PARTS = [REPO / part for _, part in collection.PARTS]  # the collection's parts in this clone


@pytest.mark.parametrize("name", ["farm/authorized_keys.py", "farm/doors.py", "farm/sshd_config.py", "fsio.py"])
def test_shared_modules_come_from_the_package_as_real_files(name, tmp_path):
    """What they may import: tests/unit/hostside/test_imports.py."""
    assert not [p for part in PARTS for p in part.rglob(Path(name).name)], "a copy of fdl code is committed"
    built = collection.assemble(tmp_path) / "plugins" / "module_utils" / name
    assert built.read_bytes() == (REPO / "fdl" / "hostside" / name).read_bytes() and not built.is_symlink()


def test_the_key_file_writes_through_the_shipped_fsio_in_the_collection(tmp_path):
    """farm/authorized_keys.py imports ..fsio: in the collection that is module_utils/fsio.py, its only copy."""
    root = collection.assemble(tmp_path / "c")
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from ansible_collections.flodl.fdl.plugins.module_utils.farm import authorized_keys as ak\n"
            "from ansible_collections.flodl.fdl.plugins.module_utils import fsio\n"
            "assert ak.atomic_write is fsio.atomic_write, ak.atomic_write.__module__\n"
            "print(fsio.__file__)\n")
    # -S and no PYTHONPATH: this venv's editable fdl puts the clone on sys.path, and with it the clone's own
    # ansible_collections/ (the in-place links), which would answer first
    done = subprocess.run([sys.executable, "-S", "-c", code, str(tmp_path / "c")], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == root / "plugins" / "module_utils" / "fsio.py"


def test_the_collection_version_is_fdls(tmp_path):
    import yaml

    galaxy = yaml.safe_load((REPO / collection.METADATA / "galaxy.yml").read_text())
    assert galaxy["version"] == collection.version()
    assert (galaxy["namespace"], galaxy["name"]) == ("flodl", "fdl")
    runtime = yaml.safe_load((REPO / collection.METADATA / "meta" / "runtime.yml").read_text())
    assert runtime["requires_ansible"] == ">=2.17.0,<2.22.0"


def test_the_repository_holds_no_links_into_the_package():
    links = [p for part in PARTS for p in part.rglob("*") if p.is_symlink()]
    assert links == []
