"""`fdl status --watch` against a live controller: in a pseudo-terminal (the rich view), through a pipe (plain
lines, NDJSON), across phases, until the endpoint goes away; Ctrl-C; a controller that stops answering."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

import pexpect
import pytest

from fdl.controller.client import ControllerClient
from fdl.controller.policy import RunPolicy
from tests.conftest import fdl_env, run_fdl
from tests.controller_util import TEST_TOKEN, free_port, serving

PORTS = (25000, 25999)  # this suite's ports
WITH_TOKEN = {"FDL_JOIN_TOKEN": TEST_TOKEN}  # the watch proves the run's token (a verdict needs it)


def staging_run():
    return serving(RunPolicy(start="manual", quorum_hosts=2, window_s=600, silence_s=900, run_id="r-watch"),
                   span=PORTS)


def two_agents(server) -> list[str]:
    with ControllerClient(f"127.0.0.1:{server.port}", token=TEST_TOKEN) as client:
        return [client.hello({"host": host, "devices": devices, "run_id": "r-watch", "signature": "9f3c", **extra}
                             )["ticket"]
                for host, devices, extra in (("node-a", "0,1", {"gpu_names": ["NVIDIA H100", "NVIDIA H100"]}),
                                             ("node-b", "cpu:2", {}))]


def fire_and_finish(server, tickets: list[str], codes=(0, 0)) -> None:
    with ControllerClient(f"127.0.0.1:{server.port}", token=TEST_TOKEN) as client:
        for ticket, code in zip(tickets, codes, strict=True):
            client.report_exit(ticket, code)


def watch_in_pty(server, *extra: str, tmp_path: Path) -> pexpect.spawn:
    child = pexpect.spawn(sys.executable, ["-m", "fdl", "status", "--watch", "--addr", f"127.0.0.1:{server.port}",
                                           "--interval", "0.2", *extra],
                          cwd=str(tmp_path), env=fdl_env({"TERM": "xterm-256color", "COLUMNS": "160",
                                                          "LINES": "50", **WITH_TOKEN}),
                          dimensions=(50, 160), encoding="utf-8", timeout=30)
    child.logfile_read = (tmp_path / "pty.log").open("w")
    return child


def test_watch_in_a_terminal_follows_staging_forming_done_and_exits_0_when_the_run_ends(tmp_path: Path) -> None:
    with staging_run() as server:
        tickets = two_agents(server)
        child = watch_in_pty(server, tmp_path=tmp_path)
        try:
            child.expect(": staging ")
            child.expect(r"join window closes in (9m\d\ds|10m00s)")  # the countdown beside its bar
            child.expect("hosts 2/2, 4 ranks")
            child.expect(f"fdl start --addr 127.0.0.1:{server.port}")  # the exact line that fires the switch
            child.expect("node-b")
            with ControllerClient(f"127.0.0.1:{server.port}", token=TEST_TOKEN) as client:
                client.start()
            child.expect(": forming ")
            child.expect("fired by 127.0.0.1")
            fire_and_finish(server, tickets)
            child.expect(": done ")
            server.stop()
            child.expect(rf"run ended: the controller at 127.0.0.1:{server.port} is gone \(last phase: done\)")
            child.expect(pexpect.EOF)
        finally:
            child.close()
            child.logfile_read.close()
        assert child.exitstatus == 0, (tmp_path / "pty.log").read_text()[-3000:]


def test_ctrl_c_stops_watching_with_exit_0_and_the_run_goes_on(tmp_path: Path) -> None:
    with staging_run() as server:
        two_agents(server)
        child = watch_in_pty(server, tmp_path=tmp_path)
        try:
            child.expect(": staging ")
            child.sendintr()
            child.expect("stopped watching")
            child.expect(pexpect.EOF)
        finally:
            child.close()
            child.logfile_read.close()
        assert child.exitstatus == 0
        assert server.state()["phase"] == "staging"


def read_lines_until(proc: subprocess.Popen, needle: str, into: list[str]) -> None:
    for line in proc.stdout:
        into.append(line)
        if needle in line:
            return
    raise AssertionError(f"{needle!r} never came; got {''.join(into)[-2000:]}")


def test_watch_through_a_pipe_prints_a_plain_line_per_look(tmp_path: Path) -> None:
    with staging_run() as server:
        tickets = two_agents(server)
        proc = subprocess.Popen([sys.executable, "-m", "fdl", "status", "--watch", "--addr",
                                 f"127.0.0.1:{server.port}", "--interval", "0.2"], cwd=tmp_path,
                                env=fdl_env(WITH_TOKEN),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        guard = threading.Timer(120, proc.kill)
        guard.start()
        lines: list[str] = []
        try:
            read_lines_until(proc, "phase staging", lines)
            first = lines[-1]
            assert re.search(rf"^\d\d:\d\d:\d\d run r-watch at 127.0.0.1:{server.port}: phase staging; quorum 2/2 "
                             rf"hosts, 4 ranks met; join window closes in (9m\d\ds|10m00s); ", first), first
            assert first.rstrip().endswith(f"switch roster startable, fire with fdl start --addr "
                                           f"127.0.0.1:{server.port}")
            with ControllerClient(f"127.0.0.1:{server.port}", token=TEST_TOKEN) as client:
                client.start()
            read_lines_until(proc, "phase forming", lines)
            fire_and_finish(server, tickets, codes=(0, 3))
            read_lines_until(proc, "phase failed", lines)
            assert "exits node-a=0, node-b=3" in lines[-1] and "reason: host node-b exited 3" in lines[-1]
            server.stop()
            read_lines_until(proc, "run ended", lines)
            assert lines[-1].rstrip().endswith(f"run ended: the controller at 127.0.0.1:{server.port} is gone "
                                               f"(last phase: failed)")
            assert proc.stdout.readline() == "fdl: run r-watch failed: host node-b exited 3.\n"  # the outcome
            assert proc.wait(60) == 1  # and the exit code that matches it
            assert "\x1b[" not in "".join(lines)  # no terminal codes in a log
            assert proc.stderr.read() == ""
        finally:
            guard.cancel()
            proc.kill()
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()


def test_watch_json_streams_one_state_per_line(tmp_path: Path) -> None:
    with staging_run() as server:
        two_agents(server)
        proc = subprocess.Popen([sys.executable, "-m", "fdl", "status", "--watch", "--json", "--addr",
                                 f"127.0.0.1:{server.port}", "--interval", "0.2"], cwd=tmp_path,
                                env=fdl_env(WITH_TOKEN),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        guard = threading.Timer(120, proc.kill)
        guard.start()
        try:
            states = [json.loads(proc.stdout.readline()) for _ in range(3)]
            assert [s["phase"] for s in states] == ["staging"] * 3
            assert [e["host"] for e in states[0]["roster"]] == ["node-a", "node-b"]
            server.stop()
            rest = proc.stdout.read()
            assert proc.wait(60) == 1  # the run went away before it finished: not a success
            assert all(json.loads(line)["phase"] == "staging" for line in rest.splitlines())
            err = proc.stderr.read()
            assert f"fdl: run ended: the controller at 127.0.0.1:{server.port} is gone" in err
            assert "fdl: run r-watch: outcome unknown: its controller went away while the run was staging" in err
        finally:
            guard.cancel()
            proc.kill()
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()


def test_watch_with_no_run_exits_1_and_interval_needs_watch(tmp_path: Path) -> None:
    port = free_port(span=PORTS)
    result = run_fdl("status", "--watch", "--addr", f"127.0.0.1:{port}", cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert f"fdl: no run listening at 127.0.0.1:{port} (connection refused)" in result.stderr
    result = run_fdl("status", "--interval", "2", "--addr", f"127.0.0.1:{port}", cwd=tmp_path)
    assert result.returncode == 2 and "fdl: error: --interval only applies with --watch." in result.stderr


def test_watch_gives_up_on_a_controller_that_stops_answering(tmp_path: Path) -> None:
    """A port that accepts connections and never answers (a hung controller, a black hole on the way)."""
    from fdl.cli.render.status import watch_plain
    from fdl.controller.watch import Watcher

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", free_port(span=PORTS, pairs=False)))
        silent.listen(64)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        out = tmp_path / "watch.log"
        with ControllerClient(address, timeout=0.3) as client, out.open("w") as stream:
            end = watch_plain(Watcher(client, interval=0.05, lost_after_s=0.6), stream)
    lines = out.read_text().splitlines()
    assert end.how == "lost" and end.state is None
    assert lines[0].endswith(f"{address}: no answer: the controller at {address} did not answer within 0.3 s; "
                             f"retrying")
    assert f"lost the controller at {address}: the controller at {address} did not answer within 0.3 s (no " \
           f"answer for " in lines[-1]


def test_plain_status_names_the_start_line_and_imports_no_rich(tmp_path: Path) -> None:
    with staging_run() as server:
        two_agents(server)
        result = run_fdl("status", "--addr", f"127.0.0.1:{server.port}", cwd=tmp_path)
        assert result.returncode == 0
        assert f"switch: roster startable, fire with fdl start --addr 127.0.0.1:{server.port}" in result.stdout
        probe = ("import sys; from fdl.cli.main import main; "
                 f"code = main(['status', '--addr', '127.0.0.1:{server.port}']); "
                 "print(code, sorted({m.split('.')[0] for m in sys.modules} & {'rich', 'prometheus_client', "
                 "'aiohttp'}), file=sys.stderr)")
        result = subprocess.run([sys.executable, "-c", probe], env=fdl_env(), cwd=tmp_path, capture_output=True,
                                text=True, timeout=60)
        assert result.stderr.strip().splitlines()[-1] == "0 []", result.stderr


def test_watch_wait_waits_for_a_run_then_ends_with_its_outcome(tmp_path: Path) -> None:
    """Regression: --watch exited 1 at once when no run was up yet, and never said how the run ended."""
    from fdl.controller.server import ControllerServer

    port = free_port(span=PORTS)
    proc = subprocess.Popen([sys.executable, "-m", "fdl", "status", "--watch", "--wait", "--addr",
                             f"127.0.0.1:{port}", "--interval", "0.2"], cwd=tmp_path, env=fdl_env(WITH_TOKEN),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(120, proc.kill)
    guard.start()
    lines: list[str] = []
    try:
        assert f"no run listening yet at 127.0.0.1:{port}; waiting for one" in proc.stderr.readline()
        assert proc.poll() is None  # still waiting
        server = ControllerServer(RunPolicy(start="manual", quorum_hosts=2, window_s=600, silence_s=900,
                                            run_id="r-watch", token=TEST_TOKEN), port=port).start()
        try:
            tickets = two_agents(server)
            read_lines_until(proc, "phase staging", lines)
            with ControllerClient(f"127.0.0.1:{port}", token=TEST_TOKEN) as client:
                client.start()
            fire_and_finish(server, tickets)
            read_lines_until(proc, "phase done", lines)
        finally:
            server.stop()
        read_lines_until(proc, "run ended", lines)
        assert proc.stdout.readline() == "fdl: run r-watch succeeded: every rank exited 0.\n"
        assert proc.wait(60) == 0
    finally:
        guard.cancel()
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert run_fdl("status", "--wait", "--addr", f"127.0.0.1:{port}", cwd=tmp_path).returncode == 2


def test_the_outcome_of_a_run_whose_end_was_not_seen_comes_from_its_kept_state(tmp_path: Path) -> None:
    from fdl.controller.live import kept_state
    from fdl.controller.watch import WatchEnd, outcome

    end = WatchEnd("ended", {"run_id": "abc123", "phase": "training"}, "run ended")
    assert outcome(end) == ("run abc123: outcome unknown: its controller went away while the run was training "
                            "(its launcher's output says how it ended).", 1)
    kept = tmp_path / ".flodl" / "launch" / "runs" / "abc123"
    kept.mkdir(parents=True)
    (kept / "state.json").write_text(json.dumps({"run_id": "abc123", "phase": "failed", "reason": "rank 1 exited 7"}))
    env = {"HOME": str(tmp_path)}
    assert outcome(end, lambda run: kept_state(run, env)) == ("run abc123 failed: rank 1 exited 7.", 1)
    assert kept_state("../../etc", env) is None  # an id from the wire is never a path


def test_a_kept_state_is_found_by_the_launch_id_and_only_for_the_controller_watched(tmp_path: Path) -> None:
    """A discovery cohort's run id is its walk-ins' (or none): the launcher keeps its final state under its own
    launch id, which state.json names; a kept state of another controller instance is no evidence of this run."""
    from fdl.controller.live import kept_state
    from fdl.controller.watch import WatchEnd, outcome

    env = {"HOME": str(tmp_path)}
    kept = tmp_path / ".flodl" / "launch" / "runs" / "l-42"
    kept.mkdir(parents=True)
    (kept / "state.json").write_text(json.dumps({"run_id": None, "launch_id": "l-42", "controller_id": "c1",
                                                 "phase": "done"}))
    seen = {"run_id": None, "launch_id": "l-42", "controller_id": "c1", "phase": "training"}
    assert outcome(WatchEnd("ended", seen, "run ended"), lambda run: kept_state(run, env)) == (
        "the run succeeded: every rank exited 0.", 0)
    other = {**seen, "controller_id": "c2"}  # the same id on another controller instance (or a stand-in's claim)
    line, code = outcome(WatchEnd("ended", other, "run ended"), lambda run: kept_state(run, env))
    assert code == 1 and "outcome unknown" in line


class Squatter:
    """Whatever binds a run's port between runs (any account may: it is unprivileged): answers GET /join/id and
    GET /state.json with a finished run, unsigned, and reports whether anyone asked with a proof."""

    STATE: ClassVar[dict] = {"schema": 1, "version": 9, "phase": "done", "run_id": "r-squat", "reason": None,
                             "kind": "discovery",
                             "controller": "127.0.0.1", "start": {"mode": "auto"}, "window": {"open": False},
                             "quorum": {"need": {"hosts": 1}, "have": {"hosts": 1, "ranks": 1}, "met": True},
                             "roster": []}

    def __init__(self, port: int):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self
        self.signed = 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if "X-Fdl-Proof" in self.headers:
                    outer.signed += 1
                body = json.dumps({"ok": True, "controller_id": "5a" * 16} if self.path == "/join/id"
                                  else Squatter.STATE).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("token", [True, False], ids=["with-token", "without-token"])
def test_a_squatters_done_is_no_success(tmp_path: Path, token: bool) -> None:
    # regression: `fdl status --watch --wait` printed "run ... succeeded" and exited 0 on a squatter's phase: done
    port = free_port(span=PORTS)
    squatter = Squatter(port)
    env = WITH_TOKEN if token else {"FDL_JOIN_TOKEN": ""}
    proc = subprocess.Popen([sys.executable, "-m", "fdl", "status", "--watch", "--wait", "--addr", f"127.0.0.1:{port}",
                             "--interval", "0.2"], cwd=tmp_path, env=fdl_env({**env, "HOME": str(tmp_path)}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(120, proc.kill)
    guard.start()
    try:
        lines: list[str] = []
        read_lines_until(proc, "could not prove it holds" if token else "phase done", lines)
        if token:
            assert "could not prove it holds the run's token" in lines[-1] and "phase done" not in "".join(lines)
        squatter.stop()
        out, err = proc.communicate(timeout=60)
    finally:
        guard.cancel()
        proc.kill()
        proc.wait()
    assert proc.returncode == 1, out + err
    assert "succeeded" not in out.replace("says it succeeded", "")
    if token:
        assert squatter.signed > 0  # it was asked with a proof ...
        assert "outcome unknown" in out  # ... and no state of its was taken
    else:
        assert "unverified" in err  # said at the start ...
        assert "fdl: run r-squat says it succeeded, but no answer proved the run's token" in out  # ... and the end
