"""`fdl join` end to end on loopback: a real controller, agents as real processes, gloo CPU ranks.

Everything here is real: the controller endpoint (aiohttp, in a thread of the
test process), `fdl join` started as a user would start it, the rank
supervisor, and a PyTorch gloo job across the agents' ranks. Refusals that
need a non-loopback peer (a bad token) are in test_join_testbed.py.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.conftest import need_root_or_skip
from tests.integration.join.helpers import (
    Lines,
    controller,
    finish,
    policy,
    results,
    spawn_join,
    terminate,
    train_binary,
    wait_for,
)
from tests.join_util import SmallDisk, free_port, write_program

pytestmark = pytest.mark.slow


def test_two_agents_form_a_world_train_and_exit_zero(tmp_path):
    binary = train_binary(tmp_path)
    with controller(policy(max_hosts=2, window_s=60, args=("--ignored",))) as server:
        addr = server.address
        a = spawn_join(addr, "--bin", str(binary), "--host", "alpha", "--devices", "cpu:2", "--gpu-ram-share", "0.5",
                       "--", "--epochs", "2", home=tmp_path / "a")
        b = spawn_join(addr, "--bin", str(binary), "--host", "beta", "--devices", "cpu:1", "--", "--epochs", "2",
                       home=tmp_path / "b")
        code_a, out_a, err_a = finish(a)
        code_b, out_b, err_b = finish(b)
        assert (code_a, code_b) == (0, 0), err_a + err_b
        state = server.state()
    ranks = results(out_a) + results(out_b)
    assert sorted(int(r["rank"]) for r in ranks) == [0, 1, 2]
    assert all(r["size"] == "3" and r["sum"] == "6" and r["args"] == "--epochs,2" for r in ranks)
    assert {r["host"] for r in results(out_a)} == {"alpha"}
    assert {r["share"] for r in results(out_a)} == {"0.5"} and {r["share"] for r in results(out_b)} == {"None"}
    assert "[alpha/" in out_a and "[beta/" in out_b  # rank output is labelled host/rank
    assert state["phase"] == "done"
    assert sorted((m["host"], m["exit_code"], m["signature"]) for m in state["roster"]) == [
        ("alpha", 0, "ab12cd34ef56ab12"), ("beta", 0, "ab12cd34ef56ab12")]
    assert "admitted by" in err_a and "world formed: 3 ranks on 2 hosts" in err_a
    logs = list((tmp_path / "a" / ".flodl" / "join" / "logs").glob("*/rank-1.log"))
    assert logs and "RESULT rank=1" in logs[0].read_text()


def test_one_shot_passes_the_agents_code_through_verbatim(tmp_path):
    binary = train_binary(tmp_path)
    with controller(policy(max_hosts=1, window_s=60)) as server:
        proc = spawn_join(server.address, "--bin", str(binary), "--host", "solo", "--devices", "cpu:1",
                          home=tmp_path / "h", env={"TEST_EXIT_RANK_0": "2"})
        code, _, err = finish(proc)
        state = server.state()
    assert code == 2  # the training binary's own 2, not fdl's permanent class
    assert "ranks finished: exit 2" in err
    assert state["phase"] == "failed" and state["roster"][0]["exit_code"] == 2


def test_a_different_run_id_is_refused_with_the_controllers_reason(tmp_path):
    binary = train_binary(tmp_path)
    with controller(policy(run_id="0123456789abcdef0123", window_s=60)) as server:
        proc = spawn_join(server.address, "--bin", str(binary), "--host", "h1", "--devices", "cpu:1",
                          home=tmp_path / "h")
        code, _, err = finish(proc)
        state = server.state()
    assert code == 1
    assert "refused this box (run_id_differs)" in err and "differs from the cohort" in err
    assert state["refusals"] == {"run_id_differs": 1} and state["roster"] == []


def test_a_different_signature_is_refused_and_a_stopped_agent_leaves_the_window(tmp_path):
    binary = train_binary(tmp_path)
    with controller(policy(start="manual", window_s=60)) as server:
        first = spawn_join(server.address, "--bin", str(binary), "--host", "h1", "--devices", "cpu:1",
                           home=tmp_path / "h1")
        wait_for(lambda: server.state()["roster"], what="the first agent's admission")
        other = spawn_join(server.address, "--bin", str(binary), "--host", "h2", "--devices", "cpu:1",
                           home=tmp_path / "h2", env={"TEST_SIGNATURE": "ffffffffffffffff"})
        code, _, err = finish(other)
        assert code == 1
        assert "refused this box (signature_differs)" in err and "builds a different model" in err
        os.killpg(first.pid, signal.SIGTERM)
        code, _, err = finish(first)
        assert code == -signal.SIGTERM and "stopped by SIGTERM" in err  # it dies of the signal it got
        state = server.state()
    assert state["roster"] == []  # it reported its exit before the world formed: the roster stays true
    assert state["departed"][0]["host"] == "h1"


def test_sigterm_while_ranks_run_stops_them_reports_and_dies_of_the_signal(tmp_path):
    """Regression: a SIGTERM landing while the agent waited on its rank thread marked that thread finished
    (CPython's Thread.join, interrupted by a signal handler's exception, releases a lock the running thread
    holds), so the agent crashed with an IndexError and exited 1: under systemd, `systemctl stop` then
    counted as a failure."""
    holder = write_program(tmp_path / "hold", """
import os, sys, time
if os.environ.get("FDL_SIGNATURE_PROBE") == "1":
    sys.exit(0)
print("holding", flush=True)
while True:
    time.sleep(0.2)
""")
    with controller(policy(max_hosts=1, window_s=60)) as server:
        proc = spawn_join(server.address, "--persist", "--bin", str(holder), "--host", "h1", "--devices", "cpu:1",
                          home=tmp_path / "h1")
        try:
            wait_for(lambda: server.state()["phase"] == "training", timeout=60, what="the rank to run")
            wait_for(lambda: list((tmp_path / "h1").rglob("rank-0.log"))
                     and "holding" in next((tmp_path / "h1").rglob("rank-0.log")).read_text(), what="its output")
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
        code, _, err = finish(proc)
        state = server.state()
    assert code == -signal.SIGTERM, err  # it dies of the signal it got: a clean stop to systemd
    assert "internal error" not in err and "stopped by SIGTERM" in err, err
    assert "ranks finished: exit 143 (the agent was stopped (signal 15))" in err, err
    assert state["roster"][0]["exit_code"] == 143  # the controller heard of it


def test_a_closed_window_is_refused_transiently(tmp_path):
    binary = train_binary(tmp_path)
    with controller(policy(max_hosts=1, window_s=60)) as server:
        first = spawn_join(server.address, "--bin", str(binary), "--host", "h1", "--devices", "cpu:1",
                           home=tmp_path / "h1")
        assert finish(first)[0] == 0
        late = spawn_join(server.address, "--bin", str(binary), "--host", "h2", "--devices", "cpu:1",
                          home=tmp_path / "h2")
        code, _, err = finish(late)
    assert code == 1 and "refused this box (window_closed)" in err and "already closed" in err


def test_controller_down_one_shot_exits_1_and_persist_redials_until_it_joins(tmp_path):
    binary = train_binary(tmp_path)
    port = free_port()
    one_shot = spawn_join(f"127.0.0.1:{port}", "--bin", str(binary), "--host", "h1", "--devices", "cpu:1",
                          home=tmp_path / "one")
    code, _, err = finish(one_shot)
    assert code == 1 and "no run listening at 127.0.0.1:" in err

    persist = spawn_join(f"127.0.0.1:{port}", "--persist", "--bin", str(binary), "--host", "h1", "--devices",
                         "cpu:1", home=tmp_path / "persist")
    lines = Lines(persist)
    try:
        wait_for(lambda: lines.count("re-dialing in") >= 2, timeout=60, what="two re-dials")
        assert persist.poll() is None
        with controller(policy(max_hosts=1, window_s=60), port=port) as server:
            wait_for(lambda: server.state()["phase"] == "done", timeout=90, what="the run to finish")
            state = server.state()
        assert state["roster"][0]["host"] == "h1" and state["roster"][0]["exit_code"] == 0
        wait_for(lambda: lines.count("the agent exited 0; re-dialing"), timeout=30, what="the re-dial after 0")
        assert persist.poll() is None  # a clean finish re-dials too
    finally:
        code = terminate(persist, lines)
    assert code == -signal.SIGTERM  # after a clean stop, it dies of the signal it got
    assert lines.count("transient failure: no run listening") >= 2


def test_no_gpu_is_permanent_and_persist_stops(tmp_path, fake_nvml):
    binary = train_binary(tmp_path)
    for extra in ((), ("--persist",)):
        proc = spawn_join("127.0.0.1:1", *extra, "--bin", str(binary), "--host", "h1", home=tmp_path / "h",
                          env=fake_nvml.env(""))
        code, _, err = finish(proc, timeout=60)
        assert code == 2, err
        assert "the GPU stack check failed" in err and "reports no GPU" in err and "--devices cpu:N" in err
        assert "re-dialing" not in err


def test_a_missing_binary_is_permanent(tmp_path):
    proc = spawn_join("127.0.0.1:1", "--persist", "--bin", str(tmp_path / "nope"), "--devices", "cpu:1",
                      home=tmp_path / "h")
    code, _, err = finish(proc, timeout=60)
    assert code == 2 and "is not on this box" in err


def test_a_read_only_stage_is_permanent(tmp_path):
    need_root_or_skip("mounts a read-only tmpfs for the stage")
    binary = train_binary(tmp_path)
    with SmallDisk(tmp_path / "ro", read_only=True) as disk:
        proc = spawn_join("127.0.0.1:1", "--persist", "--bin", str(binary), "--devices", "cpu:1",
                          home=tmp_path / "h", env={"FDL_JOIN_STAGE": str(disk.path / "stage")})
        code, _, err = finish(proc, timeout=60)
    assert code == 2 and "is not writable by this user" in err and "EROFS" in err
    assert "re-dialing" not in err


def test_a_file_in_the_stages_way_is_transient(tmp_path):
    # not the worker's own permissions: whoever put it there (in a shared directory, anyone) must not power it off
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the stage must go")
    binary = train_binary(tmp_path)
    proc = spawn_join("127.0.0.1:1", "--bin", str(binary), "--devices", "cpu:1", home=tmp_path / "h",
                      env={"FDL_JOIN_STAGE": str(blocker / "stage")})
    code, _, err = finish(proc, timeout=60)
    assert code == 1 and "is not writable" in err and "ENOTDIR" in err and "next dial" in err


def test_a_failure_elsewhere_stops_this_hosts_ranks(tmp_path):
    """b's rank dies before the world is up; a's rank would wait in gloo's rendezvous for half an hour,
    but the controller marks the run failed and a's heartbeat stops it."""
    binary = train_binary(tmp_path)
    with controller(policy(max_hosts=2, window_s=60)) as server:
        a = spawn_join(server.address, "--bin", str(binary), "--host", "a", "--devices", "cpu:1", home=tmp_path / "a")
        wait_for(lambda: server.state()["roster"], what="a's admission")
        b = spawn_join(server.address, "--bin", str(binary), "--host", "b", "--devices", "cpu:1", home=tmp_path / "b",
                       env={"TEST_EARLY_EXIT": "3"})
        code_b, _, _ = finish(b)
        code_a, _, err_a = finish(a, timeout=90)
        state = server.state()
    assert code_b == 3
    assert code_a == 1, err_a  # stopped from outside: a failure a re-dial can mend
    assert "the run failed (host b exited 3" in err_a and "stopping this host's ranks" in err_a
    assert "ranks finished: exit 1 (ranks terminated)" in err_a
    assert state["phase"] == "failed"


def test_a_golden_image_boots_into_a_bare_fdl_join(tmp_path):
    """Every option from the join: block; a `--` with nothing after it still overrides the block's args."""
    binary = train_binary(tmp_path)
    project = tmp_path / "worker"
    project.mkdir()
    with controller(policy(max_hosts=1, window_s=60)) as server:
        (project / "fdl.yml").write_text(
            f"join:\n  controller: {server.address}\n  bin: {binary}\n  devices: cpu:1\n  host: golden\n"
            f"  gpu_ram_share: 0.25\n  args: [--from-block, '1']\n")
        code, out, err = finish(spawn_join(home=tmp_path / "h", cwd=project))
        assert code == 0, err
        first = results(out)[0]
    assert first["args"] == "--from-block,1" and first["share"] == "0.25" and first["host"] == "golden"
    with controller(policy(max_hosts=1, window_s=60)) as server:
        code, out, err = finish(spawn_join(server.address, "--", home=tmp_path / "h", cwd=project))
        assert code == 0, err
    assert results(out)[0]["args"] == ""


def test_a_join_block_that_does_not_parse_is_permanent(tmp_path):
    project = tmp_path / "worker"
    project.mkdir()
    (project / "fdl.yml").write_text("join:\n  controller: 10.0.0.1:1337\n  persist: sometimes\n")
    code, _, err = finish(spawn_join(home=tmp_path / "h", cwd=project), timeout=60)
    assert code == 2 and "join.persist" in err and "true or false" in err


RESTART_PROBE = r'''
import os, sys
if os.environ.get("FDL_SIGNATURE_PROBE") == "1":
    print("fdl-signature: ab12cd34ef56ab12", flush=True)
    sys.exit(0)
with open(os.environ["TEST_RESTART_LOG"], "a") as log:
    log.write(" ".join(os.environ.get(k, "-") for k in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                                                         "TORCHELASTIC_MAX_RESTARTS")) + "\n")
'''


def test_torchruns_restart_pair_counts_persist_redials_into_the_same_run(tmp_path):
    from tests.join_util import write_program

    program = write_program(tmp_path / "probe", RESTART_PROBE)
    log = tmp_path / "restarts.log"
    env = {"TEST_RESTART_LOG": str(log)}
    port = free_port()
    one_shot = spawn_join(f"127.0.0.1:{port}", "--bin", str(program), "--host", "h1", "--devices", "cpu:1",
                          home=tmp_path / "one", env=env)
    with controller(policy(max_hosts=1, window_s=60, launch_id="job-0"), port=port):
        assert finish(one_shot)[0] == 0
    persist = spawn_join(f"127.0.0.1:{port}", "--persist", "--bin", str(program), "--host", "h1", "--devices",
                         "cpu:1", home=tmp_path / "persist", env=env)
    lines = Lines(persist)
    try:
        for n, run in enumerate(("job-a", "job-a", "job-b"), start=1):  # the same run twice, then another
            with controller(policy(max_hosts=1, window_s=60, launch_id=run), port=port) as server:
                wait_for(lambda: server.state()["phase"] == "done", timeout=90, what=f"run {n} to finish")
            wait_for(lambda n=n: lines.count("the agent exited 0; re-dialing") >= n, timeout=30,
                     what=f"the re-dial after run {n}")
    finally:
        terminate(persist, lines)
    unbounded = str(2**31 - 1)  # --persist never stops re-dialing; torchrun's maximum is an integer
    assert log.read_text().splitlines() == ["job-0 0 0", f"job-a 0 {unbounded}", f"job-a 1 {unbounded}",
                                            f"job-b 0 {unbounded}"]
