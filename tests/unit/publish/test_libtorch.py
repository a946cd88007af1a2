"""libtorch resolution for the gate and the environment a build recipe receives."""

from __future__ import annotations

from pathlib import Path

import pytest

from fdl.publish.libtorch import (
    Libtorch,
    LibtorchError,
    build_env,
    classify_vendor,
    resolve_active,
    resolve_variant,
    rocm_runtime_lib_dirs,
)


def variant(root: Path, label: str) -> Path:
    path = root / "libtorch" / label
    (path / "lib").mkdir(parents=True)
    return path


@pytest.mark.parametrize("label, vendor", [
    ("precompiled/cpu", None), ("precompiled/cpu-aarch64", None), ("precompiled/cu128", "nvidia"),
    ("builds/sm61-sm120", "nvidia"), ("precompiled/rocm70", "amd"), ("builds/gfx1030-gfx1100", "amd"),
])
def test_vendor_comes_from_the_variant_name(label: str, vendor: str | None) -> None:
    assert classify_vendor(label) == vendor


def test_an_unnamed_directory_is_read_from_its_arch_file(tmp_path: Path) -> None:
    (tmp_path / ".arch").write_text("torch=2.7\ncuda=none\n")
    assert classify_vendor("libtorch", tmp_path) is None
    (tmp_path / ".arch").write_text("torch=2.7\ncuda=12.8\n")
    assert classify_vendor("libtorch", tmp_path) == "nvidia"


def test_resolution_order_env_then_project_then_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    monkeypatch.setenv("HOME", str(home))
    user = variant(home / ".flodl", "precompiled/cpu")
    (home / ".flodl" / "libtorch" / ".active").write_text("precompiled/cpu\n")
    assert resolve_active(project, {}) == Libtorch(user, "precompiled/cpu", None, "home")
    proj = variant(project, "precompiled/cu128")
    (project / "libtorch" / ".active").write_text("precompiled/cu128")
    assert resolve_active(project, {}) == Libtorch(proj, "precompiled/cu128", "nvidia", "project")
    given = variant(tmp_path, "precompiled/rocm71")
    found = resolve_active(project, {"LIBTORCH_PATH": str(given)})
    assert (found.path, found.vendor, found.found_by) == (given, "amd", "LIBTORCH_PATH")
    assert resolve_active(None, {}) == Libtorch(user, "precompiled/cpu", None, "home")


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
    assert resolve_variant("precompiled/rocm70", tmp_path).path == path
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
    amd = Libtorch(tmp_path / "rocm70", "precompiled/rocm70", "amd", "home")
    env = build_env(amd, {"PATH": "/bin", "ROCM_PATH": "/r", "HSA_PATH": "/h", "LD_LIBRARY_PATH": "/keep"})
    assert env["LIBTORCH_PATH"] == str(tmp_path / "rocm70")
    assert env["FDL_GPU_FEATURE"] == "rocm"
    assert env["LD_LIBRARY_PATH"] == f"/r/lib:/h/lib:{tmp_path}/rocm70/lib:/keep"
    cuda = build_env(Libtorch(tmp_path / "cu128", "precompiled/cu128", "nvidia", "home"), {"ROCM_PATH": "/r"})
    assert (cuda["FDL_GPU_FEATURE"], cuda["LD_LIBRARY_PATH"]) == ("cuda", f"{tmp_path}/cu128/lib")
    cpu = build_env(Libtorch(tmp_path / "cpu", "precompiled/cpu", None, "home"), {})
    assert cpu["FDL_GPU_FEATURE"] == ""
    none = build_env(None, {"LIBTORCH_PATH": "/stale"})
    assert "LIBTORCH_PATH" not in none and none["FDL_GPU_FEATURE"] == ""
