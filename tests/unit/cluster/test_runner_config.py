"""What the runner pins for every ansible-playbook it starts, and the playbook contract it relies on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import yaml

from fdl.cluster.runner import RUN_ID_VAR, ansible_bin_dir, ansible_environment, control_path_dir
from fdl.resources import share_dir
from tests.conftest import REPO


def test_settings_come_from_the_shipped_config_and_beat_stray_environment(monkeypatch, short_tmp):
    tmp_path = short_tmp
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("ANSIBLE_PIPELINING", "False")  # a user's setting must not slow fdl down
    env = ansible_environment(7)
    assert env["ANSIBLE_CONFIG"] == str(share_dir() / "ansible.cfg")
    assert env["ANSIBLE_PIPELINING"] == "True"
    assert env["ANSIBLE_GATHERING"] == "explicit"
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert "StrictHostKeyChecking=accept-new" in env["ANSIBLE_SSH_ARGS"]
    assert "ControlPersist=" in env["ANSIBLE_SSH_ARGS"]
    assert env["ANSIBLE_SSH_CONTROL_PATH"] == "%(directory)s/%%C"
    assert env["ANSIBLE_SSH_CONTROL_PATH_DIR"] == str(tmp_path / "fdl" / "cp")
    assert env["ANSIBLE_FORKS"] == "7"
    assert env["PATH"].split(os.pathsep)[0] == str(ansible_bin_dir())
    assert (ansible_bin_dir() / "ansible-playbook").exists()
    assert env["ANSIBLE_MODULE_UTILS"].startswith(str(tmp_path / "fdl" / "module_utils"))


def test_control_sockets_move_to_a_short_path_when_the_cache_is_deep(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ("d" * 80)))
    assert len(str(control_path_dir())) < 50


def test_module_utils_dir_links_the_check_library_and_pynvml(monkeypatch, tmp_path):
    from fdl.cluster.modutils import module_utils_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = module_utils_dir()
    assert (first / "fdl_checks" / "probe.py").resolve() == (REPO / "fdl" / "checks" / "probe.py").resolve()
    assert (first / "pynvml.py").is_symlink()
    assert module_utils_dir() == first  # made once, then reused


def test_every_shipped_playbook_marks_its_processes_with_the_run_id():
    """The Ctrl-C sweep finds a run's remote processes by FDL_RUN_ID: every play must export it."""
    for path in sorted((share_dir() / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(path.read_text()):
            environment = play.get("environment") or {}
            assert "FDL_RUN_ID" in environment and RUN_ID_VAR in environment["FDL_RUN_ID"], (path.name, play["name"])


def test_a_local_probe_never_loads_ansible(tmp_path):
    code = textwrap.dedent("""
        import sys
        from fdl.cli.main import main
        main(["probe", "--json", "--skip-mount"])
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("ansible", "ansible_runner"))
        print("LOADED:" + ",".join(loaded))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "LOADED:"


def test_progress_table_shows_each_hosts_state_and_task():
    from rich.console import Console

    from fdl.cluster.runner import HostResult, _Progress

    progress = _Progress("probe", ["node-a", "node-b", "node-c"])
    progress.update({"node-a": HostResult("node-a", status="ok"),
                     "node-b": HostResult("node-b", status="running", current_task="Probe this host"),
                     "node-c": HostResult("node-c", status="unreachable", message="Permission denied (publickey)")})
    console = Console(record=True, width=100)
    console.print(progress)
    text = console.export_text()
    assert "probe: 2/3 hosts done" in text
    assert "node-b" in text and "running" in text and "Probe this host" in text
    assert "unreachable" in text and "Permission denied (publickey)" in text
