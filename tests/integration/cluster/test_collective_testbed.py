"""The all-reduce smoke test across testbed hosts: 3 namespace hosts x 2 CPU ranks (gloo) over real veths.

Each host's ranks run under the rank supervisor inside the host's network
namespace, started the way a dispatcher would start them (the standalone
supervisor and rank script, a JSON spec, the torch.distributed environment).
The test harness starts them with `ip netns exec` rather than through the
launcher's dispatch, which is a separate piece of work; everything below that
(supervisor, gloo over the bridge, the aggregation) is the real thing. One
host's link is then rate-limited with a qdisc on its bridge-side veth (netem
when the kernel has it, else tbf: both are real shapers), and the aggregation
must name it as the straggler.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading

import pytest

from fdl.collective.results import aggregate, format_rows, parse_line, to_check
from fdl.collective.run import SCRIPT, CollectiveOptions, script_argv
from tests.testbed import Testbed

pytestmark = [pytest.mark.testbed(hosts=3), pytest.mark.slow]
RANKS_PER_HOST = 2
SUPERVISOR = SCRIPT.parent.parent / "agent" / "supervisor.py"
ECHO = re.compile(r"^\[[^/\]]+/(\d+)\] (.*)$")  # the supervisor's "[label/rank] line"


def run_across(bed: Testbed, options: CollectiveOptions, port: int, exchange_bytes: int) -> list[dict]:
    """Start every host's ranks in its namespace at once; return every rank's events."""
    shared = bed.shared / "collective"
    shared.mkdir(exist_ok=True)
    for source in (SCRIPT, SUPERVISOR):
        shutil.copy2(source, shared / source.name)
    argv = script_argv(options, str(shared / SCRIPT.name))
    argv[argv.index("--exchange-bytes") + 1] = str(exchange_bytes)
    world = len(bed.hosts) * RANKS_PER_HOST
    master = bed.hosts[0].address
    events: list[dict] = []
    lock = threading.Lock()
    procs = []
    for node, host in enumerate(bed.hosts):
        ranks = []
        for local in range(RANKS_PER_HOST):
            rank = node * RANKS_PER_HOST + local
            ranks.append({"rank": rank, "env": {
                "MASTER_ADDR": master, "MASTER_PORT": str(port), "WORLD_SIZE": str(world), "RANK": str(rank),
                "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(RANKS_PER_HOST), "FDL_HOST": host.name,
                "FDL_BACKEND": "gloo", "GLOO_SOCKET_IFNAME": "eth0", "CUDA_VISIBLE_DEVICES": ""}})
        spec = shared / f"{host.name}.json"
        spec.write_text(json.dumps({"argv": argv, "ranks": ranks, "label": host.name, "grace_s": 2}))
        procs.append(subprocess.Popen(["ip", "netns", "exec", host.namespace, sys.executable, str(shared /
                                       SUPERVISOR.name), str(spec)], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, stdin=subprocess.PIPE, text=True))
        # stdin stays open while we wait: the supervisor tears its ranks down when it closes (as when a
        # dispatcher's ssh connection drops)

    def pump(proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            match = ECHO.match(line.rstrip("\n"))
            event = parse_line(match[2]) if match else None
            if event is not None:
                with lock:
                    events.append(event)

    pumps = [threading.Thread(target=pump, args=(p,), daemon=True) for p in procs]
    for thread in pumps:
        thread.start()
    try:
        for proc in procs:
            proc.wait(timeout=options.time_limit_s)
    finally:
        for proc in procs:
            proc.stdin.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for thread in pumps:
        thread.join(timeout=5)
    for proc in procs:
        proc.stdout.close()
    return events


def throttle(veth: str) -> str:
    """Rate-limit traffic into a host (its bridge-side veth leg); return the qdisc used."""
    for qdisc in (["netem", "rate", "40mbit"], ["tbf", "rate", "40mbit", "burst", "32kbit", "latency", "2s"]):
        done = subprocess.run(["tc", "qdisc", "add", "dev", veth, "root", *qdisc], capture_output=True, text=True)
        if done.returncode == 0:
            return qdisc[0]
        if "unknown" not in done.stderr.lower():
            raise AssertionError(f"tc failed: {done.stderr}")
    raise AssertionError("this kernel has neither the netem nor the tbf qdisc")


def test_three_hosts_two_ranks_each_report_bandwidth_rows(testbed: Testbed) -> None:
    options = CollectiveOptions(time_limit_s=120, max_bytes=1 << 20)
    result = aggregate(run_across(testbed, options, port=24400, exchange_bytes=1 << 20))
    check = to_check(result)
    assert check.status == "ok", check.message
    assert result.world_size == 6 and result.backend == "gloo"
    assert result.hosts == {"h1": [0, 1], "h2": [2, 3], "h3": [4, 5]}
    assert [r.bytes for r in result.rows] == [(8 << 10) << i for i in range(8)]
    assert all(r.busbw_gbs == pytest.approx(r.algbw_gbs * 2 * 5 / 6, abs=2e-4) for r in result.rows)
    assert set(result.host_bandwidth_gbs) == {"h1", "h2", "h3"} and result.stragglers == []


def test_a_rate_limited_host_is_flagged_as_the_straggler(testbed: Testbed) -> None:
    slow = testbed.hosts[2]
    qdisc = throttle(slow.veth)
    try:
        options = CollectiveOptions(time_limit_s=180, max_bytes=256 << 10)
        result = aggregate(run_across(testbed, options, port=24401, exchange_bytes=1 << 20))
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", slow.veth, "root"], capture_output=True)
    check = to_check(result)
    assert result.finished, (qdisc, check.message)
    assert result.stragglers == [slow.name], (qdisc, result.host_bandwidth_gbs)
    assert check.status == "warning" and f"Straggler: {slow.name} (" in check.message
    assert result.slowest_rank in result.hosts[slow.name]
    assert format_rows(result)[-1].endswith(" STRAGGLER")
