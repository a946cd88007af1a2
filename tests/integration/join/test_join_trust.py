"""What `fdl join` trusts: only answers that prove the run's token, only the allowed rank variables, and
never hands the token on (regressions: the hello carried the token in clear, the agent applied any
environment an answer carried, and the token reached every rank's environment); and what it never lets
the network decide: whether a box stops for good (regressions: one unsigned answer, a stale clock or a
wrong token made a --persist worker exit 2, and the shipped unit powered it off).

The stand-ins are real HTTP servers on loopback (aiohttp in a thread, or a squatter run by another real
account of this machine), recording every byte they receive; the agents are real `fdl join` processes;
the training binary records whether it ever ran, and its whole environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.join.helpers import (
    GO_AWAY,
    Lines,
    Squatter,
    controller,
    finish,
    policy,
    spawn_join,
    terminate,
    wait_for,
)
from tests.join_util import free_port, write_program

pytestmark = pytest.mark.slow
TOKEN = "10581b2235869fb45a88854335c5d2d68636aefd2836a9d44619b553bd7615c6"  # fdl refuses a token under 128 bits
ATTACK_ENV = {"LD_PRELOAD": "/tmp/evil.so", "PATH": "/tmp/evil-bin", "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": "1", "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}
# Runs only if an agent starts a rank: leaves a marker and its environment.
RAN = r'''
import json, os, sys
if os.environ.get("FDL_SIGNATURE_PROBE") == "1":
    with open(os.environ["TEST_MARK"] + ".probe.json", "w") as f:  # before the signature: the agent may end
        json.dump(dict(os.environ), f)                              # the probe as soon as it has read it
    print("fdl-signature: ab12cd34ef56ab12", flush=True)
    sys.exit(0)
with open(os.environ["TEST_MARK"] + ".rank%s.json" % os.environ.get("RANK", "x"), "w") as f:
    json.dump(dict(os.environ), f)
'''


class StandIn:
    """A fake controller on loopback that admits anyone and hands out the attacker's rank environment.
    With the token (a controller that holds it, turned hostile) it signs its answers properly."""

    ID = "5e" * 16

    def __init__(self, token=None):
        from fdl.controller import auth

        self.keys = auth.derive(token, self.ID) if token else None
        self.received = bytearray()
        self.exits: list[dict] = []
        self.port = free_port()

    async def _handle(self, request):
        from aiohttp import web

        from fdl.controller import auth

        body = await request.read()
        head = f"{request.method} {request.path_qs}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in request.headers.items())
        self.received += head.encode() + b"\r\n" + body
        if request.path == "/join/id":
            answer = {"ok": True, "controller_id": self.ID}
        elif request.path == "/join":
            answer = {"ok": True, "admitted": True, "ticket": "m1.x", "host": "victim", "ranks": 1, "phase": "waiting",
                      "heartbeat_s": 0.5, "poll_s": 1}
        elif request.path == "/join/world":
            answer = {"ok": True, "formed": True, "heartbeat_s": 0.5,
                      "world": {"size": 1, "nodes": 1, "master_addr": "127.0.0.1", "master_port": 1, "backend": "gloo",
                                "run_id": None, "args": []},
                      "node_rank": 0, "ranks": [{"rank": 0, "local_rank": 0, "device": None, "env": ATTACK_ENV}]}
        elif request.path == "/join/exit":
            self.exits.append(json.loads(body))
            answer = {"ok": True, "phase": "failed"}
        else:
            answer = {"ok": True, "phase": "training", "stop": False}
        raw = json.dumps(answer).encode()
        resp = web.Response(body=raw, content_type="application/json")
        nonce = request.headers.get(auth.NONCE_HEADER)
        if self.keys is not None and nonce:
            resp.headers[auth.ANSWER_HEADER] = auth.answer_proof(self.keys.answer, nonce, 200, raw)
        return resp

    @contextlib.contextmanager
    def serving(self) -> Iterator[StandIn]:
        from aiohttp import web

        loop = asyncio.new_event_loop()
        ready = threading.Event()
        runner_box: list = []

        async def up():
            server = web.Server(self._handle)
            runner = web.ServerRunner(server)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            runner_box.append(runner)

        def run():
            loop.run_until_complete(up())
            ready.set()
            loop.run_forever()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        ready.wait(10)
        try:
            yield self
        finally:
            asyncio.run_coroutine_threadsafe(runner_box[0].cleanup(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


def _program(tmp_path: Path) -> tuple[Path, Path]:
    mark = tmp_path / "mark"
    return write_program(tmp_path / "bin" / "train", RAN), mark


def test_a_stand_in_controller_gets_no_token_and_runs_nothing(tmp_path):
    binary, mark = _program(tmp_path)
    with StandIn().serving() as fake:
        proc = spawn_join(f"127.0.0.1:{fake.port}", "--bin", str(binary), "--host", "victim", "--devices", "cpu:1",
                          home=tmp_path / "h", env={"FDL_JOIN_TOKEN": TOKEN, "TEST_MARK": str(mark)})
        code, out, err = finish(proc, timeout=60)
    assert code == 1, err  # learned from the network: transient
    assert "could not prove it holds the run's token" in err and "nothing in it is acted on" in err
    assert not list(tmp_path.glob("mark.rank*"))  # no rank ran
    assert b"POST /join\r\n" in fake.received and b"X-Fdl-Proof" in fake.received  # asked, with a proof ...
    assert TOKEN.encode() not in fake.received and TOKEN[:16].encode() not in fake.received  # ... not the token
    assert TOKEN not in err and TOKEN not in out


def test_a_token_holding_controller_cannot_set_a_ranks_ld_preload_or_path(tmp_path):
    binary, mark = _program(tmp_path)
    with StandIn(token=TOKEN).serving() as fake:
        proc = spawn_join(f"127.0.0.1:{fake.port}", "--bin", str(binary), "--host", "victim", "--devices", "cpu:1",
                          "--token", TOKEN, home=tmp_path / "h", env={"TEST_MARK": str(mark)})
        code, _, err = finish(proc, timeout=60)
    assert code == 1, err  # refused, and not permanent: a token holder turned hostile does not power boxes off
    assert "rank environment variables" in err and "LD_PRELOAD" in err and "PATH" in err
    assert "no rank was started" in err and not list(tmp_path.glob("mark.rank*"))
    assert [e["code"] for e in fake.exits] == [1] and "LD_PRELOAD" in fake.exits[0]["detail"]  # reported
    assert TOKEN.encode() not in fake.received


def test_a_ranks_environment_never_holds_the_token(tmp_path):
    binary, mark = _program(tmp_path)
    with controller(policy(max_hosts=1, window_s=60, token=TOKEN)) as server:
        proc = spawn_join(server.address, "--bin", str(binary), "--host", "solo", "--devices", "cpu:2",
                          home=tmp_path / "h", env={"FDL_JOIN_TOKEN": TOKEN, "TEST_MARK": str(mark)})
        code, _, err = finish(proc, timeout=120)
        assert server.state()["phase"] == "done"
    assert code == 0, err
    dumps = sorted(tmp_path.glob("mark.*.json"))
    assert [p.name for p in dumps] == ["mark.probe.json", "mark.rank0.json", "mark.rank1.json"]
    for dump in dumps:
        env = json.loads(dump.read_text())
        assert "FDL_JOIN_TOKEN" not in env
        assert not any(TOKEN in value for value in env.values()), dump.name
        assert not any(TOKEN in name for name in env)


# ---------------------------------------------------------------- nothing from the network is permanent

OTHER = "nobody"  # a real unprivileged account of this machine, not the test's (root)
FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")  # Debian package libfaketime
HOLD = r'''
import os, sys
if os.environ.get("FDL_SIGNATURE_PROBE") == "1":
    sys.exit(0)
print("RAN rank", os.environ.get("RANK"), flush=True)
'''
def test_a_squatter_of_another_account_makes_a_persist_worker_redial_not_stop(tmp_path):
    """regression: any answer without a valid proof was permanent, so one unsigned 409 from whatever held the
    training port between runs made a --persist worker holding the right token exit 2 (the unit powered the box
    off). Now it re-dials, says the likely causes, and joins once the real run holds the port."""
    binary = write_program(tmp_path / "bin" / "hold", HOLD)
    port = free_port()
    squatter = Squatter(port, GO_AWAY)
    try:
        owner = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True).stdout
        assert "python3" in owner  # the port really is the other account's listener
        one, _, err_one = finish(spawn_join(f"127.0.0.1:{port}", "--bin", str(binary), "--devices", "cpu:1",
                                            "--host", "w", home=tmp_path / "one", env={"FDL_JOIN_TOKEN": TOKEN}),
                                 timeout=60)
        assert one == 1, err_one  # one-shot: transient
        assert "could not prove it holds the run's token" in err_one and "go away" in err_one  # a claim, shown
        worker = spawn_join(f"127.0.0.1:{port}", "--persist", "--bin", str(binary), "--devices", "cpu:1",
                            "--host", "w", home=tmp_path / "persist", env={"FDL_JOIN_TOKEN": TOKEN})
        lines = Lines(worker)
        wait_for(lambda: lines.count("dials in a row reached no controller that proves the run's token") >= 1
                 or worker.poll() is not None, timeout=120, what="the loud warning")
        assert worker.poll() is None, lines.text()  # still re-dialing
    finally:
        squatter.stop()
    try:
        with controller(policy(max_hosts=1, window_s=60, token=TOKEN), port=port) as server:
            wait_for(lambda: server.state()["phase"] == "done" or worker.poll() is not None, timeout=120,
                     what="the real run")
            assert server.state()["phase"] == "done"
    finally:
        terminate(worker, lines)
    text = lines.text()
    assert "something else answers at that address" in text and "wrong" not in text.lower().split("warning")[0]
    assert "admitted by 127.0.0.1" in text and "RAN rank 0" not in text  # rank output goes to stdout
    assert TOKEN not in text


def test_a_clock_90_s_behind_is_transient_and_named(tmp_path):
    """regression: the controller's stale_request refusal (a worker clock more than 60 s off) was unsigned,
    hence permanent: exit 2 from the real controller. It is signed now (the proof matched), and transient."""
    assert FAKETIME.exists(), "libfaketime is missing: scripts/test.sh installs it (scripts/apt-test.txt)"
    binary = write_program(tmp_path / "bin" / "hold", HOLD)
    behind = {"LD_PRELOAD": str(FAKETIME), "FAKETIME": "-90s",
              "FDL_JOIN_TOKEN": TOKEN}
    with controller(policy(max_hosts=1, window_s=60, token=TOKEN)) as server:
        one, _, err_one = finish(spawn_join(server.address, "--bin", str(binary), "--devices", "cpu:1", "--host", "w",
                                            home=tmp_path / "one", env=behind), timeout=60)
        assert one == 1, err_one
        assert "refused this box (stale_request)" in err_one and "behind the controller's clock" in err_one
        assert "NTP" in err_one
        worker = spawn_join(server.address, "--persist", "--bin", str(binary), "--devices", "cpu:1", "--host", "w",
                            home=tmp_path / "persist", env=behind)
        lines = Lines(worker)
        try:
            wait_for(lambda: lines.count("dials in a row") >= 2 or worker.poll() is not None, timeout=120,
                     what="two loud warnings")
            assert worker.poll() is None
        finally:
            terminate(worker, lines)
        state = server.state()
    text = lines.text()
    assert "this box's clock is 90 s behind what" in text and "timedatectl set-ntp true" in text
    assert state["roster"] == [] and state["refusals"]["stale_request"] >= 3


def test_an_impostors_words_reach_no_terminal_raw(tmp_path):
    """regression: `fdl start`, `fdl status` and a tokenless `fdl join` printed an impostor's refusal reason and
    message as they came: OSC 52 (clipboard write), OSC 8 links, clear-screen, BEL, bidi overrides."""
    from tests.conftest import run_fdl

    nasty = {"ok": False, "reason": "window_closed\x1b]52;c;ZXZpbA==\x07",
             "message": "\x1b[2J\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\ \u202eevil\u202c \x9b31m\x07"}
    port = free_port()
    squatter = Squatter(port, json.dumps(nasty))
    try:
        outputs = {
            "start": run_fdl("start", "--addr", f"127.0.0.1:{port}", cwd=tmp_path, env={"FDL_JOIN_TOKEN": ""}),
            "start with a token": run_fdl("start", "--addr", f"127.0.0.1:{port}", cwd=tmp_path,
                                          env={"FDL_JOIN_TOKEN": TOKEN}),
            "status": run_fdl("status", "--addr", f"127.0.0.1:{port}", cwd=tmp_path),
        }
        code, out, err = finish(spawn_join(f"127.0.0.1:{port}", "--bin", str(write_program(tmp_path / "b", HOLD)),
                                           "--devices", "cpu:1", home=tmp_path / "h", env={"FDL_JOIN_TOKEN": ""}),
                                timeout=60)
    finally:
        squatter.stop()
    outputs["join"] = subprocess.CompletedProcess([], code, out, err)
    for name, result in outputs.items():
        text = result.stdout + result.stderr
        assert result.returncode == 1, (name, text)
        assert "evil" in text or "could not prove" in text, (name, text)  # the claim is shown, as data
        for raw in ("\x1b", "\x07", "\u202e", "\u202c", "\x9b"):
            assert raw not in text, (name, repr(raw), text)


def test_builds_never_see_the_token_and_rank_logs_are_private(tmp_path):
    """regressions: the worker's build recipe (and every build.rs cargo runs under it) and the publish gate got
    FDL_JOIN_TOKEN in their environment; rank logs were 0644 files in 0755 directories."""
    import os
    import stat

    from tests.conftest import run_fdl

    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "train").write_text(f"#!{sys.executable}\n{HOLD}")
    mark = tmp_path / "env"
    recipe = f'env > "{mark}.$$" && mkdir -p out && cp train out/train && chmod +x out/train'
    published = run_fdl("publish", f"file://{tree}", "--bin", "out/train", "--build", recipe, "--to",
                        str(tmp_path / "served"), cwd=tmp_path, env={"HOME": str(tmp_path / "op"),
                                                                     "FDL_JOIN_TOKEN": TOKEN})
    assert published.returncode == 0, published.stderr
    home = tmp_path / "h"
    (home / ".flodl" / "join" / "logs").mkdir(parents=True)
    os.chmod(home / ".flodl" / "join" / "logs", 0o755)  # left open by an older fdl
    with controller(policy(max_hosts=1, window_s=60, token=TOKEN)) as server:
        code, _, err = finish(spawn_join(server.address, "--source", f"file://{tree}", "--source-build", recipe,
                                         "--source-bin", "out/train", "--devices", "cpu:1", home=home,
                                         env={"FDL_JOIN_TOKEN": TOKEN}), timeout=120)
    assert code == 0, err
    dumps = sorted(tmp_path.glob("env.*"))
    assert len(dumps) == 2  # the publish gate's and the worker's build
    for dump in dumps:
        env = dump.read_text()
        assert "FDL_JOIN_TOKEN" not in env and TOKEN not in env, dump
    logs = home / ".flodl" / "join" / "logs"
    runs = list(logs.iterdir())
    assert len(runs) == 1 and [p.name for p in runs[0].iterdir()] == ["rank-0.log"]
    assert stat.S_IMODE(logs.stat().st_mode) == 0o700 and stat.S_IMODE(runs[0].stat().st_mode) == 0o700
    assert stat.S_IMODE((runs[0] / "rank-0.log").stat().st_mode) == 0o600
    assert "RAN rank 0" in (runs[0] / "rank-0.log").read_text()


# ---------------------------------------------------------------- a proof is good at one controller only


class Recorder:
    """A TCP forwarder in front of a controller that keeps every byte clients send (a sniffer on the path)."""

    def __init__(self, upstream: int):
        import socket
        import threading

        self.upstream = upstream
        self.sent: list[bytearray] = []
        self.sockets: list = []  # closed in close(), not left to the collector
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            self.sockets += [client, upstream]
            record = bytearray()
            self.sent.append(record)
            threading.Thread(target=self._pipe, args=(client, upstream, record), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, None), daemon=True).start()

    @staticmethod
    def _pipe(src, dst, record) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(65536):
                if record is not None:
                    record += chunk
                dst.sendall(chunk)
        with contextlib.suppress(OSError):
            dst.shutdown(1)

    def requests(self, prefix: bytes) -> list[bytes]:
        """Every recorded request whose first line starts with prefix, as the bytes that were sent."""
        found = []
        for stream in self.sent:
            data = bytes(stream)
            while b"\r\n\r\n" in data:
                head, _, rest = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                whole, data = head + b"\r\n\r\n" + rest[:length], rest[length:]
                if whole.startswith(prefix):
                    found.append(whole)
        return found

    def close(self) -> None:
        self.server.close()
        for sock in self.sockets:
            sock.close()


def replay(port: int, request: bytes) -> tuple[int, dict]:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def test_a_recorded_hello_or_start_is_refused_by_every_other_controller_with_the_token(tmp_path):
    """regression: a proof covered method, path, time, nonce and body but nothing naming the controller, and a
    farm's token is shared by every run of the farm: a hello sniffed on the path and replayed within 60 s to
    another controller (the next run, a restarted launcher) was admitted under the victim's name with the
    attacker's address, and a replayed /start fired another run's switch. Two live controllers, one token."""
    from fdl.controller.protocol import Hello
    from fdl.hostside.checks.devices import parse_devices
    from tests.conftest import run_fdl

    binary = write_program(tmp_path / "bin" / "hold", HOLD)
    manual = policy(start="manual", quorum_hosts=1, window_s=120, token=TOKEN)
    with controller(manual) as first, controller(manual) as second:
        second.call(lambda m: m.hello(Hello(host="own", devices=parse_devices("cpu:1")), peer="launcher",
                                      trusted=True, in_process=True))  # the other run's own host: quorum met
        sniffer = Recorder(first.port)
        try:
            victim = spawn_join(f"127.0.0.1:{sniffer.port}", "--bin", str(binary), "--devices", "cpu:1",
                                "--host", "victim", home=tmp_path / "victim", env={"FDL_JOIN_TOKEN": TOKEN})
            wait_for(lambda: first.state()["roster"], timeout=60, what="the victim's admission")
            started = run_fdl("start", "--addr", f"127.0.0.1:{sniffer.port}", cwd=tmp_path,
                              env={"FDL_JOIN_TOKEN": TOKEN})
            assert started.returncode == 0, started.stderr
            code, _, err = finish(victim, timeout=60)
            assert code == 0, err
            hellos, starts = sniffer.requests(b"POST /join "), sniffer.requests(b"POST /start ")
        finally:
            sniffer.close()
        assert len(hellos) == 1 and len(starts) == 1
        assert replay(second.port, hellos[0])[1]["reason"] == "bad_token"  # within seconds of the original
        assert replay(second.port, starts[0])[1]["reason"] == "bad_token"
        assert replay(first.port, hellos[0])[1]["reason"] == "stale_request"  # a nonce is good once, here too
        state = second.state()
    assert [m["host"] for m in state["roster"]] == ["own"] and state["start"]["switch"] == "unarmed"
    assert state["refusals"] == {"bad_token": 2}


INTRUDER = r'''
import json, sys, urllib.error, urllib.request
port = sys.argv[1]
out = {}
def ask(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
status, hello = ask("/join", {"host": "intruder", "devices": "cpu:64", "address": "10.66.66.66"})
out["hello"] = [status, hello.get("reason")]
out["start"] = list(ask("/start", {})[:1]) + [ask("/start", {})[1].get("reason")]
ticket = hello.get("ticket") or "m1.forged"
out["exit"] = [ask("/join/exit", {"ticket": ticket, "code": 1})[0]]
print(json.dumps(out))
'''


def test_another_account_on_the_controller_box_can_neither_join_nor_start_nor_fail_the_run(tmp_path):
    """regression: loopback was full trust, so every unprivileged account on the controller box could join 64
    ranks (and so read the run's args and become MASTER_ADDR), fire the start switch and fail the run."""
    import shlex

    binary = write_program(tmp_path / "bin" / "hold", HOLD)
    manual = policy(start="manual", quorum_hosts=1, window_s=120, token=TOKEN)
    with controller(manual) as server:
        member = spawn_join(server.address, "--bin", str(binary), "--devices", "cpu:1", "--host", "member",
                            home=tmp_path / "member", env={"FDL_JOIN_TOKEN": TOKEN})
        try:
            wait_for(lambda: server.state()["roster"], timeout=60, what="the member")
            line = " ".join(shlex.quote(a) for a in ["/usr/bin/python3", "-c", INTRUDER, str(server.port)])
            done = subprocess.run(["su", OTHER, "-s", "/bin/sh", "-c", line], capture_output=True, text=True,
                                  timeout=60)
            state = server.state()
        finally:
            with contextlib.suppress(ProcessLookupError):
                member.kill()
            finish(member)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"hello": [403, "bad_token"], "start": [403, "bad_token"], "exit": [403]}, seen
    assert [m["host"] for m in state["roster"]] == ["member"] and state["phase"] == "staging"
    assert state["start"]["switch"] == "unarmed"


# ---------------------------------------------------------------- what a rank of the agent's account can read

# regression (issue 37, finding 7): the agent kept FDL_JOIN_TOKEN in its environment, and a rank of the same
# account read it from /proc/<agent>/environ (or from the agent's memory through /proc/<agent>/mem).
PEEK = r'''
import json, os, re, sys
if os.environ.get("FDL_SIGNATURE_PROBE") == "1":
    print("fdl-signature: ab12cd34ef56ab12", flush=True)
    sys.exit(0)
out = os.environ["TEST_OUT"]
agent = int(open(os.path.join(out, "agent.pid")).read())
seen = {"uid": os.getuid()}
try:
    with open(f"/proc/{agent}/environ", "rb") as f:
        seen["environ"] = f.read().decode("latin-1")
except OSError as exc:
    seen["environ_error"] = exc.strerror
hits = set()
try:
    with open(f"/proc/{agent}/maps") as maps, open(f"/proc/{agent}/mem", "rb") as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("rw"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                hits.update(m.decode() for m in re.findall(rb"[0-9a-f]{64}", mem.read(end - start)))
            except OSError:
                pass
    seen["mem_read"] = True
except OSError as exc:
    seen["mem_error"] = exc.strerror
seen["mem_hits"] = sorted(hits)
with open(os.path.join(out, "rank%s.json" % os.environ.get("RANK", "x")), "w") as f:
    json.dump(seen, f)
'''


def test_a_rank_of_the_agents_account_cannot_read_the_token_from_the_agent(tmp_path):
    import os
    import pwd
    import shutil
    import tempfile

    from tests.conftest import need_root_or_skip
    from tests.integration.launch.helpers import fdl_python

    need_root_or_skip("the agent and its rank run as another real account (setpriv), as a farm's worker does")
    account = pwd.getpwnam(OTHER)
    shared = Path(tempfile.mkdtemp(prefix="fdl-peek-", dir="/var/tmp"))
    try:
        os.chmod(shared, 0o755)
        python = fdl_python(shared / "py")
        binary = write_program(shared / "bin" / "peek", PEEK, python=str(python))
        out, home = shared / "out", shared / "home"
        for directory in (out, home):
            directory.mkdir()
            shutil.chown(directory, account.pw_uid, account.pw_gid)
        env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1", "FDL_JOIN_TOKEN": TOKEN,
               "TEST_OUT": str(out), "GLOO_SOCKET_IFNAME": "lo"}
        with controller(policy(max_hosts=1, window_s=60, token=TOKEN)) as server:
            agent = subprocess.Popen(["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
                                      "--init-groups", str(python), "-m", "fdl", "join", server.address, "--bin",
                                      str(binary), "--host", "solo", "--devices", "cpu:1"],
                                     cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            (out / "agent.pid").write_text(str(agent.pid))
            code, _, err = finish(agent, timeout=180)
            assert server.state()["phase"] == "done", err
        assert code == 0, err
        seen = json.loads((out / "rank0.json").read_text())
        assert seen["uid"] == account.pw_uid  # the rank ran as the agent's own account
        assert TOKEN not in seen.get("environ", ""), "the rank read the token in /proc/<agent>/environ"
        assert TOKEN not in seen["mem_hits"], "the rank read the token in the agent's memory"
        assert "environ_error" in seen and "mem_error" in seen  # the agent is closed to its own account
    finally:
        shutil.rmtree(shared, ignore_errors=True)
