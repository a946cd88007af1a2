"""The smoke test's host side: what a host offers, and its ranks' place in a world every host computes alike."""

from __future__ import annotations

import pytest

from fdl.hostside.collective.offer import DEFAULT_CPU_RANKS, offered, program_source
from fdl.hostside.collective.ranks import world_ranks


def gpu_report(*selected: int) -> dict:
    devices = [{"index": i, "selected": i in selected} for i in range(4)]
    return {"checks": [{"name": "gpu", "data": {"devices": devices}}]}


WORLD = [{"host": "a", "gpus": [2, 3], "ranks": 2}, {"host": "skipped", "gpus": None, "ranks": 0},
         {"host": "b", "gpus": [0], "ranks": 1}]


def test_ranks_are_numbered_host_by_host_in_the_shared_order_and_a_host_without_ranks_takes_no_place():
    a = world_ranks(WORLD, "a", master_addr="10.0.0.1", master_port=29501)
    b = world_ranks(WORLD, "b", master_addr="10.0.0.1", master_port=29501)
    assert [r["rank"] for r in a] == [0, 1] and [r["rank"] for r in b] == [2]
    assert world_ranks(WORLD, "skipped", master_addr="x", master_port=1) == []
    assert world_ranks(WORLD, "stranger", master_addr="x", master_port=1) == []
    env = b[0]["env"]
    assert (env["WORLD_SIZE"], env["RANK"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("3", "2", "0", "1")
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("1", "2")  # the skipped host is not a node
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["FDL_HOST"]) == ("10.0.0.1", "29501", "b")
    assert env["FDL_BACKEND"] == "nccl"  # every host with ranks offers GPUs
    # every GPU the host offers is visible, and LOCAL_RANK indexes into them
    assert [(r["env"]["CUDA_VISIBLE_DEVICES"], r["env"]["LOCAL_RANK"]) for r in a] == [("2,3", "0"), ("2,3", "1")]


def test_one_cpu_host_makes_the_world_gloo_and_extra_environment_reaches_every_rank():
    world = [{"host": "a", "gpus": [0], "ranks": 1}, {"host": "c", "gpus": None, "ranks": 2}]
    ranks = world_ranks(world, "c", master_addr="m", master_port=1, extra_env={"GLOO_SOCKET_IFNAME": "lo"})
    assert [r["env"]["FDL_BACKEND"] for r in ranks] == ["gloo", "gloo"]
    assert all(r["env"]["CUDA_VISIBLE_DEVICES"] == "" and r["env"]["GLOO_SOCKET_IFNAME"] == "lo" for r in ranks)


def test_a_host_offers_what_it_declares_else_its_selected_gpus_else_cpu_ranks():
    assert offered("cpu:3", gpu_report(0)) == (None, 3)
    assert offered("1,2", gpu_report(0)) == ([1, 2], 2)  # a declaration wins over the selection
    assert offered("all", gpu_report(1, 3)) == ([1, 3], 2)
    assert offered(None, gpu_report()) == (None, DEFAULT_CPU_RANKS)  # no GPU: CPU ranks
    assert offered("", {"checks": []}) == (None, DEFAULT_CPU_RANKS)
    with pytest.raises(ValueError, match="cpu:N needs N"):
        offered("cpu:0", gpu_report())


def test_the_rank_program_source_is_the_shipped_file():
    source = program_source()
    assert source.startswith('"""All-reduce smoke test') and "def main(" in source
