"""examples/cluster/try-walk-in (issue 38 item 10): a discovery run and a walk-in on one machine, end to end, as
the docs say to run it: the launcher prints the line a walk-in joins with, the walk-in joins with it through a
`--bin` wrapper of the demo's Python script, `fdl status` shows the window before and after, `fdl start` fires the
switch, `fdl status --watch` ends in the verdict; both ranks train as one world; nothing is left running and
nothing is written into the clone. Ctrl-C mid-training stops the launcher, the walk-in and every rank."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.test_try_local import clone_status, need_torch, processes_mentioning, suite_bin

SCRIPT = REPO / "examples" / "cluster" / "try-walk-in"
CHECKSUM = re.compile(r"\[(here/0|walk-in/1)\] rank \d/2 on \S+: 30 steps, loss \S+, weights checksum ([0-9a-f]{16})$",
                      re.M)

pytestmark = pytest.mark.slow


def account(tmp_path: Path) -> dict:
    """A fresh home, fdl on PATH from the suite's environment, nothing else of fdl's set."""
    home = tmp_path / "home"
    (home / "tmp").mkdir(parents=True)
    os.chmod(home / "tmp", 0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FDL_", "XDG_", "GLOO_"))}
    env.update(HOME=str(home), TMPDIR=str(home / "tmp"),
               PATH=f"{suite_bin(tmp_path / 'bin')}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}")
    return env


def test_a_discovery_run_takes_a_walk_in_through_status_start_and_watch(tmp_path: Path) -> None:
    need_torch()
    env = account(tmp_path)
    before = clone_status()
    done = subprocess.run([str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, out + err
    # 2. the launcher's walk-in line: the controller's address, the token by reference, never the token
    line = re.search(r"the launcher printed the walk-in line: (.*)$", err, re.M)[1]
    token = re.fullmatch(r'FDL_JOIN_TOKEN="\$\(cat (~/\.flodl/launch/runs/\w+/token)\)" fdl join 127\.0\.0\.1:(\d+) '
                         r"--bin PROGRAM --devices DEVICES", line)
    assert token, line
    # the launcher made a 256-bit token (64 hex digits) and removed its file when the run ended; no such
    # string shows anywhere in what the try printed
    assert not (Path(env["HOME"]) / token[1][2:]).exists()
    assert not re.search(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])", out + err)
    # 3. one host in, waiting for the second; 5. quorum met, the switch startable
    assert "quorum: not met: 1 host(s), 1 rank(s) joined; needs 2 host(s)" in out
    assert "quorum: met: 2 host(s), 2 rank(s) joined; needs 2 host(s)" in out
    assert "switch: roster startable, fire with fdl @discovery start" in out
    # 4. the walk-in ran that line, its PROGRAM a wrapper of the Python script, and joined unsigned without noise
    assert f"fdl join 127.0.0.1:{token[2]} --bin " in err and "walk-in-train --devices cpu:1 --host walk-in &" in err
    assert "[walk-in] fdl: join: admitted by" in err and "Traceback" not in err
    # 6. the switch, 7. the watch's verdict
    assert "start armed at 127.0.0.1:" in out
    assert out.strip().splitlines()[-1] == "fdl: the run succeeded: every rank exited 0."
    sums = dict(CHECKSUM.findall(err))
    assert set(sums) == {"here/0", "walk-in/1"} and len(set(sums.values())) == 1, err
    assert "try-walk-in: OK: the walk-in joined the discovery window" in err
    time.sleep(0.5)
    assert not processes_mentioning(str(tmp_path)), processes_mentioning(str(tmp_path))
    assert not list((tmp_path / "home" / "tmp").glob("fdl-try-walk-in.*")), "the script's directory is still there"
    assert clone_status() == before  # the demo ran in a copy of examples/quickstart


def test_ctrl_c_mid_training_stops_the_launcher_the_walk_in_and_their_ranks(tmp_path: Path) -> None:
    need_torch()
    env = account(tmp_path)
    proc = subprocess.Popen([str(SCRIPT), "--steps", "100000"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 300
        for line in proc.stderr:
            lines.append(line)
            if "this host runs rank(s) 1" in line:
                break
            assert time.monotonic() < deadline, "".join(lines)
        else:
            out, err = proc.communicate(timeout=60)
            pytest.fail("the walk-in never got its rank:\n" + "".join(lines) + err + out)
        time.sleep(2)  # both ranks training
        assert any("train.py" in p for p in processes_mentioning(str(tmp_path)))
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = "".join(lines) + err
    assert proc.returncode == 130, err
    assert "try-walk-in: exit 130; the launcher and the walk-in are stopped and the directory removed." in err
    time.sleep(0.5)
    assert not processes_mentioning(str(tmp_path)), processes_mentioning(str(tmp_path))
    assert not list((tmp_path / "home" / "tmp").glob("fdl-try-walk-in.*"))


def test_a_shell_of_its_own_leaves_nothing_it_started_running(tmp_path: Path) -> None:
    """`try-walk-in -- CMD`: what CMD started and left behind (a launcher still waiting for walk-ins) is stopped
    when it ends, with the project."""
    env = account(tmp_path)
    left = ('fdl @discovery train > launcher.log 2>&1 & '
            'until grep -q "a walk-in joins with" launcher.log; do sleep 0.2; done; fdl @discovery status')
    done = subprocess.run([str(SCRIPT), "--", "bash", "-c", left], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "THAT LINE &" in done.stderr and "quorum: not met" in done.stdout
    time.sleep(0.5)
    assert not processes_mentioning(str(tmp_path)), processes_mentioning(str(tmp_path))
    assert not list((tmp_path / "home" / "tmp").glob("fdl-try-walk-in.*"))
