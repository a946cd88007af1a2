"""World assignment: the torch.distributed environment each rank receives."""

from __future__ import annotations

import json
from types import SimpleNamespace

from fdl.controller.world import TORCHRUN_ENV, build_world
from fdl.hostside.checks.devices import parse_devices


def member(host: str, devices: str, address: str, data_path: str = "/flodl/data", share: float | None = None):
    return SimpleNamespace(host=host, devices=parse_devices(devices), address=address, data_path=data_path,
                           gpu_ram_share=share)


def test_gpu_world_env_is_what_init_process_group_reads() -> None:
    world = build_world([member("a", "2,3", "10.0.0.11"), member("b", "0", "10.0.0.12", "/mnt/d", 0.5)],
                        run_id="r1", master_addr=None, master_port=1338, controller="10.0.0.1:1337",
                        args=("--epochs", "3"))
    assert world.size == 3 and world.backend == "nccl" and world.master_addr == "10.0.0.11"
    a = world.assignment("a")
    assert a["node_rank"] == 0 and a["world"]["args"] == ["--epochs", "3"]
    envs = [r["env"] for r in a["ranks"]]
    assert [(e["RANK"], e["LOCAL_RANK"]) for e in envs] == [("0", "0"), ("1", "1")]
    first = envs[1]
    assert first["MASTER_ADDR"] == "10.0.0.11" and first["MASTER_PORT"] == "1338"
    assert first["WORLD_SIZE"] == "3" and first["LOCAL_WORLD_SIZE"] == "2"
    # every offered device is visible; LOCAL_RANK indexes into them (what torchrun does)
    assert first["CUDA_VISIBLE_DEVICES"] == "2,3" and first["FDL_DEVICE"] == "cuda:3"
    assert first["FDL_RUN_ID"] == "r1" and first["FDL_CONTROLLER"] == "10.0.0.1:1337"
    assert first["FDL_DATA_PATH"] == "/flodl/data" and "FDL_GPU_RAM_SHARE" not in first
    b = world.assignment("b")["ranks"][0]["env"]
    assert b["RANK"] == "2" and b["GROUP_RANK"] == "1" and b["FDL_NUM_NODES"] == "2"
    assert b["FDL_DATA_PATH"] == "/mnt/d" and b["FDL_GPU_RAM_SHARE"] == "0.5"
    assert all(isinstance(v, str) for v in b.values())


def test_cpu_ranks_hide_gpus_and_use_gloo() -> None:
    world = build_world([member("a", "cpu:2", "127.0.0.1")], run_id=None, master_addr="10.9.9.9",
                        master_port=2000, controller="127.0.0.1:1999", args=())
    env = world.assignment("a")["ranks"][1]["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["FDL_BACKEND"] == "gloo" and env["FDL_DEVICE"] == "cpu"
    assert env["MASTER_ADDR"] == "10.9.9.9" and env["FDL_RUN_ID"] == ""


def test_member_reply_is_serialized_once() -> None:
    world = build_world([member("a", "cpu:1", "127.0.0.1")], run_id="r", master_addr=None, master_port=1,
                        controller="c", args=())
    first = world.assignment_json("a", {"ok": True})
    assert world.assignment_json("a", {"ok": False}) is first
    assert json.loads(first)["ok"] is True


def test_ranks_get_torchruns_role_group_and_run_id_variables() -> None:
    world = build_world([member("a", "cpu:2", "10.0.0.11"), member("b", "cpu:3", "10.0.0.12")], run_id="r9",
                        master_addr=None, master_port=1338, controller="c", args=(), launch_id="launch")
    envs = [r["env"] for host in ("a", "b") for r in world.assignment(host)["ranks"]]
    # one role, "default", spanning the world: ROLE_RANK is RANK, ROLE_WORLD_SIZE is WORLD_SIZE (torchrun --role)
    assert [e["ROLE_RANK"] for e in envs] == [e["RANK"] for e in envs] == ["0", "1", "2", "3", "4"]
    assert {e["ROLE_NAME"] for e in envs} == {"default"} and {e["ROLE_WORLD_SIZE"] for e in envs} == {"5"}
    assert {e["GROUP_WORLD_SIZE"] for e in envs} == {"2"}
    assert [e["GROUP_RANK"] for e in envs] == ["0", "0", "1", "1", "1"]
    assert {e["TORCHELASTIC_RUN_ID"] for e in envs} == {"r9"}  # the cohort's id wins over the launch's
    assert all(set(TORCHRUN_ENV) <= set(e) for e in envs)  # the names the controller sends, all of them
    # only torchrun's own agent has an agent store; the restart pair and thread defaults are the worker's
    assert not {"TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "OMP_NUM_THREADS"} & set(envs[0])


def test_a_cohort_without_run_id_is_named_after_the_launch_or_one_id_for_all() -> None:
    def run_ids(**kwargs) -> set[str]:
        world = build_world([member("a", "cpu:1", "h1"), member("b", "cpu:2", "h2")], run_id=None,
                            master_addr=None, master_port=1, controller="c", args=(), **kwargs)
        return {r["env"]["TORCHELASTIC_RUN_ID"] for h in ("a", "b") for r in world.assignment(h)["ranks"]}

    assert run_ids(launch_id="5c0f00aa11bb22cc") == {"5c0f00aa11bb22cc"}
    made = run_ids()
    assert len(made) == 1 and len(next(iter(made))) == 16  # set (torch reads it as "launched by an agent")
    assert run_ids() != made  # each world its own
