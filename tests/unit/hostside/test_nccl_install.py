"""The NCCL build's host-side install (fdl.hostside.nccl_install, the fdl_nccl_install module): check, complete,
put in place, on real directories."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fdl.hostside.nccl_install import planned, put_in_place


def staged(builds: Path, version: str = "2.27.5", *, link: bool = True, payload: bytes = b"new") -> Path:
    staging = builds / ".v2.27.5-sm86.partial-abc"
    lib = staging / "lib"
    lib.mkdir(parents=True)
    (lib / f"libnccl.so.{version}").write_bytes(payload)
    if link:
        (lib / "libnccl.so.2").symlink_to(f"libnccl.so.{version}")
    os.chmod(staging, 0o700)  # as mkdtemp leaves it
    return staging


def test_first_build_is_renamed_into_place(tmp_path):
    staging = staged(tmp_path, link=False)
    dest = tmp_path / "v2.27.5-sm86"
    assert planned(str(dest)) == {"changed": True, "dest": str(dest), "replaced": False,
                                  "library": str(dest / "lib" / "libnccl.so.2")}
    assert put_in_place(str(staging), str(dest), "2.27.5", {"tag": "v2.27.5-1"}) is False
    assert not staging.exists()
    assert os.readlink(dest / "lib" / "libnccl.so.2") == "libnccl.so.2.27.5"  # link completed
    assert json.loads((dest / "fdl-nccl-build.json").read_text()) == {"tag": "v2.27.5-1"}
    assert oct(dest.stat().st_mode & 0o777) == "0o755"


def test_a_rebuild_swaps_the_whole_directory(tmp_path):
    dest = tmp_path / "v2.27.5-sm86"
    (dest / "lib").mkdir(parents=True)
    (dest / "lib" / "libnccl.so.2.27.5").write_bytes(b"old")
    (dest / "lib" / "stale-file").write_bytes(b"from the earlier build")
    staging = staged(tmp_path)
    assert planned(str(dest))["replaced"] is True
    assert put_in_place(str(staging), str(dest), "2.27.5", {}) is True
    assert (dest / "lib" / "libnccl.so.2").read_bytes() == b"new"
    assert not (dest / "lib" / "stale-file").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v2.27.5-sm86"]  # nothing left aside


def test_a_build_of_another_version_is_refused_before_anything_moves(tmp_path):
    staging = staged(tmp_path, version="2.26.2")
    dest = tmp_path / "v2.27.5-sm86"
    with pytest.raises(ValueError) as err:
        put_in_place(str(staging), str(dest), "2.27.5", {})
    assert f"could not put the NCCL build in place at {dest}" in str(err.value)
    assert "did not produce libnccl.so.2.27.5" in str(err.value)
    assert "libnccl.so.2.26.2" in str(err.value)
    assert staging.is_dir() and not dest.exists()


@pytest.mark.parametrize("where", ["missing", "elsewhere"])
def test_a_staging_directory_not_beside_the_output_is_refused(tmp_path, where):
    other = tmp_path / "other"
    other.mkdir()
    staging = None if where == "missing" else str(staged(other))
    with pytest.raises(ValueError, match="needs staging" if where == "missing" else "must sit next to"):
        put_in_place(staging, str(tmp_path / "v2.27.5-sm86"), "2.27.5", {})
