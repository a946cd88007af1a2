"""Unmodified torchrun scripts under fdl on one machine, compared with `torchrun` running them here.

Each script (torchrun_scripts/: a DDP tutorial-series trainer and a torchelastic-style fault-tolerant one)
runs twice, unchanged, from a project directory of its own: under `torchrun --standalone --nproc-per-node 2`
and under an fdl `cluster: true` command with `local_devices: cpu:2`. Every variable torchrun gives its
workers is checked on every fdl rank (torchrun_compare.compare), each rank's torch.get_num_threads() too,
and the two trainings must end with the same weights. Real torch, real gloo, the real launcher.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import fdl_env, run_fdl
from tests.integration.launch.helpers import final_state, free_port
from tests.integration.launch.torchrun_compare import (
    OUT_VAR,
    base_env,
    collect,
    compare,
    fdl_extras,
    observer,
    parameter_sums,
    project_copy,
    run_torchrun,
    table,
)

pytestmark = pytest.mark.slow

PYTHON_DIR = Path(sys.executable).parent


def fdl_project(root: Path, script: str, args: list[str], port: int, **command) -> Path:
    project_copy(script, root)
    spec = {"cluster": True, "run": f"python {script}", "args": args, "local_devices": "cpu:2", **command}
    (root / "fdl.yml").write_text(yaml.safe_dump({"cluster": {"controller": {"port": port}},
                                                  "commands": {"train": spec}}, sort_keys=False))
    return root


def run_under_fdl(tmp_path: Path, script: str, args: list[str], env: dict) -> tuple[dict, dict, str, int, str]:
    """The script under `fdl train`: (what each rank saw, the launcher's environment, stdout, port, run id)."""
    port = free_port()
    root = fdl_project(tmp_path / "fdl", script, args, port)
    out = tmp_path / "seen-fdl"
    out.mkdir()
    extra = {**env, OUT_VAR: str(out), "HOME": str(tmp_path / "home")}
    done = run_fdl("train", cwd=root, env=extra, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-2000:]
    state = final_state(tmp_path / "home")
    return collect(out, 2), fdl_env(extra), done.stdout + "\n" + done.stderr, port, state["run_id"]


SCRIPTS = [
    ("ddp_multinode.py", ["4", "2", "--batch_size", "16"]),
    ("elastic_checkpoint.py", ["--steps", "6"]),
]


@pytest.mark.parametrize(("script", "args"), SCRIPTS, ids=[s for s, _ in SCRIPTS])
def test_an_unmodified_torchrun_script_sees_torchruns_environment_under_fdl(tmp_path, script, args):
    env = base_env(PYTHON_DIR, observer(tmp_path / "observe"))
    torchrun, torchrun_env, t_done = run_torchrun(script, args, project_copy(script, tmp_path / "torchrun"),
                                                  tmp_path / "seen-torchrun", env)
    fdl, fdl_env_, output, port, run_id = run_under_fdl(tmp_path, script, args, env)

    rows = compare(torchrun, torchrun_env, fdl, nodes=1, per_node=2, run_id=run_id, master_addr="127.0.0.1",
                   master_port=port + 1)
    print(table(rows))
    names = {name for name, _, _ in rows}
    assert {"TORCHELASTIC_RUN_ID", "ROLE_WORLD_SIZE", "OMP_NUM_THREADS", "TORCHELASTIC_RESTART_COUNT"} <= names
    # two ranks on one host: one intra-op thread each, under both (torchrun's default, now fdl's)
    assert [fdl[r]["threads"] for r in (0, 1)] == [1, 1] and [torchrun[r]["threads"] for r in (0, 1)] == [1, 1]
    assert fdl_extras(fdl, fdl_env_, names) == set()  # beyond torchrun's: only FDL_* and CUDA_VISIBLE_DEVICES
    # the same training, step for step: both runs end with the same weights on every rank
    sums = parameter_sums(t_done.stdout)
    assert sorted(sums) == [0, 1] and parameter_sums(output) == sums, output[-3000:]
    assert "OMP_NUM_THREADS=1 for each of this host's 2 ranks" in output  # said, as torchrun warns
    if script == "elastic_checkpoint.py":  # the checkpoint is named after the run, as the script intends
        assert (tmp_path / "fdl" / "checkpoints" / f"{run_id}.pt").is_file()
        assert "node 0/1: 2 workers, role default, attempt 1 of at most 1, 1 intra-op threads" in output


def test_a_users_omp_num_threads_wins_under_both(tmp_path):
    script, args = SCRIPTS[1]
    env = base_env(PYTHON_DIR, observer(tmp_path / "observe"), OMP_NUM_THREADS="2")
    torchrun, torchrun_env, _ = run_torchrun(script, args, project_copy(script, tmp_path / "torchrun"),
                                             tmp_path / "seen-torchrun", env)
    fdl, _, output, port, run_id = run_under_fdl(tmp_path, script, args, env)
    compare(torchrun, torchrun_env, fdl, nodes=1, per_node=2, run_id=run_id, master_addr="127.0.0.1",
            master_port=port + 1)
    assert {fdl[r]["env"]["OMP_NUM_THREADS"] for r in (0, 1)} == {"2"}
    assert [fdl[r]["threads"] for r in (0, 1)] == [torchrun[r]["threads"] for r in (0, 1)] == [2, 2]
    assert "OMP_NUM_THREADS=1" not in output  # nothing defaulted, nothing said
