"""`fdl probe` end to end: the real pynvml against a fake libnvidia-ml.so.1, real libtorch trees and
NCCL libraries on disk, exit codes and the words a user reads."""

from __future__ import annotations

import ctypes
import json
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fdl.hostside.checks.nccl import find_nccl
from tests.conftest import fdl_env, run_fdl
from tests.controller_util import free_port
from tests.fakes import make_libtorch

TWO_ARCHS = "H100:9.0:80G,RTX3060:8.6:12G"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing from the machine running the tests leaks into what probe finds."""
    for var in ("CUDA_VISIBLE_DEVICES", "LIBTORCH", "LIBTORCH_PATH", "LD_PRELOAD", "LD_LIBRARY_PATH",
                "FDL_FAKE_NVML", "FDL_FAKE_NVML_DRIVER", "FDL_FAKE_NVML_CUDA", "FDL_PROBE_ROOT"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def ready(tmp_path: Path, fake_nvml) -> tuple[Path, dict]:
    """A project whose libtorch (cu128, bundled NCCL 2.27.5) covers both fake GPUs."""
    project = tmp_path / "proj"
    project.mkdir()
    make_libtorch(project / "libtorch", "precompiled/cu128", archs="7.0 8.0 9.0", nccl="2.27.5")
    return project, fake_nvml.env(TWO_ARCHS)


def _json(result) -> dict:
    assert result.stdout.strip(), result.stderr
    return json.loads(result.stdout)


def _check(doc: dict, name: str) -> dict:
    return next(c for c in doc["checks"] if c["name"] == name)


def _system_has_nvml() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


# ---- green path ----

def test_green_path_prints_one_summary_line(ready) -> None:
    project, env = ready
    result = run_fdl("probe", "--skip-mount", cwd=project, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and result.stderr == ""
    assert lines[0].endswith(": ready: 2 GPUs (sm_86, sm_90), libtorch 2.10.0 cu128, NCCL 2.27.5, data skipped "
                             "(1 more check skipped: `fdl probe --json` says why)")


def test_quiet_green_path_prints_nothing(ready) -> None:
    project, env = ready
    result = run_fdl("probe", "--skip-mount", "--quiet", cwd=project, env=env)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_json_report_follows_the_documented_schema(ready) -> None:
    project, env = ready
    result = run_fdl("probe", "--json", "--skip-mount", cwd=project, env=env)
    assert result.returncode == 0
    doc = _json(result)
    assert set(doc) == {"schema_version", "host", "ok", "time", "checks"}
    assert doc["schema_version"] == 2 and doc["ok"] is True and doc["host"]
    assert abs(doc["time"] - time.time()) < 600
    assert [c["name"] for c in doc["checks"]] == [
        "gpu", "libtorch", "nccl", "data", "gpu_count", "gpu_persistence", "gpu_ecc", "gpu_retired_memory",
        "gpu_pcie", "gpu_throttle", "gpu_mig", "nouveau", "device_nodes", "cuda_driver"]
    for check in doc["checks"]:
        assert set(check) == {"name", "status", "message", "hint", "data"}
    statuses = {c["name"]: c["status"] for c in doc["checks"]}
    assert (statuses.pop("data"), statuses.pop("gpu_count")) == ("skipped", "skipped")  # nothing declared
    assert set(statuses.values()) == {"ok"}, statuses
    gpu = _check(doc, "gpu")["data"]
    assert (gpu["driver_version"], gpu["cuda_driver_version"], gpu["count"]) == ("570.133.20", "12.8", 2)
    assert [(d["name"], d["sm"], d["memory_total"], d["selected"]) for d in gpu["devices"]] == [
        ("H100", "sm_90", 80 << 30, True), ("RTX3060", "sm_86", 12 << 30, True)]
    libtorch = _check(doc, "libtorch")["data"]
    assert (libtorch["source"], libtorch["active"], libtorch["version"], libtorch["variant"]) == (
        "project", "precompiled/cu128", "2.10.0", "cu128")
    nccl = _check(doc, "nccl")["data"]
    assert (nccl["version"], nccl["version_source"], nccl["origin"]) == ("2.27.5", "ncclGetVersion", "libtorch")


def test_human_and_json_reports_carry_the_same_findings(ready, tmp_path: Path) -> None:
    project, env = ready
    args = ("--data-path", str(tmp_path / "absent"))
    human = run_fdl("probe", *args, cwd=project, env=env)
    doc = _json(run_fdl("probe", "--json", *args, cwd=project, env=env))
    assert human.returncode == 1 and doc["ok"] is False
    core = ("gpu", "libtorch", "nccl", "data")
    for check in doc["checks"]:
        shown = check["name"] in core or check["status"] in ("error", "warning")
        assert (check["message"] in human.stdout) is shown, check["name"]
        if check["hint"] and check["status"] in ("error", "warning"):
            assert check["hint"] in human.stdout


# ---- GPU failures through the real pynvml ----

def test_no_nvml_library(ready) -> None:
    if _system_has_nvml():
        pytest.skip("this host has a real libnvidia-ml.so.1, so a missing library cannot be arranged")
    project, _ = ready
    result = run_fdl("probe", "--skip-mount", cwd=project, env={})
    assert result.returncode == 1
    assert "No NVIDIA driver found: the NVML library libnvidia-ml.so.1 is not installed." in result.stdout
    assert "hint: install the NVIDIA driver" in result.stdout and "--gpus all" in result.stdout


def test_nvml_init_failure_after_a_driver_upgrade(ready, fake_nvml) -> None:
    project, _ = ready
    result = run_fdl("probe", "--skip-mount", cwd=project, env=fake_nvml.env("init-fail"))
    assert result.returncode == 1
    assert "kernel module and its user-space library are different versions" in result.stdout
    assert "reboot" in result.stdout


def test_nvml_driver_not_loaded(ready, fake_nvml) -> None:
    project, _ = ready
    doc = _json(run_fdl("probe", "--json", "--skip-mount", cwd=project, env=fake_nvml.env("init-fail:9")))
    gpu = _check(doc, "gpu")
    assert gpu["status"] == "error" and gpu["data"]["nvml_error_code"] == 9
    assert "not loaded" in gpu["message"] and "modprobe nvidia" in gpu["hint"]


def test_zero_gpus(ready, fake_nvml) -> None:
    project, _ = ready
    result = run_fdl("probe", "--skip-mount", cwd=project, env=fake_nvml.env("none", driver="535.104.05"))
    assert result.returncode == 1
    assert "NVML works (driver 535.104.05, CUDA 12.8) but reports no GPU on this host." in result.stdout
    assert "lspci" in result.stdout


# ---- a CPU host: --cpu, --devices cpu:N ----

def test_this_machine_as_a_cpu_host_passes_without_any_gpu(tmp_path: Path) -> None:
    """`fdl probe --cpu --skip-mount` with no NVIDIA library reachable: the PyTorch of fdl's environment is its
    libtorch, and nothing GPU-only is judged."""
    result = run_fdl("probe", "--cpu", "--skip-mount", cwd=tmp_path, env={})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    line = result.stdout.strip()
    assert ": ready: CPU host (cpu:2, gloo; GPU and NCCL checks skipped), libtorch 2.13.0 " in line, line
    assert line.endswith(", data skipped")  # the skipped GPU checks are not counted as "more checks skipped"
    doc = _json(run_fdl("probe", "--cpu", "--skip-mount", "--json", cwd=tmp_path, env={}))
    assert doc["ok"] is True
    gpu = _check(doc, "gpu")
    assert gpu["status"] == "skipped" and gpu["data"] == {"cpu_host": True, "declared": "cpu:2"}
    assert _check(doc, "libtorch")["data"]["python"] == sys.executable  # the Python whose PyTorch it found


def test_the_smoke_test_of_a_cpu_host_runs_the_cpu_ranks_it_declares(tmp_path: Path) -> None:
    result = run_fdl("probe", "--devices", "cpu:3", "--skip-mount", "--json", "--collective",
                     "--collective-max-size", "8K", "--collective-timeout", "90", cwd=tmp_path, env={}, timeout=150)
    check = _check(_json(result), "collective")
    assert check["status"] == "ok", check["message"] + result.stderr
    assert check["data"]["world_size"] == 3 and check["data"]["backend"] == "gloo"
    assert result.returncode == 0


def test_devices_cpu_n_is_a_cpu_host_and_a_problem_report_says_why_gpu_checks_are_missing(tmp_path: Path,
                                                                                          fake_nvml) -> None:
    make_libtorch(tmp_path / "libtorch", "precompiled/cpu", cuda="none", archs="cpu")
    args = ("probe", "--devices", "cpu:3", "--data-path", str(tmp_path / "absent"))
    result = run_fdl(*args, cwd=tmp_path, env=fake_nvml.env("init-fail"))
    assert result.returncode == 1  # the data path, nothing GPU-related
    out = result.stdout
    assert "NOT READY (1 error)" in out
    assert "skipped  gpu       Not checked: this host runs CPU ranks (cpu:3), which need no GPU or NVIDIA " \
           "driver." in out
    assert "skipped  nccl      Not checked: CPU ranks talk over gloo; NCCL is not used." in out
    assert "10 GPU health and stack checks skipped: a CPU host uses no GPU" in out
    assert "ERROR    data" in out


def test_declared_gpus_on_a_host_without_gpus_still_fail(tmp_path: Path, fake_nvml) -> None:
    make_libtorch(tmp_path / "libtorch", "precompiled/cu128", nccl="2.27.5")
    result = run_fdl("probe", "--devices", "0", "--skip-mount", "--json", cwd=tmp_path, env=fake_nvml.env("none"))
    assert result.returncode == 1
    doc = _json(result)
    assert _check(doc, "gpu")["status"] == "error" and _check(doc, "gpu_count")["status"] == "error"
    assert "fdl probe --cpu" in _check(doc, "gpu")["hint"]


@pytest.mark.parametrize(("args", "words"), [
    (("--cpu", "--devices", "0"), "--cpu and --devices contradict each other (both say what this host offers): "
                                  "give one of them."),
    (("--devices", "cpu:x"), "--devices 'cpu:x': cpu:N needs N from 1 to 256."),
    (("--devices", "0,0"), "--devices '0,0': GPU 0 is listed twice."),
])
def test_contradictory_or_bad_device_flags_are_usage_errors(tmp_path: Path, args: tuple, words: str) -> None:
    result = run_fdl("probe", *args, cwd=tmp_path, env={})
    assert result.returncode == 2, result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_cpu_with_a_gpu_selection_is_a_usage_error(ready) -> None:
    project, env = ready
    result = run_fdl("--gpus", "0", "probe", "--cpu", cwd=project, env=env)
    assert result.returncode == 2
    assert "--cpu judges this host as a CPU host, and --gpus selects GPUs to judge; give one of them." \
        in result.stderr


def test_cpu_is_refused_under_a_cluster_env(ready) -> None:
    project, env = ready
    (project / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
    (project / "fdl.cluster.yml").write_text("cluster:\n  workers:\n    - {host: node-b, address: 10.0.0.12}\n")
    result = run_fdl("@cluster", "probe", "--cpu", cwd=project, env=env)
    assert result.returncode == 2, result.stderr
    assert "--cpu says what this one host offers; across a cluster every worker declares its own " \
           "local_devices in fdl.cluster.yml (cpu:N for a CPU host)." in result.stderr


def test_gpu_outside_the_libtorch_arch_list_blocks(tmp_path: Path, fake_nvml) -> None:
    make_libtorch(tmp_path / "libtorch", "precompiled/cu128", archs="7.0 8.0 9.0", nccl="2.27.5")
    env = fake_nvml.env("H100:9.0:80G,RTX 5090:12.0:32G")
    result = run_fdl("probe", "--skip-mount", cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert "NOT READY (1 error)" in result.stdout
    assert "GPU 1 (RTX 5090, sm_120) is not covered by this build's arch list (7.0 8.0 9.0)" in result.stdout
    quiet = run_fdl("probe", "--skip-mount", "--quiet", cwd=tmp_path, env=env)
    assert quiet.returncode == 1 and quiet.stdout == ""
    assert "error: libtorch: " in quiet.stderr and "sm_120" in quiet.stderr


def test_gpu_selection_limits_the_arch_check(tmp_path: Path, fake_nvml) -> None:
    make_libtorch(tmp_path / "libtorch", "precompiled/cu128", archs="9.0", nccl="2.27.5")
    env = fake_nvml.env("H100:9.0:80G,RTX 5090:12.0:32G")
    result = run_fdl("--gpus", "0", "probe", "--json", "--skip-mount", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout
    gpu = _check(_json(result), "gpu")["data"]
    assert gpu["selection"] == {"source": "--gpus", "spec": "0", "indices": [0]}
    assert [d["selected"] for d in gpu["devices"]] == [True, False]


def test_cuda_visible_devices_by_uuid(tmp_path: Path, fake_nvml) -> None:
    make_libtorch(tmp_path / "libtorch", "precompiled/cu128", archs="9.0", nccl="2.27.5")
    env = fake_nvml.env("H100:9.0:80G:uuid=GPU-aaaa-1,RTX 5090:12.0:32G:uuid=GPU-bbbb-2")
    env["CUDA_VISIBLE_DEVICES"] = "GPU-bbbb"
    doc = _json(run_fdl("probe", "--json", "--skip-mount", cwd=tmp_path, env=env))
    assert [d["selected"] for d in _check(doc, "gpu")["data"]["devices"]] == [False, True]
    assert _check(doc, "libtorch")["status"] == "error"  # the selected one is sm_120, outside "9.0"


def test_visible_devices_hiding_every_gpu_warns(ready) -> None:
    project, env = ready
    result = run_fdl("probe", "--skip-mount", cwd=project, env={**env, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0
    assert "ready (1 warning)" in result.stdout and "hides every GPU" in result.stdout


def test_strict_fails_the_gate_on_a_warning_and_says_so(ready) -> None:
    """Regression (issue 38 item 8): "ready (1 warning)" exits 0, and seed 000's gate reads "0 when every
    component is green". Warnings stay non-blocking by default; --strict makes them fail the gate, in the human
    report, with --json (whose `ok` then matches the exit code) and with --quiet."""
    project, env = ready
    env = {**env, "CUDA_VISIBLE_DEVICES": ""}  # hides every GPU: one warning, no error
    lenient = run_fdl("probe", "--skip-mount", cwd=project, env=env)
    assert lenient.returncode == 0 and "ready (1 warning)" in lenient.stdout
    strict = run_fdl("probe", "--skip-mount", "--strict", cwd=project, env=env)
    assert strict.returncode == 1
    assert "ready (1 warning)" in strict.stdout
    assert "fdl: --strict: 1 warning fails the gate (exit 1)" in strict.stderr
    doc = _json(run_fdl("probe", "--skip-mount", "--strict", "--json", cwd=project, env=env))
    assert (doc["ok"], doc["strict"]) == (False, True)
    assert [c["name"] for c in doc["checks"] if c["status"] == "warning"] == ["gpu"]
    assert "strict" not in _json(run_fdl("probe", "--skip-mount", "--json", cwd=project, env=env))
    json_run = run_fdl("probe", "--skip-mount", "--strict", "--json", cwd=project, env=env)
    assert json_run.returncode == 1
    quiet = run_fdl("probe", "--skip-mount", "--strict", "--quiet", cwd=project, env=env)
    assert (quiet.returncode, quiet.stdout) == (1, "")
    green = run_fdl("probe", "--skip-mount", "--strict", "--json", cwd=project, env=_env_without_visible(env))
    assert green.returncode == 0 and json.loads(green.stdout)["ok"] is True


def _env_without_visible(env: dict) -> dict:
    return {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}


# ---- libtorch resolution through the command line ----

def test_libtorch_path_flag_and_env(tmp_path: Path, fake_nvml) -> None:
    flag_tree = make_libtorch(tmp_path / "opt", "", torch="2.9.1", cuda="12.6", archs="8.6 9.0", nccl="2.21.5")
    env_tree = make_libtorch(tmp_path / "env", "", torch="2.10.0", nccl="2.27.5")
    env = {**fake_nvml.env(TWO_ARCHS), "LIBTORCH": str(env_tree)}
    by_flag = _json(run_fdl("probe", "--json", "--skip-mount", "--libtorch-path", str(flag_tree), cwd=tmp_path,
                            env=env))
    by_env = _json(run_fdl("probe", "--json", "--skip-mount", cwd=tmp_path, env=env))
    assert (_check(by_flag, "libtorch")["data"]["source"], _check(by_flag, "nccl")["data"]["version"]) == (
        "--libtorch-path", "2.21.5")
    assert (_check(by_env, "libtorch")["data"]["source"], _check(by_env, "nccl")["data"]["version"]) == (
        "LIBTORCH", "2.27.5")


def test_project_libtorch_is_found_from_a_subdirectory(tmp_path: Path, fake_nvml) -> None:
    (tmp_path / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
    make_libtorch(tmp_path / "libtorch", "builds/sm86-sm90", archs="8.6 9.0", nccl="2.27.5")
    (tmp_path / "src" / "deep").mkdir(parents=True)
    doc = _json(run_fdl("probe", "--json", "--skip-mount", cwd=tmp_path / "src" / "deep",
                        env=fake_nvml.env(TWO_ARCHS)))
    assert _check(doc, "libtorch")["data"]["active"] == "builds/sm86-sm90"


def test_no_libtorch_anywhere(tmp_path: Path, fake_nvml) -> None:
    env = {**fake_nvml.env(TWO_ARCHS), "HOME": str(tmp_path), "FDL_LIBTORCH_FROM_PYTORCH": "0"}
    result = run_fdl("probe", "--skip-mount", cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert "No libtorch found" in result.stdout and "fdl libtorch download" in result.stdout


def test_cuda_libtorch_without_nccl_blocks(tmp_path: Path, fake_nvml) -> None:
    if find_nccl(None, {}) is not None:
        pytest.skip("this host has a system libnccl.so.2")
    make_libtorch(tmp_path / "libtorch", "precompiled/cu128", archs="8.0 9.0")
    result = run_fdl("probe", "--skip-mount", cwd=tmp_path, env=fake_nvml.env(TWO_ARCHS))
    assert result.returncode == 1 and "No libnccl.so.2 found for the CUDA libtorch (cu128)" in result.stdout


def test_system_nccl_on_ld_library_path(tmp_path: Path, fake_nvml, fake_nccl) -> None:
    make_libtorch(tmp_path / "libtorch", "precompiled/cu128", archs="8.0 9.0")
    env = fake_nvml.env(TWO_ARCHS, extra_lib_dirs=(str(fake_nccl("2.26.2")),))
    doc = _json(run_fdl("probe", "--json", "--skip-mount", cwd=tmp_path, env=env))
    assert (_check(doc, "nccl")["status"], _check(doc, "nccl")["data"]["origin"]) == ("ok", "LD_LIBRARY_PATH")


# ---- --docker ----

def test_docker_service_replaces_the_host_nccl_check(tmp_path: Path, fake_nvml) -> None:
    """A stand-in `docker` script on PATH: no Docker engine or compose plugin exists on these machines."""
    make_libtorch(tmp_path / "libtorch", "precompiled/cu128", archs="8.0 9.0")  # no NCCL on the host
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\n[ \"$*\" = 'compose config --services' ] && printf 'cuda\\n'\n")
    (bin_dir / "docker").chmod(0o755 | stat.S_IXUSR)
    env = {**fake_nvml.env(TWO_ARCHS), "PATH": str(bin_dir)}
    ok = run_fdl("probe", "--skip-mount", "--docker", "cuda", cwd=tmp_path, env=env)
    assert ok.returncode == 0, ok.stdout
    assert "NCCL from docker service cuda" in ok.stdout
    missing = run_fdl("probe", "--skip-mount", "--docker", "rocm", cwd=tmp_path, env=env)
    assert missing.returncode == 1 and "no service named 'rocm' (it has: cuda)" in missing.stdout


def test_docker_not_installed(tmp_path: Path, fake_nvml) -> None:
    make_libtorch(tmp_path / "libtorch", "precompiled/cu128", archs="8.0 9.0")
    env = {**fake_nvml.env(TWO_ARCHS), "PATH": str(tmp_path)}
    result = run_fdl("probe", "--skip-mount", "--docker", "cuda", cwd=tmp_path, env=env)
    assert result.returncode == 1 and "docker command is not installed" in result.stdout


# ---- data path through the command line ----

def test_missing_data_path_blocks_with_a_way_out(ready, tmp_path: Path) -> None:
    project, env = ready
    result = run_fdl("probe", "--data-path", str(tmp_path / "nowhere"), cwd=project, env=env)
    assert result.returncode == 1
    assert f"Shared data path {tmp_path / 'nowhere'} does not exist on this host." in result.stdout
    assert "--skip-mount" in result.stdout


# ---- cluster env and import hygiene ----

def test_cluster_env_probes_every_worker(ready, tmp_path: Path) -> None:
    """Under a cluster env every worker is probed: this machine natively, the others over SSH.

    node-b points at a loopback port where nothing listens (traffic stays on
    this machine); tests/integration/cluster covers real sshd hosts.
    """
    project, env = ready
    (project / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
    (project / "fdl.cluster.yml").write_text(textwrap.dedent("""\
        cluster:
          controller: {host: 127.0.0.1, port: 1337}
          workers:
            - {host: node-a, address: 127.0.0.1}
            - {host: node-b, address: 127.0.0.1, port: 2, user: nobody}
        """))
    env = {**env, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    result = run_fdl("@cluster", "probe", "--json", "--skip-mount", cwd=project, env=env)
    assert result.returncode == 1, result.stderr
    doc = _json(result)
    assert [h["host"] for h in doc["hosts"]] == ["node-a", "node-b"]
    node_a, node_b = doc["hosts"]
    assert node_a["ok"] is True and _check(node_a, "gpu")["status"] == "ok"  # this machine, probed natively
    ssh = _check(node_b, "ssh")
    assert ssh["message"].startswith("node-b (nobody@127.0.0.1:2) is unreachable: nothing accepts SSH connections")
    assert "Connection refused" in ssh["message"]
    assert [c["name"] for c in doc["cluster"]] == ["nccl_match", "libtorch_match", "data_match", "driver_match",
                                                   "gpu_models", "clock_skew"]
    clock = next(c for c in doc["cluster"] if c["name"] == "clock_skew")
    assert clock["status"] == "ok" and set(clock["data"]["offsets"]) == {"node-a"}  # the native probe's window


def test_collective_devices_is_refused_across_a_cluster(ready) -> None:
    project, env = ready
    (project / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
    (project / "fdl.cluster.yml").write_text("cluster:\n  workers:\n    - {host: node-b, address: 10.0.0.12}\n")
    result = run_fdl("@cluster", "probe", "--collective", "--collective-devices", "cpu:4", cwd=project, env=env)
    assert result.returncode == 2, result.stderr
    assert "--collective-devices sets the ranks of a single-host smoke test" in result.stderr
    assert "local_devices" in result.stderr and "Traceback" not in result.stderr


def _collective_cluster(project: Path, tmp_path: Path, env: dict, python: str, port: int) -> dict:
    """A cluster env whose one worker is this machine (so its ranks run in-process, no ssh) on 2 CPU ranks."""
    (project / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
    (project / "fdl.cluster.yml").write_text(textwrap.dedent(f"""\
        cluster:
          controller: {{host: 127.0.0.1, port: {port}, bind: 127.0.0.1}}
          workers:
            - host: node-a
              address: 127.0.0.1
              local_devices: cpu:2
              python: {python}
              env: {{GLOO_SOCKET_IFNAME: lo}}
        """))
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {**env, "HOME": str(home), "XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_collective_across_a_cluster_runs_the_ranks_through_the_launcher(ready, tmp_path: Path) -> None:
    project, env = ready
    env = _collective_cluster(project, tmp_path, env, sys.executable, free_port())
    result = run_fdl("@cluster", "probe", "--json", "--skip-mount", "--collective", "--collective-max-size", "32K",
                     "--collective-timeout", "90", cwd=project, env=env, timeout=150)
    doc = _json(result)
    check = next(c for c in doc["cluster"] if c["name"] == "collective")
    assert check["status"] == "ok", check["message"] + result.stderr
    assert check["message"].startswith("All-reduce across 2 ranks on 1 host (gloo): 8 KiB to 32 KiB")
    data = check["data"]
    assert data["hosts"] == {"node-a": [0, 1]} and data["world_size"] == 2
    assert [r["bytes"] for r in data["rows"]] == [8 << 10, 16 << 10, 32 << 10]
    assert result.returncode == 0, result.stderr
    runs = list((tmp_path / "home" / ".flodl" / "launch" / "runs").glob("*/state.json"))
    assert len(runs) == 1 and json.loads(runs[0].read_text())["phase"] == "done"  # the launcher's own record


def test_collective_skips_a_host_without_pytorch_with_a_warning(ready, tmp_path: Path) -> None:
    project, env = ready
    bare = tmp_path / "bare"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(bare)], check=True)
    if subprocess.run([str(bare / "bin" / "python3"), "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.fail("/usr/bin/python3's own packages include torch: no interpreter without it to test with")
    env = _collective_cluster(project, tmp_path, env, str(bare / "bin" / "python3"), free_port())
    result = run_fdl("@cluster", "probe", "--skip-mount", "--collective", cwd=project, env=env, timeout=120)
    assert result.returncode == 0, result.stderr  # a warning, not a failure
    assert "Skipped, PyTorch cannot be imported there: node-a (" in result.stdout
    assert "No host could run the all-reduce smoke test." in result.stdout
    assert "hint: install PyTorch for the worker's python" in result.stdout


def test_collective_is_abandoned_at_its_time_limit_and_leaves_no_rank(ready, tmp_path: Path) -> None:
    project, env = ready
    # An interpreter that passes the PyTorch check but whose ranks never finish (they record their pids).
    pids = tmp_path / "pids"
    hang = tmp_path / "hangpy"
    hang.write_text(f"#!/bin/sh\ncase \" $* \" in *\" --check \"*) exec {sys.executable} \"$@\";; esac\n"
                    f"echo $$ >> {pids}\nexec sleep 300\n")
    hang.chmod(0o755)
    env = _collective_cluster(project, tmp_path, env, str(hang), free_port())
    # The PyTorch check before the ranks gets half the limit: 20 s lets `import torch` finish on a loaded box
    # (10 s did not, with two clones' suites running at once on two cores).
    result = run_fdl("@cluster", "probe", "--json", "--skip-mount", "--collective", "--collective-timeout", "40",
                     cwd=project, env=env, timeout=180)
    assert result.returncode == 1, result.stderr
    check = next(c for c in _json(result)["cluster"] if c["name"] == "collective")
    assert check["status"] == "error"
    assert "did not complete: abandoned at the 40 s time limit (0 message sizes done)" in check["message"]
    assert check["data"]["abandoned"] is True
    started_ranks = [int(p) for p in pids.read_text().split()]
    assert len(started_ranks) == 2, started_ranks  # both ranks ran, and neither outlived the probe
    left = [p for p in started_ranks if Path(f"/proc/{p}").exists()
            and Path(f"/proc/{p}/stat").read_text().split()[2] != "Z"]
    assert not left, f"ranks left running: {left}"


def test_probe_never_imports_ansible_or_requests(ready) -> None:
    project, env = ready
    code = ("import sys; from fdl.cli.main import main; rc = main(['probe', '--json', '--skip-mount']); "
            "bad = sorted(m for m in ('ansible', 'ansible_runner', 'requests', 'yaml') if m in sys.modules); "
            "print('IMPORTED', bad, 'pynvml' in sys.modules, rc, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], cwd=project, env=fdl_env(env), capture_output=True,
                          text=True, timeout=60)
    assert "IMPORTED [] True 0" in done.stderr, done.stderr


# ---- GPU health and software stack (the depth checks) in the human report ----

def test_a_depth_warning_shows_only_that_depth_check(tmp_path: Path, fake_nvml) -> None:
    make_libtorch(tmp_path / "libtorch", "precompiled/cu128", archs="8.0 9.0", nccl="2.27.5")
    env = fake_nvml.env("H100:9.0:80G,A100:8.0:40G:persist=0:pcie=4.8/4.16")
    result = run_fdl("probe", "--skip-mount", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout
    assert "ready (2 warnings)" in result.stdout
    assert "warning  gpu_persistence Persistence mode is off on GPU 1 (A100)" in result.stdout
    assert "hint: enable the nvidia-persistenced service" in result.stdout
    assert "gpu_pcie" in result.stdout and "x8 of x16 lanes" in result.stdout
    for green in ("gpu_ecc", "gpu_mig", "nouveau", "device_nodes", "cuda_driver", "gpu_throttle"):
        assert green not in result.stdout, green
    for core in ("gpu ", "libtorch", "nccl", "data"):  # the core checks give the context
        assert f" {core}" in result.stdout


def test_a_depth_error_blocks_and_quiet_names_it(tmp_path: Path, fake_nvml) -> None:
    make_libtorch(tmp_path / "libtorch", "precompiled/cu128", archs="8.0 9.0", nccl="2.27.5")
    env = fake_nvml.env("H100:9.0:80G:ecc_vol=4,H100:9.0:80G:mig=on")
    result = run_fdl("probe", "--skip-mount", cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert "NOT READY (2 errors)" in result.stdout
    assert "ERROR    gpu_ecc" in result.stdout and "ERROR    gpu_mig" in result.stdout
    quiet = run_fdl("probe", "--skip-mount", "--quiet", cwd=tmp_path, env=env)
    assert quiet.returncode == 1 and quiet.stdout == ""
    assert "error: gpu_ecc: GPU 0 (H100): 4 uncorrectable ECC errors" in quiet.stderr
    assert "hint: turn MIG off" in quiet.stderr


def test_driver_too_old_for_the_libtorch_build_names_both(tmp_path: Path, fake_nvml) -> None:
    make_libtorch(tmp_path / "libtorch", "precompiled/cu128", archs="8.0 9.0", nccl="2.27.5")
    result = run_fdl("probe", "--skip-mount", cwd=tmp_path,
                     env=fake_nvml.env("H100:9.0:80G", driver="470.256.02", cuda=11040))
    assert result.returncode == 1
    assert ("The driver 470.256.02 supports CUDA 11.4, but libtorch cu128 is built for CUDA 12.8" in
            result.stdout)
    assert "hint: upgrade the NVIDIA driver (CUDA 12.8 needs driver 570.26 or newer)" in result.stdout
