"""The all-reduce smoke test for real: PyTorch CPU ranks (gloo) under the rank supervisor on this host."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from fdl.collective.results import to_check
from fdl.collective.run import CollectiveOptions, local_ranks, run_local, run_ranks_here
from tests.conftest import run_fdl
from tests.controller_util import free_port
from tests.fakes import make_libtorch

pytestmark = pytest.mark.slow


def test_two_cpu_ranks_report_bandwidth_rows() -> None:
    result = run_local(None, 2, CollectiveOptions(time_limit_s=90, max_bytes=1 << 20), host="node-a",
                       port=free_port(span=(24200, 24300)))
    check = to_check(result)
    assert check.status == "ok", check.message
    assert (result.world_size, result.backend, result.hosts) == (2, "gloo", {"node-a": [0, 1]})
    assert [r.bytes for r in result.rows] == [8 << 10 << i for i in range(8)]  # 8 KiB .. 1 MiB
    assert all(r.busbw_gbs > 0 and r.busbw_gbs == r.algbw_gbs for r in result.rows)  # 2(n-1)/n = 1 for n = 2
    assert result.slowest_rank in (0, 1) and set(result.rank_bandwidth_gbs) == {0, 1}
    assert "All-reduce across 2 ranks on 1 host (gloo): 8 KiB to 1 MiB" in check.message


def test_a_rank_that_never_comes_is_abandoned_at_the_time_limit() -> None:
    """World size 3, two ranks started: the rendezvous waits for the third until the limit strikes."""
    ranks = local_ranks(None, 3, host="node-a", port=free_port(span=(24200, 24300)))[:2]
    result = run_ranks_here(ranks, CollectiveOptions(time_limit_s=8, max_bytes=64 << 10))
    check = to_check(result)
    assert result.abandoned and check.status == "error"
    assert "did not complete: abandoned at the 8 s time limit (0 message sizes done)" in check.message


def test_a_python_without_pytorch_skips_the_host_with_a_warning(tmp_path: Path) -> None:
    wrapper = tmp_path / "python-without-torch"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")  # -S: no site-packages, no torch
    wrapper.chmod(0o755)
    result = run_local(None, 2, CollectiveOptions(time_limit_s=30, python=str(wrapper)), host="node-b",
                       port=free_port(span=(24200, 24300)))
    check = to_check(result)
    assert check.status == "warning" and "PyTorch cannot be imported there: node-b (No module named 'torch')" \
        in check.message


def test_fdl_probe_collective_full_sweep(tmp_path: Path, fake_nvml) -> None:
    make_libtorch(tmp_path / "libtorch", "precompiled/cpu", cuda="none", archs="cpu")
    env = fake_nvml.env("none")  # no GPU: CPU ranks
    result = run_fdl("probe", "--json", "--skip-mount", "--collective", "--collective-devices", "cpu:2",
                     "--collective-timeout", "120", cwd=tmp_path, env=env, timeout=200)
    doc = json.loads(result.stdout)
    collective = doc["checks"][-1]
    assert collective["name"] == "collective" and collective["status"] == "ok", collective["message"]
    rows = collective["data"]["rows"]
    assert [r["bytes"] for r in rows] == [(8 << 10) << i for i in range(14)]  # 8 KiB .. 64 MiB
    assert {"algbw_gbs", "busbw_gbs", "time_us", "slowest_rank"} <= set(rows[0])


def test_fdl_probe_collective_human_table(tmp_path: Path, fake_nvml) -> None:
    make_libtorch(tmp_path / "libtorch", "precompiled/cpu", cuda="none", archs="cpu")
    result = run_fdl("probe", "--skip-mount", "--collective", "--collective-devices", "cpu:2",
                     "--collective-max-size", "64K", cwd=tmp_path, env=fake_nvml.env("none"), timeout=200)
    assert "all-reduce:" in result.stdout and "busbw(GB/s)" in result.stdout
    assert "64 KiB" in result.stdout and "slowest rank: " in result.stdout
    assert "running the all-reduce smoke test" in result.stderr
    assert "OMP_NUM_THREADS" not in result.stderr  # the rank supervisor's notes are not the probe's to print


@pytest.mark.parametrize("args, words", [
    (("--collective-max-size", "3M"), "--collective-max-size '3M': the size must be a power of two"),
    (("--collective-devices", "cpu:0"), "--collective-devices 'cpu:0': cpu:N needs N from 1 to 256"),
])
def test_bad_collective_flags_are_usage_errors(tmp_path: Path, args, words: str) -> None:
    result = run_fdl("probe", "--skip-mount", "--collective", *args, cwd=tmp_path)
    assert result.returncode == 2 and words in result.stderr


def test_check_mode_reports_pytorch_or_exits_3(tmp_path: Path) -> None:
    """What each host runs in its probe before the world forms (the fdl_probe module with collective: true)."""
    import subprocess

    from fdl.collective.run import SCRIPT
    from fdl.hostside.collective.offer import parse_line

    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120,
                          env={"FDL_HOST": "node-a", "PATH": "/usr/bin:/bin"})
    event = next(e for e in map(parse_line, done.stdout.splitlines()) if e)
    assert done.returncode == 0 and event["event"] == "torch" and event["host"] == "node-a"
    assert event["gloo"] is True and event["version"].startswith("2.")
    bare = subprocess.run([sys.executable, "-S", str(SCRIPT), "--check"], capture_output=True, text=True,
                          timeout=60, env={"FDL_HOST": "node-b"})
    event = next(e for e in map(parse_line, bare.stdout.splitlines()) if e)
    assert bare.returncode == 3 and (event["kind"], event["host"]) == ("torch-missing", "node-b")


def test_a_port_taken_before_rank_0_listens_is_replaced(monkeypatch) -> None:
    """The race free_port() cannot close: the port it picked is taken (here: held open) before rank 0 binds it."""
    from fdl.collective import run as collective_run

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    picked = [squatter.getsockname()[1]]
    real_free_port = collective_run.free_port

    def racing_free_port(address: str = "127.0.0.1") -> int:
        port = picked[0] if len(picked) == 1 else real_free_port(address)
        picked.append(port)
        return port

    monkeypatch.setattr(collective_run, "free_port", racing_free_port)
    try:
        result = run_local(None, 2, CollectiveOptions(time_limit_s=90, max_bytes=64 << 10), host="node-a")
    finally:
        squatter.close()
    check = to_check(result)
    assert check.status == "ok", check.message
    assert len(picked) == 3 and picked[1] == picked[0] != picked[2]  # the squatted port, then a fresh one
