"""The fdl_nccl_install module's atomic put-in-place, on real directories."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "fdl_nccl_install", Path(__file__).resolve().parents[3] / "library" / "fdl_nccl_install.py")
install_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(install_module)


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
    install_module.prepare(str(staging), "2.27.5", {"tag": "v2.27.5-1"})
    assert install_module.install(str(staging), str(dest)) is False
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
    install_module.prepare(str(staging), "2.27.5", {})
    assert install_module.install(str(staging), str(dest)) is True
    assert (dest / "lib" / "libnccl.so.2").read_bytes() == b"new"
    assert not (dest / "lib" / "stale-file").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v2.27.5-sm86"]  # nothing left aside


def test_a_build_of_another_version_is_refused_before_anything_moves(tmp_path):
    staging = staged(tmp_path, version="2.26.2")
    with pytest.raises(ValueError) as err:
        install_module.prepare(str(staging), "2.27.5", {})
    assert "did not produce libnccl.so.2.27.5" in str(err.value)
    assert "libnccl.so.2.26.2" in str(err.value)
