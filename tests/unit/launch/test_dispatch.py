"""Rank specs and the ssh command line a remote host's supervisor runs under."""

from __future__ import annotations

from pathlib import Path

from fdl.cluster.inventory import build_inventory
from fdl.cluster.runner import control_path_dir
from fdl.cluster.ssh import login, rsync_rsh, ssh_argv
from fdl.config import schema
from fdl.launch.dispatch import rank_specs
from fdl.launch.plan import plan_launch

CPU2 = schema.Devices(kind="cpu", count=2)


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
