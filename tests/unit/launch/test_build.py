"""The pre-flight build plan: per-host target dirs keyed on arch, the libtorch environment, artifacts."""

from __future__ import annotations

from pathlib import Path

import pytest

from fdl.config.schema import ClusterSpec, CommandSpec, ControllerSpec, SshDefaults, WorkerSpec
from fdl.errors import BuildError
from fdl.hostside.checks.devices import Devices
from fdl.launch.build import artifact_path, build_jobs, check_artifacts
from fdl.launch.plan import plan_launch
from fdl.libtorch.gate import LibtorchError
from tests.fakes import make_libtorch

CPU1 = Devices(kind="cpu", count=1)


def plan_for(root: Path, command: CommandSpec, *archs: str | None):
    workers = tuple(WorkerSpec(host=f"h{i}", address=f"h{i}", arch=arch, local_devices=CPU1)
                    for i, arch in enumerate(archs, 1))
    spec = ClusterSpec(controller=ControllerSpec(), ssh=SshDefaults(), workers=workers)
    return plan_launch(command, [], spec, root, is_local=lambda a, p: False)


@pytest.fixture
def crate(tmp_path, monkeypatch) -> Path:
    for name in ("LIBTORCH", "LIBTORCH_PATH", "LD_LIBRARY_PATH", "CARGO_TARGET_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "Cargo.toml").write_text('[package]\nname = "t"\n')
    make_libtorch(tmp_path / "libtorch", "precompiled/cu128", activate=False)
    make_libtorch(tmp_path / "libtorch", "precompiled/rocm62", cuda=None, archs=None, activate=False)
    make_libtorch(tmp_path / "libtorch", "precompiled/cpu", cuda=None, archs=None)  # .active
    return tmp_path


TRAIN = CommandSpec(name="train", cluster=True, bin="target/release/train")


def test_each_host_builds_into_its_own_dir_with_its_arch_libtorch(crate):
    jobs = {j.host: j for j in build_jobs(plan_for(crate, TRAIN, "precompiled/cu128", "precompiled/rocm62", None))}
    lt = crate / "libtorch" / "precompiled"
    cu, rocm, native = jobs["h1"], jobs["h2"], jobs["h3"]
    assert cu.recipe == "cargo build --release"  # Cargo.toml at the root, no build:
    assert cu.target_dir == crate / "target/cluster/h1/precompiled/cu128"
    assert cu.env["CARGO_TARGET_DIR"] == str(cu.target_dir)
    assert cu.env["LIBTORCH"] == cu.env["LIBTORCH_PATH"] == str(lt / "cu128")
    assert cu.env["FDL_GPU_FEATURE"] == "cuda" and cu.env["LD_LIBRARY_PATH"].startswith(str(lt / "cu128" / "lib"))
    assert cu.artifact == crate / "target/cluster/h1/precompiled/cu128/release/train"
    assert cu.log == cu.target_dir / "fdl-build.log"
    assert rocm.env["FDL_GPU_FEATURE"] == "rocm"
    assert native.target_dir == crate / "target/cluster/h3/native"  # no arch: this machine's active variant
    assert native.env["LIBTORCH_PATH"] == str(lt / "cpu") and native.env["FDL_GPU_FEATURE"] == ""


def test_a_changed_arch_is_a_different_target_dir(crate):
    before = build_jobs(plan_for(crate, TRAIN, "precompiled/cpu"))[0]
    after = build_jobs(plan_for(crate, TRAIN, "precompiled/cu128"))[0]
    assert before.target_dir != after.target_dir and before.artifact != after.artifact


def test_an_arch_not_installed_here_is_refused_naming_the_host(crate):
    with pytest.raises(LibtorchError, match=r"host h2: arch builds/sm61-sm120: no libtorch variant"):
        build_jobs(plan_for(crate, TRAIN, "precompiled/cpu", "builds/sm61-sm120"))


def test_without_cargo_or_build_nothing_is_built_and_bin_ships_as_it_is(tmp_path):
    (tmp_path / "train.py").write_text("#!/bin/sh\n")
    job = build_jobs(plan_for(tmp_path, CommandSpec(name="t", cluster=True, bin="train.py"), "precompiled/cu128"))[0]
    assert job.recipe is None and job.env == {} and job.artifact == tmp_path / "train.py"
    with pytest.raises(BuildError, match="not executable"):
        check_artifacts(plan_for(tmp_path, CommandSpec(name="t", cluster=True, bin="train.py"), None), [job])


def test_a_missing_artifact_is_refused_before_dispatch(crate):
    plan = plan_for(crate, TRAIN, "precompiled/cpu")
    with pytest.raises(BuildError, match=r"target/cluster/h1/precompiled/cpu/release/train\). Nothing was dispatched"):
        check_artifacts(plan, build_jobs(plan))


def test_single_host_builds_in_the_projects_own_target_dir(crate):
    command = TRAIN._replace(local_devices=CPU1, build="make")
    job = build_jobs(plan_launch(command, [], None, crate))[0]
    assert job.recipe == "make" and job.target_dir is None and "CARGO_TARGET_DIR" not in job.env
    assert job.artifact == crate / "target/release/train"


@pytest.mark.parametrize(("bin_", "expected"), [
    ("target/release/x", "/p/target/cluster/h/a/release/x"),
    ("build/x", "/p/build/x"),  # outside target/: CARGO_TARGET_DIR does not move it
    ("/opt/x", "/opt/x"),
])
def test_artifact_path(bin_, expected):
    assert str(artifact_path(bin_, Path("/p"), Path("/p/target/cluster/h/a"))) == expected
