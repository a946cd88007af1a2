"""What fdl ships carries its licence (MIT, as pyproject.toml and galaxy.yml declare) and nothing stray: the
repository, the sdist, the wheel built from that sdist, and the collection tarball scripts/build-collection
makes."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from fdl import collection
from tests.conftest import REPO

# What an sdist holds at its top level: pyproject.toml's sdist include list, and what hatch adds itself
SDIST_ADDED = {"PKG-INFO", "pyproject.toml", ".gitignore"}


def licence() -> bytes:
    text = (REPO / "LICENSE").read_bytes()
    assert text.startswith(b"MIT License\n") and b"Permission is hereby granted, free of charge" in text
    return text


def test_the_repository_declares_and_carries_one_licence():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT"
    galaxy = yaml.safe_load((REPO / collection.METADATA / "galaxy.yml").read_text())
    assert galaxy["license"] == ["MIT"] and "license_file" not in galaxy
    licence()


@pytest.mark.slow
def test_the_sdist_and_its_wheel_carry_the_licence_and_nothing_stray(tmp_path):
    """`python -m build` makes the sdist, then the wheel from the unpacked sdist (which proves it complete: the
    wheel's build hook assembles the collection from it)."""
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp_path), str(REPO)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,) = tmp_path.glob("fdl-*.tar.gz")
    (wheel,) = tmp_path.glob("fdl-*.whl")
    with tarfile.open(sdist) as archive:
        names = [name.split("/", 1)[1] for name in archive.getnames() if "/" in name]
        prefix = archive.getnames()[0].split("/", 1)[0]
        assert archive.extractfile(f"{prefix}/LICENSE").read() == licence()
    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["sdist"]
    declared = {pattern.lstrip("/") for pattern in include["include"]}
    assert "LICENSE" in declared
    top = {name.split("/", 1)[0] for name in names}
    assert top <= declared | SDIST_ADDED, top - declared - SDIST_ADDED
    assert not [name for name in names if name.split("/", 1)[0] == "tests"], "tests/ files in the sdist"
    for part in ("fdl/hostside/checks/probe.py", "roles/fdl_probe/tasks/main.yml", "library/fdl_probe.py",
                 "inventory_plugins/cluster.py", "collection/galaxy.yml"):
        assert part in names, part  # the collection's parts, whole (the link tree is left out, not followed)
    assert not [name for name in names if name.startswith("ansible_collections/")]
    with zipfile.ZipFile(wheel) as archive:
        version = collection.version()
        assert archive.read(f"fdl-{version}.dist-info/licenses/LICENSE") == licence()
        metadata = archive.read(f"fdl-{version}.dist-info/METADATA").decode()
        assert "License-Expression: MIT" in metadata
        tree = "fdl/_share/collections/ansible_collections/flodl/fdl/"
        assert archive.read(tree + "LICENSE") == licence()  # the collection the wheel carries, too


def test_the_collection_tarball_carries_the_licence(collection_tarball):
    with tarfile.open(collection_tarball) as archive:
        assert archive.extractfile("LICENSE").read() == licence()
        manifest = json.loads(archive.extractfile("MANIFEST.json").read())
        files = {entry["name"] for entry in json.loads(archive.extractfile("FILES.json").read())["files"]}
    assert manifest["collection_info"]["license"] == ["MIT"]
    assert "LICENSE" in files
    assert not [name for name in files if name.startswith("ansible_collections")], "the in-place links went in"


def test_a_clone_without_its_licence_builds_no_collection(tmp_path):
    source = tmp_path / "src"
    for _, part in collection.PARTS:
        (source / part).mkdir(parents=True)
    (source / collection.METADATA / "galaxy.yml").write_text("namespace: flodl\n")
    with pytest.raises(collection.CollectionError, match="missing: LICENSE"):
        collection.assemble(tmp_path / "out", source)
    assert not Path(tmp_path / "out").exists()
