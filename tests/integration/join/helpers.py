"""Shared pieces of the `fdl join` integration tests: a real controller, agents as real processes, a gloo job."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.conftest import REPO, fdl_env
from tests.join_util import free_port, write_program

PYTHON = sys.executable
#: The token of a test window that names none, handed to every agent unless a test says otherwise
#: (FDL_JOIN_TOKEN="" for an agent without one): every window has a token, loopback is not a credential.
JOIN_TOKEN = "a05a8e11480079f431e47c6ceb9abbf100240bcafe0126201b711216af2b14e0"  # fdl refuses a token under 128 bits

# A training binary for CPU ranks: answers the signature probe, then runs one gloo all-reduce
# across the whole world and reports what it saw.
TRAIN = r'''
import os, sys
if os.environ.get("FDL_SIGNATURE_PROBE") == "1":
    print("fdl-signature: " + os.environ.get("TEST_SIGNATURE", "ab12cd34ef56ab12"), flush=True)
    sys.exit(0)
if os.environ.get("TEST_EARLY_EXIT"):
    print("failing before the world is up", flush=True)
    sys.exit(int(os.environ["TEST_EARLY_EXIT"]))
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
assert value.item() == size * (size + 1) / 2, value
data = os.environ.get("FDL_DATA_PATH")
seen = ",".join(sorted(os.listdir(data))) if data and os.path.isdir(data) else None
writable = None
if data and os.path.isdir(data):
    try:
        open(os.path.join(data, f"written-by-rank-{rank}"), "w").close()
        writable = True
    except OSError:
        writable = False
print(f"RESULT rank={rank} size={size} sum={value.item():g} host={os.environ.get('FDL_HOST')} "
      f"args={','.join(sys.argv[1:])} data={data} seen={seen} writable={writable} "
      f"share={os.environ.get('FDL_GPU_RAM_SHARE')}", flush=True)
dist.barrier()  # nobody tears the group down while a peer is still using it (gloo aborts otherwise)
dist.destroy_process_group()
code = int(os.environ.get("TEST_EXIT_RANK_%d" % rank, "0"))
sys.exit(code)
'''


def train_binary(directory: Path) -> Path:
    return write_program(directory / "train", TRAIN, python=PYTHON)


def policy(**kwargs):
    """A discovery RunPolicy with fast liveness timings, a master port in this suite's range and JOIN_TOKEN."""
    from fdl.controller.policy import RunPolicy

    base = dict(discovery=True, start="auto", heartbeat_s=0.5, silence_s=10.0, poll_s=2.0,
                master_port=free_port(), token=JOIN_TOKEN)
    base.update(kwargs)
    return RunPolicy(**base)


@contextlib.contextmanager
def controller(run_policy, host: str = "127.0.0.1", port: int | None = None) -> Iterator:
    """A real controller endpoint in a background thread."""
    from fdl.controller.server import ControllerServer

    server = ControllerServer(run_policy, host=host, port=port or free_port(host))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def agent_env(home: Path, extra: dict | None = None) -> dict:
    env = {"HOME": str(home), "GLOO_SOCKET_IFNAME": "lo", "FDL_JOIN_BACKOFF_BASE_S": "0.2",
           "FDL_JOIN_BACKOFF_MAX_S": "1", "PYTHONUNBUFFERED": "1", "FDL_JOIN_TOKEN": JOIN_TOKEN}
    env.update(extra or {})
    return fdl_env(env)


def spawn_join(*args: str, home: Path, cwd: Path | None = None, env: dict | None = None,
               prefix: tuple[str, ...] = ()) -> subprocess.Popen:
    """`fdl join ARGS` as its own process (output captured, text)."""
    home.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([*prefix, PYTHON, "-m", "fdl", "join", *args], cwd=cwd or home,
                            env=agent_env(home, env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"fdl join did not finish in {timeout} s:\nstdout:\n{out}\nstderr:\n{err}") from None
    return proc.returncode, out, err


class Lines:
    """Collects a running process's stderr lines in a thread, so a test can wait on them with a deadline."""

    def __init__(self, proc: subprocess.Popen):
        import threading

        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.lines.append(line)

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    def text(self) -> str:
        self._thread.join(timeout=10)
        return "".join(self.lines)


def terminate(proc: subprocess.Popen, lines: Lines, timeout: float = 60) -> int:
    """SIGTERM the agent's process group, wait for it, drain and close its pipes; returns its exit code."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    lines.text()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return proc.returncode


def wait_for(predicate: Callable[[], object], timeout: float = 60, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def results(stdout: str) -> list[dict]:
    """The RESULT lines the training binary printed (as key=value dicts)."""
    found = []
    for line in stdout.splitlines():
        if "RESULT " in line:
            body = line.split("RESULT ", 1)[1]
            found.append(dict(part.split("=", 1) for part in body.split(" ") if "=" in part))
    return found


# What another account binds on the run's port between runs (it is unprivileged): it names a controller id when
# asked, and answers everything else with the refusal in argv[3] (JSON), unsigned.
SQUATTER = r"""
import json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
REFUSAL = json.loads(sys.argv[3])
class H(BaseHTTPRequestHandler):
    def answer(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/join/id":
            self.answer(200, {"ok": True, "controller_id": "00" * 16, "now": 0})
        else:
            self.answer(409, REFUSAL)
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.answer(409, REFUSAL)
    def log_message(self, *a):
        pass
server = ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), H)
print("ready", os.getpid(), flush=True)
server.serve_forever()
"""
GO_AWAY = '{"ok": false, "reason": "window_closed", "message": "go away"}'


class Squatter:
    """SQUATTER run by /usr/bin/python3 as another real account of this machine (default nobody), listening on
    host:port once constructed; stop() kills it and waits for the port to be free again."""

    def __init__(self, port: int, refusal: str = GO_AWAY, *, host: str = "127.0.0.1", account: str = "nobody"):
        import shlex

        line = " ".join(shlex.quote(a) for a in ["exec", "/usr/bin/python3", "-c", SQUATTER, host, str(port),
                                                 refusal])
        self.proc = subprocess.Popen(["su", account, "-s", "/bin/sh", "-c", line], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        ready = self.proc.stdout.readline().split()
        assert ready[:1] == ["ready"], self.proc.stderr.read()
        self.pid = int(ready[1])
        self.host, self.port = host, port

    def stop(self) -> None:
        from tests.controller_util import _bindable as bindable

        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(30)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        wait_for(lambda: bindable(self.host, self.port), timeout=30, what="the squatter's port to be free")


__all__ = ["GO_AWAY", "JOIN_TOKEN", "REPO", "Lines", "Squatter", "agent_env", "controller", "finish", "policy",
           "results", "spawn_join", "terminate", "train_binary", "wait_for"]
