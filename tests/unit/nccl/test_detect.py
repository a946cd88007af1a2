"""Where the tag comes from: the project's libtorch variants (real trees, loadable fake NCCL) or the fleet."""

from __future__ import annotations

from pathlib import Path

import pytest

from fdl.nccl.detect import HostNccl, bundled_nccl, choose_archs, choose_tag, tag_from_fleet
from fdl.nccl.plan import Arch, NcclVersion, PlanError
from tests.fakes import build_fake_nccl, make_libtorch


def lib(root: Path, variant: str, version: str, *, loadable: bool = False) -> None:
    make_libtorch(root / "libtorch", variant, nccl=version, nccl_loadable=loadable, activate=False)


def test_scan_dates_each_variants_nccl(tmp_path):
    lib(tmp_path, "precompiled/cu128", "2.27.5", loadable=True)  # ncclGetVersion answers
    lib(tmp_path, "precompiled/cu126", "2.26.2")  # only the file name dates it
    lib(tmp_path, "builds/sm61-sm120", "2.9.10")
    lib(tmp_path, "precompiled/cpu", "2")  # a bare libnccl.so.2: undatable, left out
    build_fake_nccl(tmp_path / "libtorch/nccl/builds/v2.28.3-sm61/lib", "2.28.3")  # fdl's own output: not a variant
    found = bundled_nccl(tmp_path)
    assert [(b.variant, b.version.version) for b in found] == [
        ("builds/sm61-sm120", "2.9.10"), ("precompiled/cu126", "2.26.2"), ("precompiled/cu128", "2.27.5")]


def test_the_library_is_believed_over_its_file_name(tmp_path):
    vdir = make_libtorch(tmp_path / "libtorch", "precompiled/cu128", nccl=None)
    build_fake_nccl(vdir / "lib", "2.27.5", reported="2.27.7")
    assert [b.version.version for b in bundled_nccl(tmp_path)] == ["2.27.7"]


def test_newest_bundled_wins_and_the_source_says_where(tmp_path):
    lib(tmp_path, "precompiled/cu126", "2.26.2")
    lib(tmp_path, "precompiled/cu128", "2.27.5")
    version, source = choose_tag(None, root=tmp_path, fleet=None)
    assert version == NcclVersion(2, 27, 5)
    assert "precompiled/cu128" in source and "v2.26.2" in source


def test_explicit_tag_beats_detection(tmp_path):
    lib(tmp_path, "precompiled/cu128", "2.27.5")
    assert choose_tag("v2.21.5", root=tmp_path, fleet=[HostNccl("b", NcclVersion(2, 26, 2))]) == (
        NcclVersion(2, 21, 5), "--tag")


def test_nothing_bundled_asks_for_tag(tmp_path):
    with pytest.raises(PlanError) as err:
        choose_tag(None, root=tmp_path, fleet=None)
    assert "--tag" in err.value.message and str(tmp_path / "libtorch") in err.value.message


def test_fleet_version_beats_the_local_libtorch(tmp_path):
    lib(tmp_path, "precompiled/cu128", "2.27.5")
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
