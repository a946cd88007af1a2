"""The one process sweep (fdl.hostside.supervisor: signal_processes, end_processes, processes_with_env,
stop_process_group) and the canceled run's sweep over it (fdl.hostside.reap, the fdl_reap module), on real
processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fdl.hostside.envvars import FDL_RUN_ID
from fdl.hostside.reap import reap
from fdl.hostside.supervisor import processes_with_env, stop_process_group

RUN = "3f2a9c0e7b1d4e6f"
# a process of the run that starts a child in a session of its own (out of its process group), then waits
PARENT = ("import subprocess, sys, time, pathlib\n"
          "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
          "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'], start_new_session=True)\n"
          "pathlib.Path(sys.argv[1]).write_text(str(child.pid))\ntime.sleep(120)\n")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start(tmp_path: Path, run_id: str, name: str) -> tuple[subprocess.Popen[bytes], int]:
    """A process whose environment carries run_id, and its (SIGTERM-ignoring) child."""
    pidfile = tmp_path / f"{name}.pid"
    proc = subprocess.Popen([sys.executable, "-c", PARENT, str(pidfile)], env={**os.environ, FDL_RUN_ID: run_id})
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text()):
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    return proc, int(pidfile.read_text())


def gone_soon(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_a_canceled_runs_processes_and_their_descendants_are_stopped(tmp_path):
    ours, our_child = start(tmp_path, RUN, "ours")
    theirs, their_child = start(tmp_path, "0" * 16, "theirs")  # another run on the same host
    try:
        assert processes_with_env(FDL_RUN_ID, RUN) == sorted([ours.pid, our_child])
        assert reap(RUN, 0.5, check_mode=True) == sorted([ours.pid, our_child])  # listed, not signalled
        assert alive(ours.pid) and alive(our_child)
        assert reap(RUN, 0.5) == sorted([ours.pid, our_child])
        ours.wait(timeout=10)
        assert gone_soon(our_child)  # it ignored SIGTERM: SIGKILL after the grace
        assert alive(theirs.pid) and alive(their_child)
    finally:
        for pid in (theirs.pid, their_child, ours.pid, our_child):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        ours.wait()
        theirs.wait()


def test_the_sweep_spares_its_caller_and_the_callers_ancestors(tmp_path):
    """The fdl_reap module runs under the play's environment, which may carry the run id itself."""
    code = ("import json, sys\nsys.path.insert(0, sys.argv[1])\nfrom fdl.hostside.reap import reap\n"
            f"print(json.dumps(reap({RUN!r}, 0.5)))\n")
    shell = subprocess.run(["/bin/sh", "-c", f'"{sys.executable}" -c "$0" "$1"', code, str(Path.cwd())],
                           env={**os.environ, FDL_RUN_ID: RUN}, capture_output=True, text=True, timeout=60)
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.strip() == "[]"


@pytest.mark.parametrize("run_id", ["", "3F2A", "../x", "abc def"])
def test_a_run_id_that_is_not_hex_is_refused(run_id):
    with pytest.raises(ValueError, match="run_id must be the hex id of an fdl run"):
        reap(run_id, 0.5)


def test_a_stopped_group_leaves_nothing_in_its_group(tmp_path):
    """regression: the group's leader ending on SIGTERM ended the stop, and a member that ignored SIGTERM lived
    on (stop_process_group waited for the leader only)."""
    pidfile = tmp_path / "member.pid"
    member = ("import os, pathlib, signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))\ntime.sleep(120)\n")
    leader = ("import subprocess, sys, time\n"
              f"subprocess.Popen([sys.executable, '-c', {member!r}, sys.argv[1]])\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", leader, str(pidfile)], start_new_session=True)
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    member = int(pidfile.read_text())  # written once it has set SIGTERM aside
    try:
        stop_process_group(proc, grace_s=5.0)
        assert proc.returncode == -signal.SIGTERM  # the leader went on SIGTERM, within the grace
        assert gone_soon(member)
    finally:
        if alive(member):
            os.kill(member, signal.SIGKILL)
