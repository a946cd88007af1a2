"""`fdl @cluster probe --collective` across testbed hosts: 3 namespace hosts x 2 CPU ranks (gloo) over real veths.

End to end through the command: the per-host PyTorch check over ssh, the launcher's dispatch (its controller
in-process, staging over Ansible, one ssh session per host running the rank supervisor as the host's own
user) and the aggregation into the cluster report's `collective` check. Ranks run as the host users, who
cannot enter /root: their interpreter is a world-readable venv of /usr/bin/python3 that sees this suite's
torch (tests.integration.launch.helpers.torch_python). One host's link is rate-limited with a qdisc on its
bridge-side veth (netem when the kernel has it, else tbf: both are real shapers), and the report must name
it as the straggler.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_fdl
from tests.controller_util import free_port
from tests.integration.launch.helpers import run_processes, torch_python

pytestmark = [pytest.mark.testbed(hosts=3), pytest.mark.slow]
PORTS = (29400, 29500)  # the probe's controller (and, +1, rank 0's rendezvous): one free now, in this span


@pytest.fixture(scope="module")
def torchpy(testbed) -> Path:
    return torch_python(testbed.shared / "py")


def collective_project(kit, root: Path, torchpy: Path, **per_host: dict) -> Path:
    workers = kit.workers(**{h.name: {"local_devices": "cpu:2", "python": str(torchpy),
                                      "env": kit.worker_env(GLOO_SOCKET_IFNAME="eth0"), **per_host.get(h.name, {})}
                             for h in kit.bed.hosts})
    bed = kit.bed
    return kit.project(root, workers, controller={"host": bed.gateway, "port": free_port(bed.gateway, span=PORTS),
                                                   "bind": bed.gateway})


def probe(project: Path, env: dict, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    done = run_fdl("@cluster", "probe", "--json", "--collective", *args, cwd=project, env=env, timeout=400)
    assert done.stdout.strip(), done.stderr
    doc = json.loads(done.stdout)
    return done, next(c for c in doc["cluster"] if c["name"] == "collective")


def assert_no_ranks_left(bed) -> None:
    left = {host.name: run_processes(host) for host in bed.hosts}
    assert not any(left.values()), f"processes of the smoke test left behind: {left}"


def throttle(veth: str) -> str:
    """Rate-limit traffic into a host (its bridge-side veth leg); return the qdisc used."""
    for qdisc in (["netem", "rate", "40mbit"], ["tbf", "rate", "40mbit", "burst", "32kbit", "latency", "2s"]):
        done = subprocess.run(["tc", "qdisc", "add", "dev", veth, "root", *qdisc], capture_output=True, text=True)
        if done.returncode == 0:
            return qdisc[0]
        if "unknown" not in done.stderr.lower():
            raise AssertionError(f"tc failed: {done.stderr}")
    raise AssertionError("this kernel has neither the netem nor the tbf qdisc")


def test_three_hosts_two_ranks_each_report_bandwidth_rows(kit, torchpy, short_tmp, testbed_home) -> None:
    project = collective_project(kit, short_tmp / "green", torchpy)
    done, check = probe(project, testbed_home, "--collective-max-size", "1M")
    assert check["status"] == "ok", check["message"] + done.stderr
    assert done.returncode == 0, done.stderr
    data = check["data"]
    assert data["world_size"] == 6 and data["backend"] == "gloo"
    assert data["hosts"] == {"h1": [0, 1], "h2": [2, 3], "h3": [4, 5]}
    assert [r["bytes"] for r in data["rows"]] == [(8 << 10) << i for i in range(8)]
    assert all(r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * 2 * 5 / 6, abs=2e-4) for r in data["rows"])
    assert set(data["host_bandwidth_gbs"]) == {"h1", "h2", "h3"} and data["stragglers"] == []
    assert check["message"].startswith("All-reduce across 6 ranks on 3 hosts (gloo): 8 KiB to 1 MiB")
    assert_no_ranks_left(kit.bed)


def test_a_rate_limited_host_is_flagged_as_the_straggler(kit, torchpy, short_tmp, testbed_home) -> None:
    slow = kit.bed.hosts[2]
    project = collective_project(kit, short_tmp / "slow", torchpy)
    qdisc = throttle(slow.veth)
    try:
        done, check = probe(project, testbed_home, "--collective-max-size", "256K", "--collective-timeout", "240")
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", slow.veth, "root"], capture_output=True)
    data = check["data"]
    assert data["completed_ranks"] == 6 and not data["abandoned"], (qdisc, check["message"])
    assert data["stragglers"] == [slow.name], (qdisc, data["host_bandwidth_gbs"])
    assert check["status"] == "warning" and f"Straggler: {slow.name} (" in check["message"]
    assert data["slowest_rank"] in data["hosts"][slow.name]
    assert done.returncode == 0, done.stderr  # a straggler warns; the cluster is still usable
    human = run_fdl("@cluster", "probe", "--collective", "--collective-max-size", "64K", cwd=project,
                    env=testbed_home, timeout=400)
    assert "all-reduce:" in human.stdout and "slowest rank:" in human.stdout, human.stdout + human.stderr
    assert_no_ranks_left(kit.bed)


def test_a_host_without_pytorch_is_skipped_with_a_warning_naming_it(kit, torchpy, short_tmp, testbed_home) -> None:
    project = collective_project(kit, short_tmp / "skip", torchpy, h3={"python": "/usr/bin/python3"})
    done, check = probe(project, testbed_home, "--collective-max-size", "64K")
    assert check["status"] == "warning", check["message"]
    assert "Skipped, PyTorch cannot be imported there: h3 (/usr/bin/python3: " in check["message"]
    assert check["data"]["hosts"] == {"h1": [0, 1], "h2": [2, 3]} and check["data"]["world_size"] == 4
    assert done.returncode == 0, done.stderr
    assert_no_ranks_left(kit.bed)
