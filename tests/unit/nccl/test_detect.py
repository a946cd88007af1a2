"""Where the tag comes from: the project's libtorch variants (real trees, loadable fake NCCL) or the fleet."""

from __future__ import annotations

from pathlib import Path

import pytest

from fdl.nccl.detect import HostNccl, bundled_nccl, choose_archs, choose_tag, choose_target
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
    version, source = choose_tag(None, root=tmp_path)
    assert version == NcclVersion(2, 27, 5)
    assert "precompiled/cu128" in source and "v2.26.2" in source


def test_explicit_tag_beats_detection(tmp_path):
    lib(tmp_path, "precompiled/cu128", "2.27.5")
    assert choose_tag("v2.21.5", root=tmp_path) == (NcclVersion(2, 21, 5), "--tag")


def test_nothing_bundled_asks_for_tag(tmp_path):
    with pytest.raises(PlanError) as err:
        choose_tag(None, root=tmp_path)
    assert "--tag" in err.value.message and str(tmp_path / "libtorch") in err.value.message


V = NcclVersion


def test_the_host_with_the_older_nccl_gets_the_newest_version():
    """Seed 000's rig flow: the host behind the cluster's newest major.minor is the one to build for, at the
    newest version; this replaced "refuse and ask for --tag" (issue 38 item 2)."""
    reports = [HostNccl("blackwell", V(2, 27, 5)), HostNccl("pascal", V(2, 21, 5)), HostNccl("ada", V(2, 27, 3))]
    target = choose_target(reports, host=None, me="controller")
    assert (target.version, target.host) == (V(2, 27, 5), "pascal")
    assert target.source == ("the newest NCCL the cluster runs (2.27.5 on blackwell), for pascal, whose NCCL 2.21.5 "
                             "is older")
    assert "pascal has the older NCCL (2.21.5)" in target.notes[0]
    assert len(target.notes) == 1  # ada differs in the patch level only: NCCL connects it


def test_several_behind_this_machine_first_else_the_oldest_and_the_rest_named():
    reports = [HostNccl("a", V(2, 27, 5)), HostNccl("b", V(2, 26, 2)), HostNccl("c", V(2, 21, 5))]
    oldest = choose_target(reports, host=None, me="a")
    assert oldest.host == "c" and "also behind: b (2.26.2)" in oldest.notes[1]
    assert "fdl @cluster nccl build --host NAME" in oldest.notes[1]
    assert choose_target(reports, host=None, me="b").host == "b"  # here: no ssh needed


def test_a_cluster_that_agrees_builds_here_at_its_version_and_says_so():
    target = choose_target([HostNccl("a", V(2, 27, 5)), HostNccl("b", V(2, 27, 3))], host=None, me="x")
    assert (target.version, target.host) == (V(2, 27, 5), None)
    assert "every cluster host runs NCCL 2.27.x (a 2.27.5, b 2.27.3): none is behind" in target.notes[0]


def test_host_named_keeps_its_build_host_and_takes_the_newest_version():
    reports = [HostNccl("a", V(2, 27, 5)), HostNccl("b", V(2, 21, 5))]
    named = choose_target(reports, host="b", me="x")
    assert (named.version, named.host, named.notes) == (V(2, 27, 5), None, ())
    current = choose_target(reports, host="a", me="x")
    assert "a already runs NCCL 2.27.5, the cluster's newest major.minor" in current.notes[0]


def test_archs_come_from_the_detector_unless_given():
    assert choose_archs("8.6", detect=lambda: [(12, 0)]) == ((Arch(8, 6),), "--archs")
    archs, source = choose_archs(None, detect=lambda: [(12, 0), (6, 1)], where="node-b")
    assert archs == (Arch(6, 1), Arch(12, 0))
    assert source == "detected on node-b through NVML (GPU0 12.0, GPU1 6.1)"
