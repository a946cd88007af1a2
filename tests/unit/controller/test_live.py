"""Live-run records: written 0600, found while the launcher lives, stale ones ignored and removed."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

from fdl.controller.address import resolve
from fdl.controller.live import live_runs, remove_record, state_dir, write_record


def test_a_record_is_private_found_and_removed(tmp_path):
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": ""}
    path = write_record("127.0.0.1:40001", "127.0.0.1:1337", "abc", env)
    assert path.parent == tmp_path / ".flodl" / "launch" / "live"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # written through a temp file, none left
    [run] = live_runs(env)
    assert (run.address, run.configured, run.run_id, run.pid) == ("127.0.0.1:40001", "127.0.0.1:1337", "abc",
                                                                  os.getpid())
    remove_record(path)
    assert live_runs(env) == []


def test_a_record_of_a_dead_launcher_is_stale(tmp_path):
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path)}  # an existing runtime dir is preferred
    assert state_dir(env) == tmp_path / "fdl"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    pid = int(dead.stdout)
    stale = state_dir(env)
    stale.mkdir(parents=True)
    (stale / f"live-{pid}.json").write_text(json.dumps({"address": "127.0.0.1:40002", "configured": "x",
                                                        "run_id": "old", "pid": pid, "started": 1.0}))
    assert live_runs(env) == [] and not (stale / f"live-{pid}.json").exists()


def test_status_asks_a_moved_run_before_its_configured_address():
    from fdl.config.schema import ClusterSpec, ControllerSpec, SshDefaults
    from fdl.controller.live import LiveRun

    moved = LiveRun("127.0.0.1:40003", "127.0.0.1:1337", "r", os.getpid(), 1.0)
    cluster = ClusterSpec(controller=ControllerSpec(port=1337), ssh=SshDefaults(), workers=())
    target = resolve(None, lambda: cluster, lambda: [moved])
    assert target.addresses[:2] == ("127.0.0.1:40003", "127.0.0.1:1337")
    bare = resolve(None, lambda: None, lambda: [moved])
    assert bare.addresses == ("127.0.0.1:40003", "127.0.0.1:1337") and "pid" in bare.note
    assert resolve(None, lambda: None, lambda: []).source == "default"
    assert resolve("10.0.0.1:9", lambda: cluster, lambda: [moved]).addresses == ("10.0.0.1:9",)
