"""The controller's status page (`GET /`, in a real headless Chromium) and Prometheus metrics (`GET /metrics`,
checked by the real `promtool`), against live controllers on loopback.

Screenshots of the page are kept as test artifacts under pytest's base temp directory
(`--basetemp=DIR` keeps them in DIR; by default /tmp/pytest-of-$USER/pytest-current/):
test_status_page_in_headless_c0/status-page.png (a staging run) and
test_status_page_says_run_ende0/status-page-ended.png (the run-ended banner).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import time
import zlib
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from fdl.controller.client import ControllerClient, ControllerRefused
from fdl.controller.policy import RunPolicy
from fdl.controller.routes import status_page
from fdl.controller.states import SNAPSHOT_S
from tests.controller_util import free_port, https_stand_in, serving, tls_context, tls_get
from tests.prometheus import need_tool, promtool_accepts, samples

PORTS = (25000, 25999)  # this suite's ports
# --ignore-certificate-errors: the controller's key is its own, made per instance (no CA a browser knows); a person
# accepts it once in the browser's warning page, or pins it (docs/controller.md).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--ignore-certificate-errors",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                  "--hide-scrollbars", "--mute-audio")


def chromium(tmp_path: Path, url: str, *args: str, budget_ms: int = 4000) -> str:
    """Run headless Chromium once on url (fresh profile); returns its stdout. The whole process group is
    killed if it overruns."""
    binary = need_tool("chromium", "chromium")
    profile = tmp_path / f"chromium-profile-{time.monotonic_ns()}"
    cmd = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", *args, url]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert proc.returncode == 0, err[-2000:]
    return out


def text_of(dom: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</', dom, re.S)
    assert found, f"no element #{element_id} in the rendered page"
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


def agent_hello(server, host: str, devices: str, **extra) -> dict:
    with ControllerClient(f"127.0.0.1:{server.port}", token=server.policy.token) as client:
        return client.hello({"host": host, "devices": devices, "run_id": "r-live", "signature": "9f3c", **extra})


def staging_run(**policy):
    return serving(RunPolicy(start="manual", quorum_hosts=2, window_s=600, silence_s=900, run_id="r-live",
                             **policy), span=PORTS)


# ---------------------------------------------------------------- the page


def test_status_page_in_headless_chromium(tmp_path: Path) -> None:
    with staging_run() as server:
        agent_hello(server, "node-a", "0,1", gpu_names=["NVIDIA H100", "NVIDIA H100"])
        agent_hello(server, "node-b", "cpu:2")
        assert server.state()["phase"] == "staging"
        url = f"https://127.0.0.1:{server.port}/"

        dom = chromium(tmp_path, url, "--dump-dom")
        assert text_of(dom, "phase") == "staging"
        assert text_of(dom, "run") == "r-live"
        assert 'data-host="node-a"' in dom and 'data-host="node-b"' in dom
        assert "2 x NVIDIA H100" in dom and "2 CPU rank(s)" in dom
        countdown = re.search(r'data-deadline="window"><div>join window closes in (\d+)m(\d\d)s</div>', dom)
        assert countdown, "no window countdown on the page"
        assert 9 * 60 <= int(countdown.group(1)) * 60 + int(countdown.group(2)) <= 600
        assert text_of(dom, "quorum") == "2 of 2 host(s)"
        assert text_of(dom, "startcmd") == f"fdl start --addr 127.0.0.1:{server.port}"
        assert 'id="ended" hidden' in dom  # no "run ended" banner while it answers

        shot = tmp_path / "status-page.png"
        chromium(tmp_path, url, f"--screenshot={shot}", "--window-size=1280,800")
        width, height, distinct = png_summary(shot.read_bytes())
        assert (width, height) == (1280, 800)
        assert distinct >= 32, "the screenshot is (nearly) blank"
        # besides the agents' hellos, the browser asked for the page and state.json only (not even a favicon)
        asked = server.call(lambda m: {endpoint for endpoint, _ in server.requests})
        assert asked == {"/join/id", "/join", "/", "/state.json"}, asked


def png_summary(data: bytes) -> tuple[int, int, int]:
    """(width, height, distinct byte values in the image data) of a PNG: enough to tell a blank page."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, size = 8, b"", (0, 0)
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            size = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    return size[0], size[1], len(set(zlib.decompress(idat)))


def test_status_page_says_run_ended_when_polling_fails(tmp_path: Path) -> None:
    """The page as served and a state.json taken from a real controller, handed out by a stand-in server whose
    state.json stops answering after the first poll: what a browser sees when a run's launcher exits."""
    with staging_run() as server:
        agent_hello(server, "node-a", "cpu:1")
        snapshot = server.machine.state_json()
    page = status_page()
    polls = []

    class Gone(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/":
                body, kind = page.body, "text/html; charset=utf-8"
            elif self.path == "/state.json" and not polls:
                polls.append(self.path)
                body, kind = snapshot, "application/json"
            else:
                polls.append(self.path)
                self.send_response(503)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Security-Policy", page.csp)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    port = free_port(span=PORTS)
    with https_stand_in(Gone, port):
        dom = chromium(tmp_path, f"https://127.0.0.1:{port}/", "--dump-dom", budget_ms=5000)
        polls.clear()
        shot = tmp_path / "status-page-ended.png"
        chromium(tmp_path, f"https://127.0.0.1:{port}/", f"--screenshot={shot}", "--window-size=1280,800",
                 budget_ms=5000)
    assert len(polls) >= 2
    assert text_of(dom, "phase") == "run ended (last: waiting)"
    banner = text_of(dom, "ended")
    assert banner.startswith(f"Run ended: the controller at 127.0.0.1:{port} stopped answering at ")
    assert "(last phase: waiting)" in banner
    assert 'data-host="node-a"' in dom  # the last state it saw stays on the page


def test_index_answers_json_to_a_json_client_and_sets_a_strict_csp() -> None:
    with staging_run() as server:
        base = f"https://127.0.0.1:{server.port}"
        page = tls_get(base + "/", timeout=10)
        assert page.status_code == 200 and page.headers["Content-Type"] == "text/html; charset=utf-8"
        csp = page.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "unsafe-inline" not in csp
        assert re.search(r"https?://", page.text) is None  # nothing external: no CDN, font or script URL
        listing = tls_get(base + "/", headers={"Accept": "application/json"}, timeout=10).json()
        assert listing["ok"] is True and "GET /metrics" in listing["endpoints"]
        missing = tls_get(base + "/nope", timeout=10)
        assert missing.status_code == 404 and "Accept: application/json" in missing.json()["message"]


# ---------------------------------------------------------------- metrics


def scrape(server, accept: str | None = None) -> tuple[str, str]:
    headers = {"Accept": accept} if accept else {}
    resp = tls_get(f"https://127.0.0.1:{server.port}/metrics", headers=headers, timeout=10)
    assert resp.status_code == 200
    return resp.text, resp.headers["Content-Type"]


def consistent(server) -> tuple[dict, dict, str]:
    """/metrics and state.json at the same moment: the same state version on both sides."""
    for _ in range(20):
        text, _ = scrape(server)
        state = tls_get(f"https://127.0.0.1:{server.port}/state.json", timeout=10).json()
        values = samples(text)
        if values[("fdl_state_version", ())] == state["version"]:
            return values, state, text
    raise AssertionError("the state kept changing between /metrics and state.json")


def test_metrics_pass_promtool_and_match_state_json() -> None:
    with staging_run() as server:
        tickets = [agent_hello(server, "node-a", "0,1")["ticket"], agent_hello(server, "node-b", "cpu:2")["ticket"]]
        for hello in ({"host": "node-a", "devices": "cpu:1", "run_id": "r-live"},  # host_joined
                      {"host": "node-c", "devices": "cpu:1", "run_id": "r-live", "signature": "beef"}):
            with pytest.raises(ControllerRefused), \
                    ControllerClient(f"127.0.0.1:{server.port}", token=server.policy.token) as client:
                client.hello(hello)

        values, state, text = consistent(server)
        promtool_accepts(text)
        assert values[("fdl_phase", (("phase", "staging"),))] == 1
        assert sum(v for (name, _), v in values.items() if name == "fdl_phase") == 1
        assert values[("fdl_roster_hosts", ())] == len(state["roster"]) == 2
        assert values[("fdl_roster_ranks", ())] == sum(e["ranks"] for e in state["roster"]) == 4
        assert values[("fdl_quorum_have_hosts", ())] == state["quorum"]["have"]["hosts"]
        assert values[("fdl_quorum_need_hosts", ())] == state["quorum"]["need"]["hosts"] == 2
        assert values[("fdl_quorum_have_ranks", ())] == state["quorum"]["have"]["ranks"]
        assert values[("fdl_quorum_met", ())] == 1 and values[("fdl_start_startable", ())] == 1
        window_left = ("fdl_deadline_seconds_left", (("deadline", "window"),))
        left, later = values[window_left], samples(scrape(server)[0])[window_left]
        # One countdown read three times in order (scrape, state.json, scrape): state.json's reading lies between
        # the two scrapes', give or take its documented snapshot age and its rounding to milliseconds.
        assert later - 0.001 <= state["window"]["seconds_left"] <= left + SNAPSHOT_S + 0.001
        assert 0 < later <= left <= 600
        assert values[("fdl_admissions_total", ())] == state["admissions"] == 2
        refusals = {dict(labels)["reason"]: v for (name, labels), v in values.items() if name == "fdl_refusals_total"}
        assert refusals == state["refusals"] == {"host_joined": 1, "signature_differs": 1}
        assert values[("fdl_http_requests_total", (("code", "200"), ("endpoint", "/join")))] == 2
        assert values[("fdl_http_requests_total", (("code", "409"), ("endpoint", "/join")))] == 2
        assert values[("fdl_run_info", (("controller", state["controller"]), ("kind", "discovery"),
                                        ("run_id", "r-live"), ("start_mode", "manual")))] == 1
        assert "process_resident_memory_bytes" in text

        with ControllerClient(f"127.0.0.1:{server.port}", token=server.policy.token) as client:
            client.start()
            client.report_exit(tickets[0], 0)
            client.report_exit(tickets[1], 3, "out of memory")
        values, state, text = consistent(server)
        promtool_accepts(text)
        assert state["phase"] == "failed" and values[("fdl_phase", (("phase", "failed"),))] == 1
        exits = {dict(labels)["code"]: v for (name, labels), v in values.items() if name == "fdl_host_exits_total"}
        assert exits == {"0": 1, "3": 1} and state["exits"] == {"0": 1, "3": 1}
        assert values[("fdl_world_size_ranks", ())] == state["world"]["size"] == 4
        assert values[("fdl_start_switch_fired", ())] == 1 and values[("fdl_window_open", ())] == 0
        assert not [k for k in values if k[0] == "fdl_deadline_seconds_left"]  # no open deadline any more
        # a scrape counts once answered: the second one sees the first
        assert values[("fdl_http_requests_total", (("code", "200"), ("endpoint", "/metrics")))] >= 1


def test_metrics_speak_openmetrics_when_asked_and_each_controller_has_its_own() -> None:
    with staging_run() as one, staging_run() as two:
        agent_hello(one, "node-a", "cpu:1")
        text, kind = scrape(one, "application/openmetrics-text; version=1.0.0")
        assert kind.startswith("application/openmetrics-text") and text.rstrip().endswith("# EOF")
        assert "fdl_admissions_total 1.0" in text
        text, kind = scrape(two)
        assert kind == "text/plain; version=0.0.4; charset=utf-8"
        assert "fdl_admissions_total 0.0" in text and 'fdl_phase{phase="waiting"} 1.0' in text


# ---------------------------------------------------------------- nothing waits on a slow reader


def test_slow_page_and_metrics_readers_do_not_hold_up_admission() -> None:
    """Readers that ask for the page and the metrics over and over and never read the answers fill their
    sockets and stall there; hosts keep being admitted meanwhile, and every stalled answer arrives whole
    once the readers read."""
    repeat, readers = 300, 4  # ~5 MiB of answers per reader: more than a loopback socket buffers (4 MiB)
    with serving(RunPolicy(start="manual", quorum_hosts=1, window_s=600, silence_s=900), span=PORTS) as server:
        ask = b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * repeat
        stuck = []
        for _ in range(readers):
            raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            raw.connect(("127.0.0.1", server.port))
            sock = tls_context().wrap_socket(raw)
            sock.sendall(ask)
            stuck.append(sock)
        try:
            def answered() -> int:
                counts = server.call(lambda m: dict(server.requests))
                return sum(n for (endpoint, _), n in counts.items() if endpoint in ("/", "/metrics"))

            seen, steady = -1, 0
            while steady < 5:  # until the server's writes to the readers have stalled
                time.sleep(0.1)
                now = answered()
                steady = steady + 1 if now == seen else 0
                seen = now
            asked = readers * repeat * 2
            assert seen < asked, "the readers never stalled; make the answers bigger"

            with ControllerClient(f"127.0.0.1:{server.port}", timeout=30, token=server.policy.token) as client:
                for i in range(12):
                    answer = client.hello({"host": f"walk-in-{i}", "devices": "cpu:1"})
                    assert answer["admitted"] is True
                metrics = tls_get(f"https://127.0.0.1:{server.port}/metrics", timeout=30).text
            assert "fdl_admissions_total 12.0" in metrics
            assert answered() < asked  # the readers were still stalled while all that happened

            for sock in stuck:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
                answers = read_answers(sock, repeat * 2)
                assert all(head.startswith(b"HTTP/1.1 200 OK") for head, _ in answers)
                assert [body.rstrip().endswith(b"</html>") for _, body in answers[::2]] == [True] * repeat
                assert all(b"# TYPE fdl_phase gauge" in body for _, body in answers[1::2])
        finally:
            for sock in stuck:
                sock.close()


def read_answers(sock: socket.socket, count: int) -> list[tuple[bytes, bytes]]:
    """Read count HTTP/1.1 answers (head, body) with Content-Length bodies from a pipelined connection."""
    sock.settimeout(60)
    buffer, answers = bytearray(), []
    while len(answers) < count:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            head = bytes(buffer[:end])
            length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
            if len(buffer) >= end + 4 + length:
                answers.append((head, bytes(buffer[end + 4:end + 4 + length])))
                del buffer[:end + 4 + length]
                continue
        chunk = sock.recv(1 << 20)
        assert chunk, "the server closed a stalled reader's connection"
        buffer += chunk
    return answers
