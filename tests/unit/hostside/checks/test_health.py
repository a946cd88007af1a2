"""GPU health and software stack checks against scripted faults: the real pynvml reads a fake
libnvidia-ml.so.1 (tests/fakes/fake_nvml.c), the stack checks read a scripted host root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO, need_root_or_skip
from tests.fakes import make_host_root, make_libtorch

PROBE = (
    "import json, sys\n"
    "from fdl.hostside.checks.probe import ProbeOptions, run_probe\n"
    "report = run_probe(ProbeOptions(**json.loads(sys.argv[1])), host='h')\n"
    "print(json.dumps(report.to_dict()))\n"
)


@pytest.fixture
def probe(fake_nvml, tmp_path: Path):
    """probe("H100:9.0:80G:ecc_vol=2", **options) -> {check name: check dict} from a real run_probe."""
    libtorch = make_libtorch(tmp_path / "libtorch", "precompiled/cu128", archs="8.0 9.0", nccl="2.27.5")

    def run(devices: str, *, root: Path | None = None, cuda: int | None = None, env: dict | None = None,
            user: int | None = None, **options) -> dict:
        options.setdefault("skip_mount", True)
        options.setdefault("libtorch_path", str(libtorch))
        full_env = {**fake_nvml.env(devices, cuda=cuda, root=root), "PATH": "/usr/bin:/bin",
                    "HOME": str(tmp_path), "PYTHONPATH": str(REPO), **(env or {})}
        argv = [sys.executable, "-c", PROBE, json.dumps(options)]
        if user is not None:
            argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
        done = subprocess.run(argv, env=full_env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return {c["name"]: c for c in json.loads(done.stdout)["checks"]}

    return run


def status(checks: dict, name: str) -> str:
    return checks[name]["status"]


# ---- a healthy host ----

def test_a_healthy_host_is_green_everywhere(probe) -> None:
    checks = probe("H100:9.0:80G,A100:8.0:40G")
    assert {n: c["status"] for n, c in checks.items() if c["status"] != "ok"} == {
        "data": "skipped", "gpu_count": "skipped"}
    assert checks["gpu_pcie"]["data"]["devices"][0] == {"index": 0, "gen": 4, "gen_max": 4, "width": 16,
                                                         "width_max": 16, "pstate": 0}
    assert checks["gpu_mig"]["data"]["whole_gpus"] is True


# ---- persistence ----

def test_persistence_off_is_a_warning_naming_the_gpu(probe) -> None:
    check = probe("H100:9.0:80G,A100:8.0:40G:persist=0")["gpu_persistence"]
    assert check["status"] == "warning"
    assert "Persistence mode is off on GPU 1 (A100)" in check["message"] and "GPU 0" not in check["message"]
    assert "nvidia-persistenced" in check["hint"]


def test_an_unreadable_reading_is_a_warning_not_a_pass(probe) -> None:
    check = probe("H100:9.0:80G:deny=persist")["gpu_persistence"]
    assert check["status"] == "warning" and "could not read its persistence mode (Insufficient Permissions)" \
        in check["message"]


# ---- ECC ----

@pytest.mark.parametrize("fault, severity, words", [
    ("ecc_vol=2", "error", "2 uncorrectable ECC errors since the driver loaded"),
    ("ecc_agg=3", "error", "3 uncorrectable ECC errors over the board's lifetime"),
    ("ecc=off", "warning", "ECC is off"),
    ("ecc_pending=off", "warning", "ECC turns off at its next reset"),
])
def test_ecc_faults(probe, fault: str, severity: str, words: str) -> None:
    check = probe(f"H100:9.0:80G:{fault}")["gpu_ecc"]
    assert check["status"] == severity and words in check["message"]
    assert check["hint"]


def test_a_board_without_ecc_is_not_a_finding(probe) -> None:
    check = probe("RTX3060:8.6:12G:na=ecc")["gpu_ecc"]
    assert check["status"] == "ok" and "not supported" in check["message"]
    assert check["data"]["devices"][0]["supported"] is False


def test_volatile_errors_block_the_whole_report(probe) -> None:
    checks = probe("H100:9.0:80G,H100:9.0:80G:ecc_vol=1")
    assert status(checks, "gpu_ecc") == "error" and "GPU 1 (H100): 1 uncorrectable ECC error " in \
        checks["gpu_ecc"]["message"]
    assert "nvidia-smi -r -i 1" in checks["gpu_ecc"]["hint"]


# ---- retired pages and row remapping ----

@pytest.mark.parametrize("fault, severity, words", [
    ("retired_pending=1", "error", "a memory page is waiting to be retired"),
    ("retired_sbe=40:retired_dbe=20", "error", "60 memory pages retired (20 after double-bit errors)"),
    ("retired_dbe=16", "warning", "16 memory pages retired after double-bit errors"),
    ("retired_sbe=3:retired_dbe=1", "ok", "No pending or excessive memory retirement"),
    ("remap=0/1/0/1", "error", "row remapping failed"),
    ("remap=0/0/1/0", "error", "row remap is waiting for a GPU reset"),
    ("remap=12/2/0/0", "ok", "No pending or excessive memory retirement"),
])
def test_retirement_faults(probe, fault: str, severity: str, words: str) -> None:
    check = probe(f"H100:9.0:80G:{fault}")["gpu_retired_memory"]
    assert check["status"] == severity and words in check["message"], check["message"]


def test_retired_page_counts_are_reported_in_data(probe) -> None:
    device = probe("V100:7.0:16G:retired_sbe=3:retired_dbe=1:na=remap")["gpu_retired_memory"]["data"]["devices"][0]
    assert (device["retired_sbe"], device["retired_dbe"], device["remap_failure"]) == (3, 1, None)


# ---- PCIe ----

@pytest.mark.parametrize("fault, severity, words", [
    ("pcie=4.8/4.16", "warning", "PCIe link runs at x8 of x16 lanes"),
    ("pcie=3.16/4.16:pstate=0", "warning", "PCIe link trained at gen3 while the GPU is busy (P0)"),
    ("pcie=1.16/4.16:pstate=8", "ok", "full width"),  # an idle GPU slows its link on purpose
    ("pcie=5.16/5.16", "ok", "full width"),
])
def test_pcie_link(probe, fault: str, severity: str, words: str) -> None:
    check = probe(f"H100:9.0:80G:{fault}")["gpu_pcie"]
    assert check["status"] == severity and words in check["message"], check["message"]


# ---- throttle reasons ----

@pytest.mark.parametrize("mask, severity, words, hint", [
    ("0x88", "warning", "HW slowdown, HW power brake", "power supply"),
    ("0x48", "warning", "HW slowdown, HW thermal slowdown", "cooling"),
    ("0x20", "warning", "SW thermal slowdown", "cooling"),
    ("0x5", "ok", "No fault", None),  # idle + software power cap: normal
])
def test_throttle_reasons(probe, mask: str, severity: str, words: str, hint: str | None) -> None:
    check = probe(f"H100:9.0:80G:throttle={mask}")["gpu_throttle"]
    assert check["status"] == severity and words in check["message"], check["message"]
    assert (hint in check["hint"]) if hint else check["hint"] is None


def test_throttle_reasons_are_decoded_in_data(probe) -> None:
    device = probe("H100:9.0:80G:throttle=0x84")["gpu_throttle"]["data"]["devices"][0]
    assert device == {"index": 0, "reasons": ["sw_power_cap", "hw_power_brake_slowdown"], "mask": 0x84}


# ---- MIG ----

def test_mig_on_is_an_error_when_the_run_expects_whole_gpus(probe) -> None:
    check = probe("A100:8.0:40G:mig=on:migs=3")["gpu_mig"]
    assert check["status"] == "error" and "MIG mode is on (3 instances)" in check["message"]
    assert "nvidia-smi -mig 0 -i 0" in check["hint"]
    assert len(check["data"]["devices"][0]["instances"]) == 3


def test_mig_instances_selected_by_uuid_are_what_the_run_expects(probe) -> None:
    checks = probe("A100:8.0:40G,A100:8.0:40G:mig=on", env={"CUDA_VISIBLE_DEVICES": "MIG-fa4e0000-0000-4000-8001"})
    assert status(checks, "gpu_mig") == "ok" and "the run uses MIG instances" in checks["gpu_mig"]["message"]
    assert [d["selected"] for d in checks["gpu"]["data"]["devices"]] == [False, True]


def test_mig_is_reported_not_refused_when_whole_gpus_are_not_expected(probe) -> None:
    check = probe("A100:8.0:40G:mig=on", whole_gpus=False)["gpu_mig"]
    assert check["status"] == "ok" and check["data"]["whole_gpus"] is False


def test_a_pending_mig_change_is_a_warning(probe) -> None:
    check = probe("A100:8.0:40G:mig_pending=on")["gpu_mig"]
    assert check["status"] == "warning" and "MIG mode turns on at its next reset" in check["message"]


def test_mig_unsupported_boards_are_whole_gpus(probe) -> None:
    check = probe("V100:7.0:16G:na=mig")["gpu_mig"]
    assert check["status"] == "ok" and check["data"]["devices"][0]["supported"] is False


# ---- GPU count ----

def test_a_declared_gpu_that_is_missing_is_an_error(probe) -> None:
    checks = probe("H100:9.0:80G,H100:9.0:80G", local_devices=[0, 1, 2])
    count = checks["gpu_count"]
    assert count["status"] == "error"
    assert count["message"] == "local_devices declares GPU 2, but NVML sees 2 usable GPUs (0, 1)."
    assert "nvidia-smi" in count["hint"]
    assert checks["gpu"]["data"]["selection"]["source"] == "local_devices"
    assert status(checks, "gpu") == "ok"  # the present GPUs are fine; the missing one is gpu_count's finding


def test_declared_gpus_all_present(probe) -> None:
    count = probe("H100:9.0:80G,H100:9.0:80G", local_devices="0,1")["gpu_count"]
    assert count["status"] == "ok" and count["data"]["declared"] == [0, 1]


def test_a_gpu_fallen_off_the_bus_is_an_error_declared_or_not(probe) -> None:
    checks = probe("H100:9.0:80G,H100:9.0:80G:lost,H100:9.0:80G")
    count = checks["gpu_count"]
    assert count["status"] == "error" and "GPU 1 is lost" in count["message"] and "Xid 79" in count["hint"]
    assert count["data"]["unreachable"] == [{"index": 1, "error": "GPU is lost", "code": 15}]
    assert checks["gpu"]["data"]["count"] == 2  # the other two are still probed


# ---- nouveau ----

def test_nouveau_loaded_is_an_error(probe, tmp_path: Path) -> None:
    check = probe("H100:9.0:80G", root=make_host_root(tmp_path / "host", nouveau=True))["nouveau"]
    assert check["status"] == "error" and "blacklist nouveau" in check["hint"]
    assert check["data"]["loaded"] is True


def test_no_proc_modules_skips_the_nouveau_check(probe, tmp_path: Path) -> None:
    check = probe("H100:9.0:80G", root=make_host_root(tmp_path / "host", modules=False))["nouveau"]
    assert check["status"] == "skipped"


def test_nvidia_modules_are_reported(probe) -> None:
    check = probe("H100:9.0:80G")["nouveau"]
    assert check["status"] == "ok" and check["data"]["nvidia_modules"] == [
        "nvidia", "nvidia_drm", "nvidia_modeset", "nvidia_uvm"]


# ---- device nodes ----

def test_a_missing_gpu_node_is_an_error(probe, tmp_path: Path) -> None:
    check = probe("H100:9.0:80G,H100:9.0:80G", root=make_host_root(tmp_path / "host", missing=("nvidia1",)))[
        "device_nodes"]
    assert check["status"] == "error" and "/dev/nvidia1 is missing" in check["message"]
    assert check["data"]["nodes"]["/dev/nvidia0"] == "ok"


def test_nodes_follow_the_gpu_minor_number(probe, tmp_path: Path) -> None:
    root = make_host_root(tmp_path / "host", minors=(0,), missing=())
    check = probe("H100:9.0:80G:minor=5", root=root)["device_nodes"]
    assert check["status"] == "error" and "/dev/nvidia5 is missing" in check["message"]


def test_a_plain_file_is_not_a_device_node(probe, tmp_path: Path) -> None:
    check = probe("H100:9.0:80G", root=make_host_root(tmp_path / "host", plain=("nvidiactl",)))["device_nodes"]
    assert check["status"] == "error" and "/dev/nvidiactl is not a character device" in check["message"]


def test_a_missing_uvm_node_is_a_warning(probe, tmp_path: Path) -> None:
    check = probe("H100:9.0:80G", root=make_host_root(tmp_path / "host", missing=("nvidia-uvm",)))["device_nodes"]
    assert check["status"] == "warning" and "/dev/nvidia-uvm is missing" in check["message"]


def test_nodes_this_user_cannot_open_are_an_error(probe, fake_nvml) -> None:
    """A real root-only character device, probed by an unprivileged user (setpriv). The user must be
    able to reach the fake NVML and the host root, so both live in a world-readable directory."""
    need_root_or_skip("creating device nodes (mknod) and switching to an unprivileged user")
    base = Path(tempfile.mkdtemp(prefix="fdl-test-root-"))
    try:
        os.chmod(base, 0o755)
        (base / "lib").mkdir()
        shutil.copy2(fake_nvml.lib_dir / "libnvidia-ml.so.1", base / "lib")
        root = make_host_root(base / "host", root_only=("nvidia0",))
        check = probe("H100:9.0:80G", root=root, user=65534, env={"LD_LIBRARY_PATH": str(base / "lib")})[
            "device_nodes"]
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    assert check["status"] == "error"
    assert "This user (uid 65534) cannot open /dev/nvidia0 for reading and writing" in check["message"]
    assert "group" in check["hint"]


# ---- driver CUDA against the libtorch build ----

@pytest.mark.parametrize("cuda, severity, words", [
    (11080, "error", "supports CUDA 11.8, but libtorch cu128 is built for CUDA 12.8"),
    (12040, "warning", "minor-version compatibility"),
    (12080, "ok", "supports CUDA 12.8; libtorch cu128 is built for CUDA 12.8"),
    (13000, "ok", "supports CUDA 13.0"),
])
def test_driver_cuda_against_the_libtorch_build(probe, cuda: int, severity: str, words: str) -> None:
    check = probe("H100:9.0:80G", cuda=cuda)["cuda_driver"]
    assert check["status"] == severity and words in check["message"], check["message"]
    if severity != "ok":
        assert "driver 570.26 or newer" in check["hint"]


def test_a_cpu_libtorch_has_no_cuda_to_compare(probe, tmp_path: Path) -> None:
    cpu = make_libtorch(tmp_path / "cpu", "", cuda="none", archs="cpu")
    check = probe("H100:9.0:80G", libtorch_path=str(cpu))["cuda_driver"]
    assert check["status"] == "skipped" and "cpu libtorch build" in check["message"]


# ---- no NVML: every GPU check says why it did not run ----

def test_without_nvml_the_health_checks_skip(probe) -> None:
    checks = probe("init-fail:9")
    for name in ("gpu_count", "gpu_persistence", "gpu_ecc", "gpu_retired_memory", "gpu_pcie", "gpu_throttle",
                 "gpu_mig", "device_nodes", "cuda_driver"):
        assert status(checks, name) == "skipped", name
    assert status(checks, "gpu") == "error"


# ---- a CPU host: the ranks are CPU ranks, so nothing GPU-only is judged ----

GPU_ONLY = ("gpu", "nccl", "gpu_count", "gpu_persistence", "gpu_ecc", "gpu_retired_memory", "gpu_pcie",
            "gpu_throttle", "gpu_mig", "nouveau", "device_nodes", "cuda_driver")


@pytest.mark.parametrize("nvml", ["none", "init-fail:9", "A100:8.0:40G:mig=on:ecc_vol=3"])
def test_a_cpu_host_skips_every_gpu_check_with_its_reason_and_passes(probe, tmp_path: Path, nvml: str) -> None:
    """No GPU, a driver that does not start, or a faulty GPU the CPU ranks will not use: all the same to it."""
    cpu = make_libtorch(tmp_path / "cpu", "", cuda="none", archs="cpu")
    checks = probe(nvml, local_devices="cpu:2", libtorch_path=str(cpu))
    for name in GPU_ONLY:
        check = checks[name]
        assert check["status"] == "skipped", (name, check)
        assert check["data"]["cpu_host"] is True and check["data"]["declared"] == "cpu:2"
        assert check["message"].startswith("Not checked: ") and "\n" not in check["message"]
    assert checks["gpu"]["message"] == ("Not checked: this host runs CPU ranks (cpu:2), which need no GPU or "
                                        "NVIDIA driver.")
    assert checks["nccl"]["message"] == "Not checked: CPU ranks talk over gloo; NCCL is not used."
    assert checks["gpu_mig"]["message"] == "Not checked: a CPU host (cpu:2) uses no GPU."
    assert checks["libtorch"]["status"] == "ok" and checks["libtorch"]["data"]["kind"] == "cpu"
    assert {n: c["status"] for n, c in checks.items() if n not in GPU_ONLY} == {"libtorch": "ok", "data": "skipped"}


def test_a_cpu_host_still_needs_a_libtorch(probe, tmp_path: Path) -> None:
    checks = probe("none", local_devices="cpu:1", libtorch_path=str(tmp_path / "nowhere"))
    assert checks["libtorch"]["status"] == "error"
    assert checks["gpu"]["status"] == "skipped"


@pytest.mark.parametrize(("nvml", "words"), [
    ("none", "reports no GPU on this host"),
    ("init-fail:9", "The NVIDIA kernel driver is not loaded."),
])
def test_a_host_that_declares_gpus_and_has_none_still_fails(probe, nvml: str, words: str) -> None:
    checks = probe(nvml, local_devices="0")
    assert checks["gpu"]["status"] == "error" and words in checks["gpu"]["message"]
    assert "cpu_host" not in checks["gpu"]["data"]
    if nvml == "none":
        assert checks["gpu_count"]["status"] == "error"
        assert "fdl probe --cpu" in checks["gpu"]["hint"]  # the way out for a box that trains on CPU ranks
