"""A launcher run whose window is a discovery window: the launcher's own worker and a walk-in (`fdl join`)
form one world, train together, and the run ends done. On loopback: a real launcher process, a real agent."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import fdl_env
from tests.integration.join.helpers import (
    agent_env,
    finish,
    results,
    spawn_join,
    train_binary,
    wait_for,
)
from tests.integration.launch.helpers import final_state, free_port, write_project

pytestmark = pytest.mark.slow


def listening(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_the_launchers_worker_and_a_walk_in_train_as_one_world(tmp_path):
    binary = train_binary(tmp_path / "bin")
    port = free_port()
    cluster = {"cluster": {"controller": {"host": "127.0.0.1", "port": port, "bind": "127.0.0.1",
                                          "join": {"discovery": True, "max_hosts": 2, "window_s": 120}},
                           "workers": [{"host": "here", "address": "127.0.0.1", "local_devices": "cpu:1"}]}}
    project = write_project(tmp_path / "proj", {"train": {"cluster": True, "bin": str(binary)}}, cluster)
    home = tmp_path / "home"
    launcher = subprocess.Popen([sys.executable, "-m", "fdl", "@cluster", "train"], cwd=project,
                                env=fdl_env(agent_env(home)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        wait_for(lambda: listening(port) or launcher.poll() is not None, timeout=60, what="the controller")
        # no token configured: the launcher made one for the run, 0600, where a walk-in on this box reads it
        (token_file,) = (home / ".flodl" / "launch" / "runs").glob("*/token")
        walk_in = spawn_join(f"127.0.0.1:{port}", "--bin", str(binary), "--host", "walker", "--devices", "cpu:1",
                             home=tmp_path / "walker", env={"FDL_JOIN_TOKEN": token_file.read_text().strip()})
        code, agent_out, agent_err = finish(walk_in, timeout=180)
        out, err = launcher.communicate(timeout=180)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode == 0, err + out
    assert code == 0, agent_err
    assert "plus walk-ins" in err and "world formed: 2 ranks on 2 host(s)" in err
    ranks = {int(r["rank"]): r for r in results(out) + results(agent_out)}
    assert sorted(ranks) == [0, 1] and {r["sum"] for r in ranks.values()} == {"3"}
    assert ranks[0]["host"] == "here" and ranks[1]["host"] == "walker"  # admission order: the launcher's first
    assert not token_file.exists()  # the run's token went with it (issue 37, finding 7)
    state = final_state(home)
    assert state["phase"] == "done" and state["kind"] == "discovery"
    assert {m["host"]: m["exit_code"] for m in state["roster"]} == {"here": 0, "walker": 0}


def test_a_watch_that_missed_the_end_of_a_discovery_run_finds_its_outcome(tmp_path):
    """regression (issue 38 item 9): `fdl status --watch --interval 2` exited 1 "outcome unknown" after a
    discovery run that succeeded: its looks missed the short `done` window, and the launcher's kept final state
    was looked up by the cohort's run id, which a discovery cohort of walk-ins without a published run has not."""
    binary = train_binary(tmp_path / "bin")
    port = free_port()
    cluster = {"cluster": {"controller": {"host": "127.0.0.1", "port": port, "bind": "127.0.0.1",
                                          "join": {"discovery": True, "max_hosts": 2, "window_s": 120}},
                           "workers": [{"host": "here", "address": "127.0.0.1", "local_devices": "cpu:1"}]}}
    project = write_project(tmp_path / "proj", {"train": {"cluster": True, "bin": str(binary)}}, cluster)
    home = tmp_path / "home"
    env = fdl_env(agent_env(home))
    env.pop("FDL_JOIN_TOKEN")  # the watch finds the run's token as the launcher's user does: beside its record
    launcher = subprocess.Popen([sys.executable, "-m", "fdl", "@cluster", "train"], cwd=project, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch = None
    try:
        wait_for(lambda: listening(port) or launcher.poll() is not None, timeout=60, what="the controller")
        watch = subprocess.Popen([sys.executable, "-m", "fdl", "status", "--watch", "--interval", "2", "--addr",
                                  f"127.0.0.1:{port}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        (token_file,) = (home / ".flodl" / "launch" / "runs").glob("*/token")
        walk_in = spawn_join(f"127.0.0.1:{port}", "--bin", str(binary), "--host", "walker", "--devices", "cpu:1",
                             home=tmp_path / "walker", env={"FDL_JOIN_TOKEN": token_file.read_text().strip()})
        code, _, agent_err = finish(walk_in, timeout=180)
        _, err = launcher.communicate(timeout=180)
        watched, watch_err = watch.communicate(timeout=60)
    finally:
        for proc in (launcher, watch):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert launcher.returncode == 0 and code == 0, err + agent_err
    state = final_state(home)
    assert state["phase"] == "done" and state["kind"] == "discovery" and state["run_id"] is None
    lines = watched.strip().splitlines()
    assert lines[-1] == "fdl: the run succeeded: every rank exited 0.", watched + watch_err
    assert watch.returncode == 0, watched + watch_err
    assert state["launch_id"] == token_file.parent.name  # the launcher's own id names the run's directory
