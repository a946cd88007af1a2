"""The libtorch a build links (resolution without the environment's PyTorch, vendor from the variant) and
the environment a build recipe receives."""

from __future__ import annotations

from pathlib import Path

import pytest

from fdl.hostside.libtorch.resolve import describe_variant
from fdl.hostside.libtorch.variants import Libtorch, kind_of
from fdl.libtorch.gate import LibtorchError, build_env, resolve_active, resolve_variant, rocm_runtime_lib_dirs


def variant(root: Path, label: str) -> Path:
    path = root / "libtorch" / label
    (path / "lib").mkdir(parents=True)
    return path


@pytest.mark.parametrize("label, vendor", [
    ("precompiled/cpu", None), ("precompiled/cpu-aarch64", None), ("precompiled/cu128", "nvidia"),
    ("builds/sm61-sm120", "nvidia"), ("precompiled/rocm70", "amd"), ("builds/gfx1030-gfx1100", "amd"),
])
def test_vendor_comes_from_the_variant_name(label: str, vendor: str | None) -> None:
    assert Libtorch("/nowhere/libtorch", "home", label).vendor == vendor
    assert kind_of(label) == {None: "cpu", "nvidia": "cuda", "amd": "rocm"}[vendor]


def test_an_unnamed_directory_is_read_from_its_arch_file(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / ".arch").write_text("torch=2.7\ncuda=none\n")
    assert describe_variant(tmp_path, "LIBTORCH").vendor is None
    (tmp_path / ".arch").write_text("torch=2.7\ncuda=12.8\n")
    assert describe_variant(tmp_path, "LIBTORCH").vendor == "nvidia"
    (tmp_path / ".arch").write_text("torch=2.7\nrocm=7.1.0\n")
    assert describe_variant(tmp_path, "LIBTORCH").vendor == "amd"
    (tmp_path / ".arch").unlink()
    assert describe_variant(tmp_path, "LIBTORCH").vendor == "nvidia"  # nothing recorded: taken as NVIDIA's


def test_resolution_order_env_then_project_then_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    monkeypatch.setenv("HOME", str(home))
    user = variant(home / ".flodl", "precompiled/cpu")
    (home / ".flodl" / "libtorch" / ".active").write_text("precompiled/cpu\n")
    found = resolve_active(project, {})
    assert (found.path, found.label, found.vendor, found.source) == (str(user), "precompiled/cpu", None, "home")
    proj = variant(project, "precompiled/cu128")
    (project / "libtorch" / ".active").write_text("precompiled/cu128")
    found = resolve_active(project, {})
    assert (found.path, found.label, found.vendor, found.source) == (str(proj), "precompiled/cu128", "nvidia",
                                                                     "project")
    given = variant(tmp_path, "precompiled/rocm71")
    found = resolve_active(project, {"LIBTORCH_PATH": str(given)})
    assert (found.path, found.vendor, found.source) == (str(given), "amd", "LIBTORCH_PATH")
    assert resolve_active(None, {}).path == str(user)


def test_nothing_installed_is_none_and_broken_pointers_are_errors(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_active(tmp_path, {}) is None
    with pytest.raises(LibtorchError, match=r"LIBTORCH_PATH=.*nowhere does not exist"):
        resolve_active(tmp_path, {"LIBTORCH_PATH": str(tmp_path / "nowhere")})
    (tmp_path / "empty").mkdir()
    with pytest.raises(LibtorchError, match="has no lib/"):
        resolve_active(tmp_path, {"LIBTORCH": str(tmp_path / "empty")})
    (tmp_path / "libtorch").mkdir()
    (tmp_path / "libtorch" / ".active").write_text("precompiled/cu999\n")
    with pytest.raises(LibtorchError, match="names variant 'precompiled/cu999'"):
        resolve_active(tmp_path, {})


def test_gate_variants_are_looked_up_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = variant(tmp_path / "home" / ".flodl", "precompiled/rocm70")
    assert resolve_variant("precompiled/rocm70", tmp_path).path == str(path)
    with pytest.raises(LibtorchError, match="no libtorch variant 'precompiled/cu126'"):
        resolve_variant("precompiled/cu126", tmp_path)
    with pytest.raises(LibtorchError, match="not a libtorch variant name"):
        resolve_variant("../../etc", tmp_path)


def test_rocm_runtime_dirs_follow_the_env_and_probe_lib64(tmp_path: Path) -> None:
    rocm = tmp_path / "rocm"
    (rocm / "lib64").mkdir(parents=True)
    (rocm / "lib64" / "libamdhip64.so.6").write_text("")
    hip = tmp_path / "hip"
    assert rocm_runtime_lib_dirs({"ROCM_PATH": str(rocm), "HIP_PATH": str(hip)}) == [
        str(rocm / "lib64"), str(hip / "lib")]
    assert rocm_runtime_lib_dirs({}) == ["/opt/rocm/lib"]


def test_recipe_env_puts_rocm_ahead_of_libtorch_on_amd_only(tmp_path: Path) -> None:
    amd = Libtorch(str(tmp_path / "rocm70"), "home", "precompiled/rocm70")
    env = build_env(amd, {"PATH": "/bin", "ROCM_PATH": "/r", "HSA_PATH": "/h", "LD_LIBRARY_PATH": "/keep"})
    assert env["LIBTORCH_PATH"] == str(tmp_path / "rocm70")
    assert env["FDL_GPU_FEATURE"] == "rocm"
    assert env["LD_LIBRARY_PATH"] == f"/r/lib:/h/lib:{tmp_path}/rocm70/lib:/keep"
    cuda = build_env(Libtorch(str(tmp_path / "cu128"), "home", "precompiled/cu128"), {"ROCM_PATH": "/r"})
    assert (cuda["FDL_GPU_FEATURE"], cuda["LD_LIBRARY_PATH"]) == ("cuda", f"{tmp_path}/cu128/lib")
    cpu = build_env(Libtorch(str(tmp_path / "cpu"), "home", "precompiled/cpu"), {})
    assert cpu["FDL_GPU_FEATURE"] == ""
    none = build_env(None, {"LIBTORCH_PATH": "/stale"})
    assert "LIBTORCH_PATH" not in none and none["FDL_GPU_FEATURE"] == ""


def test_an_empty_or_half_made_root_is_nothing_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: what an interrupted download of an older fdl left (an empty precompiled/, a .lock, a
    half-unpacked hidden tree, a variant without lib/) made every build fail with 'holds no libtorch variant'."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    root = home / ".flodl" / "libtorch"
    (root / "precompiled" / ".cpu.x1y2.tmp" / "lib").mkdir(parents=True)
    (root / "precompiled" / "cu130" / "include").mkdir(parents=True)
    (root / ".lock").write_text("")
    (tmp_path / "project" / "libtorch" / "builds").mkdir(parents=True)
    assert resolve_active(tmp_path / "project", {}) is None
    assert build_env(resolve_active(tmp_path / "project", {}), {})["FDL_GPU_FEATURE"] == ""
