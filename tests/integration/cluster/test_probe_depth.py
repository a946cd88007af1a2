"""GPU health, software stack and cross-host consistency over the testbed: the fdl_probe Ansible module
runs the check library on real sshd hosts, as their own unprivileged users, against scripted faults (the
fake NVML and a scripted host root through each worker's env:)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_fdl
from tests.fakes import make_host_root

pytestmark = [pytest.mark.testbed(hosts=4), pytest.mark.slow]
FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")  # Debian package libfaketime


def probe(project: Path, env: dict, *args: str):
    done = run_fdl("@cluster", "probe", *args, cwd=project, env=env, timeout=240)
    doc = json.loads(done.stdout) if "--json" in args and done.stdout.strip() else None
    return done, doc


def statuses(doc: dict) -> dict:
    return {h["host"]: {c["name"]: c["status"] for c in h["checks"]} for h in doc["hosts"]}


def messages(doc: dict, host: str, check: str) -> str:
    report = next(h for h in doc["hosts"] if h["host"] == host)
    return next(c for c in report["checks"] if c["name"] == check)["message"]


def cluster(doc: dict) -> dict:
    return {c["name"]: c for c in doc["cluster"]}


def test_gpu_faults_surface_with_their_severity_on_each_host(kit, short_tmp, testbed_home):
    workers = kit.workers(
        h2={"env": kit.worker_env("H100:9.0:80G:ecc_vol=2:persist=0")},
        h3={"env": kit.worker_env("A100:8.0:40G:mig=on:throttle=0x88"), "local_devices": [0]},
        h4={"env": kit.worker_env("H100:9.0:80G:pcie=4.8/4.16"), "local_devices": [0, 1]},
    )
    done, doc = probe(kit.project(short_tmp / "proj", workers), testbed_home, "--json")
    assert done.returncode == 1, done.stderr
    got = statuses(doc)
    assert {n for n, s in got["h1"].items() if s in ("error", "warning")} == set()
    assert (got["h2"]["gpu_ecc"], got["h2"]["gpu_persistence"]) == ("error", "warning")
    assert "2 uncorrectable ECC errors since the driver loaded" in messages(doc, "h2", "gpu_ecc")
    assert (got["h3"]["gpu_mig"], got["h3"]["gpu_throttle"]) == ("error", "warning")
    assert "HW slowdown, HW power brake" in messages(doc, "h3", "gpu_throttle")
    assert (got["h4"]["gpu_count"], got["h4"]["gpu_pcie"]) == ("error", "warning")
    assert messages(doc, "h4", "gpu_count") == "local_devices declares GPU 1, but NVML sees 1 usable GPU (0)."
    assert [h["ok"] for h in doc["hosts"]] == [True, False, False, False]

    human = run_fdl("@cluster", "probe", cwd=kit.project(short_tmp / "proj", workers), env=testbed_home,
                    timeout=240)
    assert "h2: NOT READY (1 error, 1 warning)" in human.stdout
    assert "ERROR    gpu_mig" in human.stdout and "hint: turn MIG off" in human.stdout
    assert "gpu_ecc" not in human.stdout.split("h3:")[1].split("h4:")[0]  # green checks stay hidden


def test_strict_makes_a_warning_fail_the_cluster_gate(kit, short_tmp, testbed_home):
    """Regression (issue 38 item 8), `fdl @cluster probe`: one host's warning (persistence mode off) leaves the
    cluster ready and the exit 0; --strict fails the gate on it, in the human report and in --json (whose
    top-level `ok` then matches the exit code)."""
    project = kit.project(short_tmp / "proj", kit.workers(h2={"env": kit.worker_env("H100:9.0:80G:persist=0")}))
    done, doc = probe(project, testbed_home, "--json")
    assert done.returncode == 0, done.stderr
    assert doc["ok"] is True and "strict" not in doc
    assert statuses(doc)["h2"]["gpu_persistence"] == "warning"
    done, doc = probe(project, testbed_home, "--json", "--strict")
    assert done.returncode == 1, done.stderr
    assert (doc["ok"], doc["strict"]) == (False, True)
    assert [h["ok"] for h in doc["hosts"]] == [True, True, True, True]  # each host's own verdict is unchanged
    human = run_fdl("@cluster", "probe", "--strict", cwd=project, env=testbed_home, timeout=240)
    assert human.returncode == 1
    assert "h2: ready (1 warning)" in human.stdout
    assert "fdl: --strict: 1 warning fails the gate (exit 1)" in human.stderr


def test_stack_faults_on_real_unprivileged_hosts(kit, short_tmp, testbed_home):
    """A host root per fault: nouveau loaded; a GPU node owned by root with mode 0600, which the host's
    own user (not root) cannot open; a missing nvidia-uvm node."""
    roots = kit.bed.shared / "roots"
    nouveau = make_host_root(roots / "nouveau", nouveau=True)
    locked = make_host_root(roots / "locked", root_only=("nvidia0",))
    no_uvm = make_host_root(roots / "no-uvm", missing=("nvidia-uvm",))
    subprocess.run(["chmod", "-R", "a+rX", str(roots)], check=True)
    os.chmod(locked / "dev" / "nvidia0", 0o600)
    workers = kit.workers(
        h2={"env": kit.worker_env(FDL_PROBE_ROOT=str(nouveau))},
        h3={"env": kit.worker_env(FDL_PROBE_ROOT=str(locked))},
        h4={"env": kit.worker_env(FDL_PROBE_ROOT=str(no_uvm))},
    )
    done, doc = probe(kit.project(short_tmp / "proj", workers), testbed_home, "--json")
    got = statuses(doc)
    assert (got["h1"]["nouveau"], got["h1"]["device_nodes"]) == ("ok", "ok")
    assert got["h2"]["nouveau"] == "error"
    assert got["h3"]["device_nodes"] == "error"
    uid = pwd.getpwnam(kit.bed.host("h3").user).pw_uid
    assert f"This user (uid {uid}) cannot open /dev/nvidia0 for reading and writing" in messages(
        doc, "h3", "device_nodes")
    assert got["h4"]["device_nodes"] == "warning"
    assert "/dev/nvidia-uvm is missing" in messages(doc, "h4", "device_nodes")
    assert done.returncode == 1


def test_driver_skew_mixed_models_and_a_fast_clock_are_reported(kit, short_tmp, testbed_home):
    assert FAKETIME.exists(), "libfaketime is missing: scripts/test.sh installs it (scripts/apt-test.txt)"
    workers = kit.workers(
        h2={"env": kit.worker_env(FDL_FAKE_NVML_DRIVER="550.54.15")},
        h3={"env": kit.worker_env(LD_PRELOAD=str(FAKETIME), FAKETIME="+90s")},
        h4={"env": kit.worker_env("RTX3090:8.6:24G")},
    )
    project = kit.project(short_tmp / "proj", workers)
    done, doc = probe(project, testbed_home, "--json")
    assert done.returncode == 0, done.stdout  # warnings and reports do not block
    checks = cluster(doc)
    assert checks["driver_match"]["status"] == "warning"
    assert "570.133.20 on h1, h3, h4; 550.54.15 on h2" in checks["driver_match"]["message"]
    skew = checks["clock_skew"]
    assert skew["status"] == "warning" and "The clock of h3 is" in skew["message"]
    assert 80 < skew["data"]["offsets"]["h3"]["offset_s"] < 100
    assert abs(skew["data"]["offsets"]["h1"]["offset_s"]) < 5
    models = checks["gpu_models"]
    assert models["status"] == "ok" and models["data"]["heterogeneous"] is True
    assert "h4: 1x RTX3090 (sm_86)" in models["message"]

    human = run_fdl("@cluster", "probe", cwd=project, env=testbed_home, timeout=240)
    assert human.returncode == 0
    block = human.stdout[human.stdout.index("cross-host checks:"):]
    assert "  warning  driver_match    NVIDIA driver versions differ across hosts (570.133.20 on h1, h3, h4; " \
           "550.54.15 on h2)." in block
    assert "  warning  clock_skew      The clock of h3 is" in block
    assert "hint: synchronise every host's clock with NTP" in human.stdout
    assert human.stdout.strip().endswith("cluster: ready: 4 hosts, with the warnings above")


def test_a_mixed_rig_alone_is_a_note_on_a_green_cluster(kit, short_tmp, testbed_home):
    workers = kit.workers(h4={"env": kit.worker_env("RTX3090:8.6:24G")})
    human = run_fdl("@cluster", "probe", cwd=kit.project(short_tmp / "proj", workers), env=testbed_home,
                    timeout=240)
    assert human.returncode == 0, human.stdout
    assert "  ok       gpu_models      Heterogeneous GPUs (h1: 1x H100 (sm_90); h2: 1x H100 (sm_90); h3: 1x " \
           "H100 (sm_90); h4: 1x RTX3090 (sm_86))" in human.stdout
    assert human.stdout.strip().endswith("cluster: ready: 4 hosts, hosts agree on NCCL, libtorch, data, driver "
                                         "and clocks")
