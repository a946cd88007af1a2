"""fdl.cluster.runner against real sshd hosts: per-host results, secrets off argv, cancellation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fdl.cluster.inventory import build_inventory
from fdl.config.schema import ClusterSpec, ControllerSpec, SshDefaults, WorkerSpec
from tests.conftest import REPO
from tests.testbed import Testbed

pytestmark = [pytest.mark.testbed(hosts=4), pytest.mark.slow]
PLAYBOOKS = Path(__file__).parent / "playbooks"


def inventory_for(bed: Testbed, keys: dict[str, Path] | None = None):
    bed.verify()  # the bridge and namespaces exist before any traffic
    keys = keys or {}
    workers = tuple(WorkerSpec(host=h.name, address=h.address, user=h.user, identity=str(keys.get(h.name, h.key)))
                    for h in bed.hosts)
    ssh = SshDefaults(known_hosts=str(bed.known_hosts))
    return build_inventory(ClusterSpec(ControllerSpec(host=bed.hosts[0].address), ssh, workers))


@pytest.fixture
def home(testbed, monkeypatch, short_tmp):
    for key, value in testbed.home_env(short_tmp / "home").items():
        monkeypatch.setenv(key, value)
    return short_tmp / "home"


def test_each_host_gets_its_own_outcome(testbed, home):
    from fdl.cluster.runner import run_playbook

    stranger = testbed.new_key("stranger")
    inventory = inventory_for(testbed, {"h4": stranger})
    events = []
    result = run_playbook(PLAYBOOKS / "mixed.yml", inventory, extravars={"secret": "hunter2-s3cr3t"},
                          on_event=events.append, progress=False)
    hosts = result.hosts
    assert hosts["h1"].status == "ok", hosts["h1"].message
    answer = next(t for t in hosts["h1"].tasks
                  if t.task == "Answer with the login user and the secret's length, fail on h2, skip h3")
    assert answer.res["stdout"] == testbed.hosts[0].user
    assert hosts["h1"].res["ansible_facts"]["seen_secret_length"] == 14  # the extra variable arrived
    assert hosts["h2"].status == "failed"
    assert hosts["h2"].res["stdout"] == testbed.hosts[1].user  # a failed task still carries its result
    assert hosts["h3"].status == "skipped"
    assert all(t.res is None for t in hosts["h3"].tasks)  # skipped events carry no result
    assert hosts["h4"].status == "unreachable"
    assert "Permission denied" in hosts["h4"].message
    assert not result.ok
    assert {e.kind for e in events} >= {"on_start", "on_ok", "on_failed", "on_skipped", "on_unreachable"}
    # the secret went through a 0600 file, never the command line
    command = (result.artifact_dir / "command").read_text()
    assert "hunter2-s3cr3t" not in command
    assert not list((result.artifact_dir.parent.parent / "tmp").glob("*.json"))  # the vars file is gone


def test_the_probe_as_fdl_runs_it_is_validated_and_leaves_only_the_verdict_out(testbed, home):
    """The probe as fdl runs it (fdl.cluster.probe's extra variables): the role's argument validation, then the
    probe, with no verdict task; by default the role also ends with the host's verdict. Validation is never
    left out, for fdl's runs either."""
    from fdl.cluster.probe import ClusterProbeOptions, probe_extravars
    from fdl.cluster.runner import run_playbook

    inventory = inventory_for(testbed)
    tasks = {}
    for case, extravars in (("default", {"fdl_probe_skip_mount": True}),
                            ("fdl", probe_extravars(ClusterProbeOptions(skip_mount=True)))):
        events = []
        run_playbook("probe.yml", inventory, extravars=extravars, on_event=events.append, progress=False)
        tasks[case] = [e.task for e in events if e.kind in ("on_ok", "on_failed", "on_skipped") and e.host == "h1"]
    assert len(tasks["default"]) == 3, tasks["default"]
    assert tasks["default"][0].startswith("Validating arguments against arg spec 'main'")
    assert tasks["default"][2] == "Say whether the host is ready"
    assert tasks["fdl"][0].startswith("Validating arguments against arg spec 'probe'")
    assert tasks["fdl"][1:] == tasks["default"][1:2]  # the probe itself, and no verdict (not even a skipped task)


def test_the_probe_playbook_validates_by_default_and_names_the_wrong_variable(testbed, home):
    from fdl.cluster.runner import run_playbook

    events = []
    result = run_playbook("probe.yml", inventory_for(testbed).subset(["h1"]),
                          extravars={"fdl_probe_skip_mount": "not a boolean"}, on_event=events.append, progress=False)
    failed = [e for e in events if e.kind == "on_failed" and e.host == "h1"]
    assert not result.ok and failed and failed[0].task.startswith("Validating arguments against arg spec")
    assert "fdl_probe_skip_mount" in str(failed[0].res)


def test_a_run_can_return_at_its_final_stats_and_settle_later(testbed, home):
    """return_at_stats: every host's outcome as an inline run has it, the run's own end (process exit, artifacts)
    waited for by settle() or the next run."""
    from fdl.cluster import runner

    inventory = inventory_for(testbed, {"h4": testbed.new_key("outsider")})
    result = runner.run_playbook(PLAYBOOKS / "mixed.yml", inventory, extravars={"secret": "hunter2-s3cr3t"},
                                 progress=False, return_at_stats=True)
    assert {n: h.status for n, h in result.hosts.items()} == {"h1": "ok", "h2": "failed", "h3": "skipped",
                                                              "h4": "unreachable"}
    assert result.status == "failed" and result.rc == 2 and not result.ok
    runner.settle()
    assert runner._winding_down == []
    assert (result.artifact_dir / "status").read_text() == "failed"  # the run's own end, written in the background
    assert not list((result.artifact_dir.parent.parent / "tmp").glob("*.json"))  # the vars file is gone


def test_a_second_run_reuses_the_ssh_masters(testbed, home):
    from fdl.cluster.connection import control_path_dir
    from fdl.cluster.runner import run_playbook

    inventory = inventory_for(testbed)
    result = run_playbook(PLAYBOOKS / "mixed.yml", inventory.subset(["h1"]), extravars={"secret": "x"},
                          progress=False)
    assert result.hosts["h1"].status == "ok"
    sockets = list(control_path_dir().iterdir())
    assert len(sockets) == 1 and sockets[0].is_socket()  # one persistent master per host, kept for the next run


def _sleepers(bed: Testbed) -> dict[str, list[int]]:
    found = {}
    for host in bed.hosts:
        pids = []
        for pid in host.user_pids():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline and cmdline[0] in (b"sleep", b"/usr/bin/sleep"):
                pids.append(pid)
        if pids:
            found[host.name] = pids
    return found


@pytest.mark.parametrize("at_stats", [False, True], ids=["inline", "return-at-stats"])
def test_ctrl_c_stops_the_run_and_leaves_nothing_running_remotely(testbed, home, at_stats):
    """SIGINT to a process inside run_playbook: the run is canceled, the hosts are swept, KeyboardInterrupt (also
    when the run goes on in a thread of its own until its stats, as the launcher's staging does)."""
    hosts = [{"host": h.name, "address": h.address, "user": h.user, "identity": str(h.key)} for h in testbed.hosts]
    driver = textwrap.dedent(f"""
        import json, sys
        from fdl.cluster.inventory import build_inventory
        from fdl.config.schema import ClusterSpec, ControllerSpec, SshDefaults, WorkerSpec
        from fdl.cluster.runner import run_playbook
        workers = tuple(WorkerSpec(**w) for w in json.loads(sys.argv[1]))
        ssh = SshDefaults(known_hosts={str(testbed.known_hosts)!r})
        inv = build_inventory(ClusterSpec(ControllerSpec(host=workers[0].address), ssh, workers))
        try:
            run_playbook({str(PLAYBOOKS / 'sleep.yml')!r}, inv.subset([w.host for w in workers]), progress=False,
                         return_at_stats={at_stats!r})
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
        print("finished", flush=True)
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", driver, json.dumps(hosts)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(_sleepers(testbed)) < len(testbed.hosts):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the sleeps never started on every host"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert out.strip() == "interrupted"
    assert _sleepers(testbed) == {}
