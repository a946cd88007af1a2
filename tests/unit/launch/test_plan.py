"""Launch planning: which mode a cluster command runs in, which host --gpus reaches, what ranks run."""

from __future__ import annotations

from pathlib import Path

import pytest

from fdl.config.schema import ClusterSpec, CommandSpec, ControllerSpec, JoinPolicy, SshDefaults, WorkerSpec
from fdl.errors import ConfigError
from fdl.gpus import GpuSelection
from fdl.hostside.checks.devices import Devices
from fdl.launch.plan import CLUSTER, SINGLE, plan_launch

ROOT = Path("/proj")
TRAIN = CommandSpec(name="train", cluster=True, bin="target/release/train", args=("--epochs", "3"))


def cluster(*workers: WorkerSpec, discovery: bool = False) -> ClusterSpec:
    return ClusterSpec(controller=ControllerSpec(host="10.0.0.1", port=26100, join=JoinPolicy(discovery=discovery)),
                       ssh=SshDefaults(), workers=tuple(workers))


def worker(name: str, devices: Devices, address: str | None = None) -> WorkerSpec:
    return WorkerSpec(host=name, address=address or name, local_devices=devices)


def local_if(*addresses: str):
    return lambda address, port: address in addresses


def test_cluster_workers_make_a_cluster_run_with_the_command_line_args_after_the_commands():
    spec = cluster(worker("a", Devices(ids=(0, 1))), worker("b", Devices(kind="cpu", count=2)))
    plan = plan_launch(TRAIN, ["--lr", "1"], spec, ROOT, is_local=local_if())
    assert plan.mode == CLUSTER and plan.ranks == 4
    assert plan.args == ("--epochs", "3", "--lr", "1")
    assert [h.local for h in plan.hosts] == [False, False]
    assert plan.bind == "0.0.0.0" and plan.port == 26100 and plan.controller_addr == "10.0.0.1:26100"
    policy = plan.policy()
    assert policy.run_id == plan.run_id and policy.roster_names == ("a", "b") and policy.master_port == 26101
    assert plan.rank_argv("/x/train") == ["/x/train", "--epochs", "3", "--lr", "1"]


def test_gpus_replace_the_devices_of_this_machines_worker_only():
    spec = cluster(worker("here", Devices(ids=(0,)), "10.0.0.1"), worker("there", Devices(ids=(0, 1))))
    plan = plan_launch(TRAIN, [], spec, ROOT, GpuSelection("2,3", (2, 3)), is_local=local_if("10.0.0.1"))
    assert [h.devices for h in plan.hosts] == [Devices(ids=(2, 3)), Devices(ids=(0, 1))]
    assert plan.hosts[0].local and not plan.hosts[1].local
    assert any("replaces local_devices of here" in note for note in plan.notes)


def test_gpus_with_no_local_worker_says_it_changes_nothing():
    spec = cluster(worker("there", Devices(ids=(0, 1))))
    plan = plan_launch(TRAIN, [], spec, ROOT, GpuSelection("0", (0,)), is_local=local_if())
    assert plan.hosts[0].devices == Devices(ids=(0, 1))
    assert any("none of cluster.workers is this machine" in note for note in plan.notes)


def test_a_remote_worker_offering_all_gpus_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"cluster.workers\[b\]: local_devices is not set .* cpu:N"):
        plan_launch(TRAIN, [], cluster(worker("b", Devices())), ROOT, is_local=local_if())


def test_this_machines_worker_offering_all_gpus_counts_them():
    plan = plan_launch(TRAIN, [], cluster(worker("a", Devices(), "127.0.0.1")), ROOT, is_local=local_if("127.0.0.1"),
                       gpu_count=lambda: 3)
    assert plan.hosts[0].devices == Devices(ids=(0, 1, 2))


def test_discovery_window_without_workers_is_a_launcher_run_whose_run_id_is_left_to_the_walk_ins():
    plan = plan_launch(TRAIN, [], cluster(discovery=True), ROOT, is_local=local_if())
    assert plan.mode == CLUSTER and plan.hosts == () and plan.discovery
    assert plan.policy().run_id is None


@pytest.mark.parametrize(("gpus", "local", "count", "expected"), [
    (None, Devices(kind="cpu", count=2), None, Devices(kind="cpu", count=2)),
    (GpuSelection("0,1", (0, 1)), None, 2, Devices(ids=(0, 1))),
    (GpuSelection("all", None), None, 4, Devices(ids=(0, 1, 2, 3))),
    (GpuSelection("3", (3,)), Devices(kind="cpu", count=2), 4, Devices(ids=(3,))),  # --gpus wins over local_devices
    (None, Devices(ids=(1,)), 2, Devices(ids=(1,))),
])
def test_single_host_promotion(gpus, local, count, expected):
    """The default port, as planned when it is free (whatever holds 127.0.0.1:1337 on the machine running the
    tests: is_free answers for the plan)."""
    spec = TRAIN._replace(local_devices=local)
    plan = plan_launch(spec, [], None, ROOT, gpus, gpu_count=lambda: count, environ={},
                       is_free=lambda host, port: True)
    assert plan is not None and plan.mode == SINGLE
    assert plan.hosts[0].devices == expected and plan.hosts[0].local
    assert (plan.bind, plan.port, plan.controller_addr) == ("127.0.0.1", 1337, "127.0.0.1:1337")
    policy = plan.policy()
    assert policy.roster[0].address == "127.0.0.1" and policy.master_port == 1338 and not policy.discovery


@pytest.mark.parametrize(("cluster_block", "which"), [(None, "the default controller port"),
                                                     (cluster(), "the configured controller port")])
def test_a_taken_port_from_the_configuration_moves_the_run_and_says_whose_port_it_was(cluster_block, which):
    spec = TRAIN._replace(local_devices=Devices(kind="cpu", count=2))
    plan = plan_launch(spec, [], cluster_block, ROOT, environ={}, is_free=lambda host, port: port not in (1337, 26100))
    assert plan is not None and plan.port not in (1337, 26100) and plan.controller_addr == f"127.0.0.1:{plan.port}"
    taken = 1337 if cluster_block is None else 26100
    assert plan.notes == (f"127.0.0.1:{taken} ({which}) is taken, so this run's controller listens on "
                          f"127.0.0.1:{plan.port} instead; plain `fdl status` still finds it (--port or FDL_PORT "
                          f"picks one)",)


@pytest.mark.parametrize(("gpus", "count"), [(None, 0), (GpuSelection("0", (0,)), 1), (GpuSelection("all", None), 1)])
def test_no_promotion_runs_once(gpus, count):
    assert plan_launch(TRAIN, [], None, ROOT, gpus, gpu_count=lambda: count) is None


def test_a_cluster_block_without_workers_sets_the_single_host_port():
    spec = TRAIN._replace(local_devices=Devices(kind="cpu", count=2))
    plan = plan_launch(spec, [], cluster(), ROOT, environ={}, is_free=lambda host, port: True)
    assert plan.mode == SINGLE and plan.port == 26100 and plan.controller_addr == "127.0.0.1:26100"


def test_gpus_all_on_a_box_without_gpus_says_so():
    spec = TRAIN._replace(local_devices=Devices(kind="cpu", count=2))
    with pytest.raises(ConfigError, match="NVML sees none"):
        plan_launch(spec, [], None, ROOT, GpuSelection("all", None), gpu_count=lambda: 0)


def test_a_shell_line_runs_with_its_args_quoted():
    spec = CommandSpec(name="t", cluster=True, run="python3 train.py", local_devices=Devices(kind="cpu", count=1))
    plan = plan_launch(spec, ["a b"], None, ROOT, environ={}, is_free=lambda host, port: True)
    assert plan.rank_argv(None) == ["/bin/sh", "-c", "python3 train.py 'a b'"]
