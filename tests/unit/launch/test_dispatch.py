"""Rank specs, the staging layout and the playbook's answer, and the ssh session a remote host's supervisor
runs under."""

from __future__ import annotations

from pathlib import Path

from fdl.cluster.connection import control_path_dir
from fdl.cluster.inventory import build_inventory
from fdl.cluster.ssh import login, rsync_rsh, ssh_argv
from fdl.config import schema
from fdl.hostside.checks.devices import Devices
from fdl.launch.dispatch import rank_specs
from fdl.launch.plan import plan_launch

CPU2 = Devices(kind="cpu", count=2)


def spec(discovery: bool = False) -> schema.ClusterSpec:
    worker = schema.WorkerSpec(host="b", address="10.0.0.12", user="op", port=2222, identity="keys/id",
                        local_devices=CPU2, env=(("LD_PRELOAD", "/x/libnccl.so.2"), ("RANK", "from-worker")))
    return schema.ClusterSpec(controller=schema.ControllerSpec(join=schema.JoinPolicy(discovery=discovery)),
                       ssh=schema.SshDefaults(known_hosts="/etc/fdl/known_hosts"), workers=(worker,))


def test_rank_env_is_the_worlds_over_the_workers_env():
    plan = plan_launch(schema.CommandSpec(name="t", cluster=True, run="true"), [], spec(), Path("/p"),
                       is_local=lambda a, p: False)
    assignment = {"ranks": [{"rank": 4, "env": {"RANK": "4", "FDL_RUN_ID": "abc"}}]}
    (entry,) = rank_specs(plan, plan.hosts[0], assignment)
    assert entry["rank"] == 4
    assert entry["env"]["LD_PRELOAD"] == "/x/libnccl.so.2" and entry["env"]["RANK"] == "4"
    assert entry["env"]["FDL_RUN_ID"] == "abc"


def test_the_commands_env_is_under_the_workers_and_the_worlds():
    command = schema.CommandSpec(name="t", cluster=True, run="true", env=(("OMP_NUM_THREADS", "4"),
                                                                          ("LD_PRELOAD", "/job/lib.so")))
    plan = plan_launch(command, [], spec(), Path("/p"), is_local=lambda a, p: False)
    (entry,) = rank_specs(plan, plan.hosts[0], {"ranks": [{"rank": 0, "env": {"RANK": "0"}}]})
    assert entry["env"]["OMP_NUM_THREADS"] == "4"  # the job's, where neither host nor world says otherwise
    assert entry["env"]["LD_PRELOAD"] == "/x/libnccl.so.2" and entry["env"]["RANK"] == "0"


def test_a_cohort_without_run_id_gets_the_launchs_own():
    plan = plan_launch(schema.CommandSpec(name="t", cluster=True, run="true"), [], spec(discovery=True), Path("/p"),
                       is_local=lambda a, p: False)
    (entry,) = rank_specs(plan, plan.hosts[0], {"ranks": [{"rank": 0, "env": {"FDL_RUN_ID": ""}}]})
    assert entry["env"]["FDL_RUN_ID"] == plan.run_id


def test_ssh_argv_uses_the_inventorys_login_and_the_runners_control_path(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    host = build_inventory(spec(), Path("/proj")).hosts["b"]
    argv = ssh_argv(host)
    assert argv[0] == "ssh" and argv[-1] == "op@10.0.0.12" and login(host) == "op@10.0.0.12"
    joined = " ".join(argv)
    assert "-p 2222" in joined and "-i /proj/keys/id" in joined
    assert "-o UserKnownHostsFile=/etc/fdl/known_hosts" in joined
    assert f"ControlPath={control_path_dir()}/%C" in joined and "BatchMode=yes" in joined
    assert rsync_rsh(host).startswith("ssh ") and "op@10.0.0.12" not in rsync_rsh(host)


# --------------------------------------------------------------------------- the remote session, without ssh
# `sh -c REMOTE` stands in for `ssh host REMOTE`: the same remote command line, run here, so the session's
# streaming, result parsing and stdin-EOF teardown are exercised with the real supervisor file.

def staged_run(tmp_path: Path, argv: list[str], ranks: int = 2) -> dict:
    import json
    import shutil

    from fdl.hostside import supervisor

    run_dir = tmp_path / "runs" / "r1"
    (run_dir / "logs").mkdir(parents=True)
    shutil.copy(supervisor.__file__, tmp_path / "supervisor.py")
    spec = {"argv": argv, "cwd": str(run_dir), "log_dir": str(run_dir / "logs"), "label": "hx", "grace_s": 2,
            "watch_stdin": True, "ranks": [{"rank": r, "env": {"RANK": str(r)}} for r in range(ranks)]}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    return {"run_dir": str(run_dir), "supervisor": str(tmp_path / "supervisor.py"),
            "spec": str(run_dir / "spec.json")}


def session(tmp_path: Path, argv: list[str], lines: list[str]):
    import sys

    from fdl.launch.dispatch import RemoteSession
    from fdl.launch.plan import LaunchHost

    class Collect:
        def line(self, text: str) -> None:
            lines.append(text)

        def note(self, text: str) -> None:
            lines.append("note: " + text)

    host = LaunchHost(name="hx", address="x", devices=CPU2, local=False,
                      worker=schema.WorkerSpec(host="hx", address="x", python=sys.executable))
    return RemoteSession(host, ["sh", "-c"], staged_run(tmp_path, argv), Collect(), "abc123")


def wait_done(s, timeout: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not s.done:
        assert time.monotonic() < deadline, "the session did not end"
        time.sleep(0.05)


def test_a_remote_session_streams_prefixed_lines_and_reports_each_rank(tmp_path):
    lines: list[str] = []
    s = session(tmp_path, ["sh", "-c", 'echo "hello from $RANK $FDL_RUN_ID"; exit $RANK'], lines)
    s.start()
    wait_done(s)
    outcome = s.outcome()
    assert outcome.code == 1 and outcome.codes == {0: 0, 1: 1} and outcome.first_rank == 1
    assert outcome.detail == "rank 1 exited 1"
    assert sorted(lines) == ["[hx/0] hello from 0 abc123", "[hx/1] hello from 1 abc123",
                             "note: hx: OMP_NUM_THREADS=1 for each of this host's 2 ranks, as torchrun does when "
                             "ranks share a host; set OMP_NUM_THREADS (environment, command or worker env:) to tune it"]
    assert (tmp_path / "runs/r1/logs/rank-1.log").read_text() == "hello from 1 abc123\n"


def test_closing_the_sessions_stdin_takes_its_ranks_down(tmp_path):
    lines: list[str] = []
    s = session(tmp_path, ["sh", "-c", "echo up; exec sleep 60"], lines)
    s.start()
    import time

    deadline = time.monotonic() + 30
    while len(lines) < 2:  # both ranks up
        assert time.monotonic() < deadline
        time.sleep(0.05)
    s.stop()  # what the launcher does to every other host when the run fails
    wait_done(s)
    outcome = s.outcome()
    assert outcome.code != 0 and set(outcome.codes) == {0, 1}
    assert outcome.detail == "ranks orphaned"


def test_a_session_that_cannot_start_is_a_failed_host(tmp_path):
    from fdl.launch.dispatch import RemoteSession
    from fdl.launch.plan import LaunchHost

    host = LaunchHost(name="hx", address="x", devices=CPU2, local=False)
    s = RemoteSession(host, [str(tmp_path / "no-ssh-here")], staged_run(tmp_path, ["true"]), None, "abc")
    s.start()
    assert s.done and s.outcome().code == 127 and "cannot run ssh" in s.outcome().detail


# ------------------------------------------------------------------- staging: the layout and the playbook's answer
# The layout is fdl.hostside.hoststage, the module_utils the fdl_dispatch_stage module runs on each host (the
# playbook itself runs on the testbed: tests/integration/launch/test_launch_testbed.py).

def stage_here(tmp_path: Path, sha: str = "", program: str = "") -> tuple[bool, dict, Path]:
    from fdl.hostside import hoststage

    root = tmp_path / "launch"
    params = {"run_id": "r1", "bin_dir": "train" if program else "", "program": program, "program_sha256": sha,
              "command": ["--epochs", "3"], "label": "hx", "grace_s": 2.0, "root": str(root),
              "ranks": [{"rank": 0, "env": {"RANK": "0", "FDL_DATA_PATH": "/data/x"}}]}
    changed, staged = hoststage.stage(params)
    return changed, staged, root


def test_staging_lays_out_the_run_with_the_spec_private(tmp_path):
    import json
    import stat

    from fdl.hostside import supervisor

    changed, staged, root = stage_here(tmp_path)
    assert changed
    assert {k: staged[k] for k in ("run_dir", "supervisor", "spec")} == {
        "run_dir": str(root / "runs/r1"), "supervisor": str(root / "supervisor.py"),
        "spec": str(root / "runs/r1/spec.json")}
    assert Path(staged["supervisor"]).read_text() == Path(supervisor.__file__).read_text()
    spec = json.loads(Path(staged["spec"]).read_text())
    assert spec["argv"] == ["--epochs", "3"] and spec["ranks"][0]["env"]["RANK"] == "0"
    assert stat.S_IMODE(Path(staged["spec"]).stat().st_mode) == 0o600
    assert (root / "runs/r1/logs").is_dir()
    assert stage_here(tmp_path)[0] is False  # the second time: the supervisor is current, nothing changed


def test_staging_says_whether_the_hosts_binary_is_current(tmp_path):
    import hashlib

    _, staged, root = stage_here(tmp_path, sha="0" * 64, program="train")
    assert staged["program_current"] is False  # nothing there yet: rsync must ship it
    (root / "bin" / "train" / "train").write_bytes(b"built")
    sha = hashlib.sha256(b"built").hexdigest()
    assert stage_here(tmp_path, sha=sha, program="train")[1]["program_current"] is True
    assert stage_here(tmp_path, sha="", program="train")[1]["program_current"] is False  # no sha: always ship


def test_staging_refuses_a_run_id_that_is_a_path():
    import pytest

    from fdl.hostside import hoststage

    with pytest.raises(hoststage.StageError, match="run_id must be a plain name"):
        hoststage.plan({"run_id": "../x", "label": "hx", "ranks": [], "command": ["a"]})


def test_the_playbooks_answer_is_read_from_the_modules_fact_and_a_failure_names_its_task():
    from fdl.cluster.events import FAILED, OK, SKIPPED, HostResult, TaskOutcome
    from fdl.launch.dispatch import _why, staged_paths

    paths = {"run_dir": "/h/r", "supervisor": "/h/s.py", "spec": "/h/r/spec.json"}
    stage = TaskOutcome("Lay out the run", OK, {"changed": False, "run_dir": "/h/r", "program_current": True,
                                                "ansible_facts": {"fdl_dispatch_staged": paths}})
    assert staged_paths([stage, TaskOutcome("Ship the binary", SKIPPED)]) == paths
    assert staged_paths([TaskOutcome("Lay out the run", OK, {"run_dir": "/h/r"})]) is None
    rsync = TaskOutcome("Ship the binary", FAILED, {"rc": 23, "cmd": ["rsync", "--archive"], "msg": "non-zero",
                                                    "stderr": "rsync: change_dir failed\nrsync error: code 23\n"})
    host = HostResult("h1", status=FAILED, tasks=[stage, rsync], message="non-zero")
    assert _why(host) == "Ship the binary: exited 23: rsync error: code 23"
    lost = HostResult("h2", status="unreachable", message="ssh: connect to host x port 22: No route to host",
                      tasks=[TaskOutcome("Lay out the run", "unreachable", {"unreachable": True, "msg": "x"})])
    assert _why(lost) == "Lay out the run: ssh: connect to host x port 22: No route to host"


def test_the_launcher_raises_its_open_files_limit_for_many_hosts():
    # three pipes per remote session: 1,000 hosts need more than the usual soft limit of 1,024
    import subprocess
    import sys

    code = ("import resource; from fdl.launch.hosts import open_files_for\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))\n"
            "note = open_files_for(1000)\n"
            "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard, note)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(None, 2)
    soft, hard = int(out[0]), int(out[1])
    assert soft == min(256 + 8 * 1000, hard) if hard != -1 else soft == 256 + 8 * 1000
    assert (out[2].strip() == "None") == (soft >= 256 + 8 * 1000)


def test_a_host_behind_a_node_is_staged_with_the_binary_its_node_receives(tmp_path, monkeypatch):
    """Its plan names the binary by its path in the node's job (beside the playbook), and the runner is told to ship
    that file to its node alone; a direct host's plan names the file here, and its rsync is this machine's."""
    from fdl.cluster import runner
    from fdl.cluster.events import OK, HostResult, TaskOutcome
    from fdl.launch.build import BuildJob
    from fdl.launch.dispatch import stage_remote

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    binary = tmp_path / "train"
    binary.write_text("#!/bin/sh\n")
    node = schema.ExecutionNodeSpec(host="rack", address="10.0.0.5")
    far = schema.WorkerSpec(host="far", address="192.168.1.7", local_devices=CPU2, via="rack")
    cluster = spec()._replace(workers=(*spec().workers, far), execution_nodes=(node,))
    plan = plan_launch(schema.CommandSpec(name="t", cluster=True, bin="train"), [], cluster, tmp_path,
                       is_local=lambda a, p: False)
    inventory = build_inventory(cluster, tmp_path)
    jobs = {h: BuildJob(host=h, arch=None, recipe=None, target_dir=None, env={}, log=tmp_path / "log",
                        artifact=binary, libtorch=None) for h in ("b", "far")}
    seen = {}

    def fake_run(playbook, inv, **kwargs):
        seen.update(kwargs)
        staged = {"ansible_facts": {"fdl_dispatch_staged": {"run_dir": "r", "supervisor": "s", "spec": "p"}}}
        hosts = {h: HostResult(host=h, status=OK, tasks=[TaskOutcome("stage", OK, staged)]) for h in kwargs["limit"]}
        return runner.RunResult(status="successful", rc=0, hosts=hosts, artifact_dir=tmp_path, run_id="x")

    monkeypatch.setattr(runner, "run_playbook", fake_run)
    stage_remote(plan, inventory, jobs, {"b": [], "far": []}, progress=False)
    entries = seen["extravars"]["fdl_dispatch_plan"]
    assert entries["b"]["artifact"] == str(binary)
    relative = entries["far"]["artifact"]
    assert relative.startswith("fdl-ship/") and relative.endswith("/train")
    assert seen["ship"] == {"far": {relative: binary}}
    assert "ControlPath=~/.cache/fdl/cp/%C" in entries["far"]["rsh"] and "~" not in entries["b"]["rsh"]
