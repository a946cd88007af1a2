"""libtorch resolution over real trees on disk, metadata reading, and CUDA arch coverage."""

from __future__ import annotations

from pathlib import Path

import pytest

from fdl.hostside.checks.libtorch import check_libtorch
from fdl.hostside.checks.nvml import NvmlDevice, NvmlInventory
from fdl.hostside.checks.report import ERROR, OK, WARNING
from fdl.hostside.libtorch.resolve import LibtorchNotFound, resolve_libtorch
from fdl.hostside.libtorch.variants import arch_covers, normalise_arch, parse_archs
from tests.fakes import make_libtorch


@pytest.mark.parametrize(("token", "expected"), [
    ("8.6", "8.6"), ("sm_86", "8.6"), ("sm86", "8.6"), ("86", "8.6"), ("sm_120", "12.0"), ("120", "12.0"),
    ("compute_90", "9.0+PTX"), ("9.0+PTX", "9.0+PTX"), ("sm_90a", "9.0a"), ("10.0f", "10.0f"), ("bogus", None),
])
def test_arch_spellings_normalise(token: str, expected: str | None) -> None:
    assert normalise_arch(token) == expected


def test_arch_lists_accept_common_separators_and_cpu() -> None:
    assert parse_archs("7.0 8.6;9.0,sm_120") == ["7.0", "8.6", "9.0", "12.0"]
    assert parse_archs("cpu") == []
    assert parse_archs("none") == []


@pytest.mark.parametrize(("archs", "cc", "covered"), [
    (["8.6"], (8, 6), True),
    (["8.0"], (8, 6), True),           # same major, newer minor: the cubin runs
    (["8.6"], (8, 0), False),          # older minor than the build: it does not
    (["9.0"], (12, 0), False),         # another major: no
    (["9.0+PTX"], (12, 0), True),      # PTX is compiled on the fly for newer GPUs
    (["9.0+PTX"], (8, 6), False),      # but never for older ones
    (["9.0a"], (9, 0), True),
    (["9.0a"], (10, 0), False),        # arch-specific builds run on that GPU only
    ([], (8, 6), False),
])
def test_arch_coverage_follows_cuda_compatibility(archs, cc, covered) -> None:
    assert arch_covers(archs, *cc) is covered


# ---- resolution rules ----

def test_explicit_path_wins_over_everything(tmp_path: Path) -> None:
    explicit = make_libtorch(tmp_path / "opt" / "libtorch", "", torch="2.9.1", cuda="12.6", archs="8.6")
    env_tree = make_libtorch(tmp_path / "env", "precompiled/cu128")
    project = tmp_path / "proj"
    make_libtorch(project / "libtorch", "precompiled/cpu", cuda="none", archs="cpu")
    info = resolve_libtorch(str(explicit), {"LIBTORCH": str(env_tree)}, str(project), str(tmp_path / "home"))
    assert (info.source, info.path, info.version, info.variant, info.cuda, info.archs) == (
        "--libtorch-path", str(explicit), "2.9.1", "cu126", "12.6", ["8.6"])


def test_libtorch_env_var_before_libtorch_path_before_project(tmp_path: Path) -> None:
    first = make_libtorch(tmp_path / "a", "", torch="2.10.0")
    second = make_libtorch(tmp_path / "b", "", torch="2.9.0")
    project = tmp_path / "proj"
    make_libtorch(project / "libtorch", "precompiled/cu126", cuda="12.6")
    both = {"LIBTORCH": str(first), "LIBTORCH_PATH": str(second)}
    assert resolve_libtorch(None, both, str(project), None).source == "LIBTORCH"
    only_path = {"LIBTORCH": "", "LIBTORCH_PATH": str(second)}
    info = resolve_libtorch(None, only_path, str(project), None)
    assert (info.source, info.version) == ("LIBTORCH_PATH", "2.9.0")
    assert resolve_libtorch(None, {}, str(project), None).source == "project"


def test_project_tree_uses_the_active_variant(tmp_path: Path) -> None:
    root = tmp_path / "proj" / "libtorch"
    make_libtorch(root, "precompiled/cu126", cuda="12.6", archs="5.0 6.1 8.6", activate=False)
    make_libtorch(root, "builds/sm61-sm120", cuda="12.8", archs="6.1 12.0", torch="2.10.0")
    info = resolve_libtorch(None, {}, str(tmp_path / "proj"), None)
    assert (info.active, info.variant, info.archs) == ("builds/sm61-sm120", "cu128", ["6.1", "12.0"])
    assert info.metadata == [".arch"]


def test_project_tree_with_one_variant_and_no_active_file_uses_it(tmp_path: Path) -> None:
    make_libtorch(tmp_path / "libtorch", "precompiled/cpu", cuda="none", archs="cpu", activate=False)
    info = resolve_libtorch(None, {}, str(tmp_path), None)
    assert (info.active, info.kind, info.archs) == ("precompiled/cpu", "cpu", [])


def test_project_tree_with_several_variants_and_no_active_file_is_refused(tmp_path: Path) -> None:
    make_libtorch(tmp_path / "libtorch", "precompiled/cpu", cuda="none", archs="cpu", activate=False)
    make_libtorch(tmp_path / "libtorch", "precompiled/cu128", activate=False)
    with pytest.raises(LibtorchNotFound) as caught:
        resolve_libtorch(None, {}, str(tmp_path), None)
    assert "precompiled/cpu, precompiled/cu128" in caught.value.message
    assert ".active" in caught.value.hint


def test_active_naming_a_missing_variant_is_an_error(tmp_path: Path) -> None:
    make_libtorch(tmp_path / "libtorch", "precompiled/cpu", cuda="none", archs="cpu")
    (tmp_path / "libtorch" / ".active").write_text("precompiled/cu130\n")
    with pytest.raises(LibtorchNotFound) as caught:
        resolve_libtorch(None, {}, str(tmp_path), None)
    assert "precompiled/cu130" in caught.value.message and "precompiled/cpu" in caught.value.hint


def test_home_flodl_libtorch_is_the_last_resort(tmp_path: Path) -> None:
    home = tmp_path / "home"
    make_libtorch(home / ".flodl" / "libtorch", "precompiled/cu128")
    info = resolve_libtorch(None, {}, str(tmp_path / "no-project"), str(home))
    assert (info.source, info.active, info.version) == ("home", "precompiled/cu128", "2.10.0")


def test_pointer_file_selects_a_variant(tmp_path: Path) -> None:
    root = tmp_path / "libtorch"
    make_libtorch(root, "precompiled/cu128")
    make_libtorch(root, "builds/sm61", cuda="12.8", archs="6.1", activate=False)
    (root / ".active.pascal").write_text("builds/sm61\n")
    info = resolve_libtorch(str(root / ".active.pascal"), {}, None, None)
    assert (info.active, info.archs) == ("builds/sm61", ["6.1"])


def test_build_version_file_alone_gives_version_and_variant(tmp_path: Path) -> None:
    vdir = make_libtorch(tmp_path / "libtorch", "", arch_file=False, build_version="2.10.0+cu128")
    info = resolve_libtorch(str(vdir), {}, None, None)
    assert (info.version, info.variant, info.cuda, info.archs, info.metadata) == (
        "2.10.0", "cu128", "12.8", None, ["build-version"])


def test_nothing_anywhere_names_every_place_tried(tmp_path: Path) -> None:
    with pytest.raises(LibtorchNotFound) as caught:
        resolve_libtorch(None, {}, str(tmp_path / "proj"), str(tmp_path / "home"))
    assert caught.value.tried == [str(tmp_path / "proj" / "libtorch"), str(tmp_path / "home" / ".flodl" / "libtorch")]


@pytest.mark.parametrize("make", ["missing", "file", "empty-dir"])
def test_a_broken_explicit_location_is_an_error_not_a_fall_through(tmp_path: Path, make: str) -> None:
    make_libtorch(tmp_path / "proj" / "libtorch", "precompiled/cu128")  # would be found by the search
    target = tmp_path / "given"
    if make == "file":
        target.write_text("not a directory")
    elif make == "empty-dir":
        target.mkdir()
    with pytest.raises(LibtorchNotFound) as caught:
        resolve_libtorch(None, {"LIBTORCH": str(target)}, str(tmp_path / "proj"), None)
    assert f"LIBTORCH={target}" in caught.value.message


# ---- the check against GPUs ----

def _inventory(*devices: tuple[str, int, int], cuda: str = "12.8") -> NvmlInventory:
    return NvmlInventory("570.133.20", cuda, [NvmlDevice(i, name, major, minor, 80 << 30, 70 << 30)
                                             for i, (name, major, minor) in enumerate(devices)])


def test_a_gpu_outside_the_arch_list_is_an_error_naming_it(tmp_path: Path) -> None:
    vdir = make_libtorch(tmp_path / "lt", "", archs="7.0 8.0 9.0")
    result, _ = check_libtorch(str(vdir), {}, inventory=_inventory(("H100", 9, 0), ("RTX 5090", 12, 0)))
    assert result.status == ERROR
    assert "GPU 1 (RTX 5090, sm_120)" in result.message and "GPU 0" not in result.message
    assert "12.0" in result.hint
    assert result.data["uncovered_devices"] == [1]


def test_covered_gpus_pass(tmp_path: Path) -> None:
    vdir = make_libtorch(tmp_path / "lt", "", archs="7.0 8.0 9.0 12.0")
    result, _ = check_libtorch(str(vdir), {}, inventory=_inventory(("H100", 9, 0), ("RTX 3060", 8, 6)))
    assert result.status == OK, result.message


def test_cpu_build_with_gpus_present_is_a_warning(tmp_path: Path) -> None:
    vdir = make_libtorch(tmp_path / "lt", "", cuda="none", archs="cpu")
    result, _ = check_libtorch(str(vdir), {}, inventory=_inventory(("H100", 9, 0)))
    assert result.status == WARNING and "CPU build" in result.message


