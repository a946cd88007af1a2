"""Where the tag comes from: the project's libtorch variants (real files) or the fleet's reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from fdl.nccl.detect import HostNccl, bundled_nccl, choose_archs, choose_tag, tag_from_fleet
from fdl.nccl.plan import Arch, NcclVersion, PlanError


def lib(root: Path, variant: str, name: str) -> Path:
    path = root / "libtorch" / variant / "lib" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF")
    return path


def test_scan_finds_versioned_libraries_only(tmp_path):
    lib(tmp_path, "precompiled/cu128", "libnccl.so.2.27.5")
    lib(tmp_path, "precompiled/cu126", "libnccl.so.2.26.2")
    lib(tmp_path, "precompiled/cu126", "libnccl.so.2")  # the soname link, not a version
    lib(tmp_path, "builds/sm61-sm120", "libnccl.so.2.9.10")
    lib(tmp_path, "nccl/builds/v2.28.3-sm61/lib", "libnccl.so.2.28.3")  # our own output: deeper, ignored
    found = bundled_nccl(tmp_path)
    assert [(b.variant, b.version.version) for b in found] == [
        ("builds/sm61-sm120", "2.9.10"), ("precompiled/cu126", "2.26.2"), ("precompiled/cu128", "2.27.5")]


def test_newest_bundled_wins_and_the_source_says_where(tmp_path):
    lib(tmp_path, "precompiled/cu126", "libnccl.so.2.26.2")
    lib(tmp_path, "precompiled/cu128", "libnccl.so.2.27.5")
    version, source = choose_tag(None, root=tmp_path, fleet=None)
    assert version == NcclVersion(2, 27, 5)
    assert "precompiled/cu128" in source and "v2.26.2" in source


def test_explicit_tag_beats_detection(tmp_path):
    lib(tmp_path, "precompiled/cu128", "libnccl.so.2.27.5")
    assert choose_tag("v2.21.5", root=tmp_path, fleet=[HostNccl("b", NcclVersion(2, 26, 2))]) == (
        NcclVersion(2, 21, 5), "--tag")


def test_nothing_bundled_asks_for_tag(tmp_path):
    with pytest.raises(PlanError) as err:
        choose_tag(None, root=tmp_path, fleet=None)
    assert "--tag" in err.value.message and str(tmp_path / "libtorch") in err.value.message


def test_fleet_version_beats_the_local_libtorch(tmp_path):
    lib(tmp_path, "precompiled/cu128", "libnccl.so.2.27.5")
    version, source = choose_tag(None, root=tmp_path, fleet=[HostNccl("b", NcclVersion(2, 26, 2)),
                                                             HostNccl("a", NcclVersion(2, 26, 2))])
    assert version == NcclVersion(2, 26, 2)
    assert "(a, b)" in source


def test_fleet_disagreement_is_refused_with_each_host():
    with pytest.raises(PlanError) as err:
        tag_from_fleet([HostNccl("node-a", NcclVersion(2, 27, 5)), HostNccl("node-b", NcclVersion(2, 26, 2))])
    assert "node-a v2.27.5" in err.value.message and "node-b v2.26.2" in err.value.message
    assert "--tag" in err.value.message


def test_archs_come_from_the_detector_unless_given():
    assert choose_archs("8.6", detect=lambda: [(12, 0)]) == ((Arch(8, 6),), "--archs")
    archs, source = choose_archs(None, detect=lambda: [(12, 0), (6, 1)], where="node-b")
    assert archs == (Arch(6, 1), Arch(12, 0))
    assert source == "detected on node-b through NVML (GPU0 12.0, GPU1 6.1)"
