"""What `fdl join` trusts: only answers that prove the run's token, only the allowed rank variables, and
never hands the token on (regressions: the hello carried the token in clear, the agent applied any
environment an answer carried, and the token reached every rank's environment).

The stand-ins are real HTTP servers on loopback (aiohttp in a thread), recording every byte they receive;
the agents are real `fdl join` processes; the training binary records whether it ever ran, and its
whole environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.join.helpers import controller, finish, policy, spawn_join
from tests.join_util import free_port, write_program

pytestmark = pytest.mark.slow
TOKEN = "7e57" * 16
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
    With keys (a controller that holds the token, turned hostile) it signs its answers properly."""

    def __init__(self, keys=None):
        self.keys = keys
        self.received = bytearray()
        self.exits: list[dict] = []
        self.port = free_port()

    async def _handle(self, request):
        from aiohttp import web

        from fdl.controller import auth

        body = await request.read()
        head = f"{request.method} {request.path_qs}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in request.headers.items())
        self.received += head.encode() + b"\r\n" + body
        if request.path == "/join":
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
    assert code == 2, err
    assert "could not prove it holds the run's token" in err and "nothing in it is acted on" in err
    assert not list(tmp_path.glob("mark.rank*"))  # no rank ran
    assert fake.received.startswith(b"POST /join")  # it was asked, with a proof ...
    assert TOKEN.encode() not in fake.received and TOKEN[:16].encode() not in fake.received  # ... not the token
    assert TOKEN not in err and TOKEN not in out


def test_a_token_holding_controller_cannot_set_a_ranks_ld_preload_or_path(tmp_path):
    from fdl.controller import auth

    binary, mark = _program(tmp_path)
    with StandIn(keys=auth.derive(TOKEN)).serving() as fake:
        proc = spawn_join(f"127.0.0.1:{fake.port}", "--bin", str(binary), "--host", "victim", "--devices", "cpu:1",
                          "--token", TOKEN, home=tmp_path / "h", env={"TEST_MARK": str(mark)})
        code, _, err = finish(proc, timeout=60)
    assert code == 2, err
    assert "rank environment variables" in err and "LD_PRELOAD" in err and "PATH" in err
    assert "no rank was started" in err and not list(tmp_path.glob("mark.rank*"))
    assert [e["code"] for e in fake.exits] == [2] and "LD_PRELOAD" in fake.exits[0]["detail"]  # reported
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
