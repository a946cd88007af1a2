"""Unmodified torchrun scripts across two testbed hosts under `fdl @cluster train`, compared with what
`torchrun --standalone --nproc-per-node 2` gives the same script on this machine.

The script sits on storage every host sees (as a cluster's shared file system would hold it) and each host
runs two gloo CPU ranks as its own user, over real SSH. Every variable torchrun gives its workers is checked
on every rank by what it means (torchrun_compare.compare): per-host values equal those of torchrun's worker
with the same local rank, job-wide ranks and sizes are torchrun's scaled to two hosts, the run id, master
address and port are the run's. Each rank's torch.get_num_threads() is 1, as under torchrun.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.conftest import run_fdl
from tests.integration.launch.helpers import final_state, free_port, torch_python, write_project
from tests.integration.launch.torchrun_compare import (
    OUT_VAR,
    base_env,
    collect,
    compare,
    observer,
    parameter_sums,
    project_copy,
    run_torchrun,
    table,
)

pytestmark = [pytest.mark.testbed(hosts=2), pytest.mark.slow]

CASES = [
    ("elastic_checkpoint.py", ["--steps", "6"]),
    ("ddp_multinode.py", ["3", "1", "--batch_size", "16"]),
]


@pytest.fixture(scope="module")
def shared(testbed) -> dict:
    """On storage every host sees: a torch python, the unmodified scripts, the observer."""
    torchpy = torch_python(testbed.shared / "py")
    scripts = project_copy(CASES[0][0], testbed.shared / "scripts")
    project_copy(CASES[1][0], scripts)
    observe = observer(testbed.shared / "observe")
    for path in (scripts, observe, *scripts.iterdir(), *observe.iterdir()):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return {"python": torchpy, "scripts": scripts, "observe": observe}


@pytest.mark.parametrize(("script", "args"), CASES, ids=[s for s, _ in CASES])
def test_an_unmodified_torchrun_script_across_hosts_sees_torchruns_environment(testbed, shared, short_tmp,
                                                                               testbed_home, tmp_path, script,
                                                                               args):
    torchrun, torchrun_env, _ = run_torchrun(script, args, project_copy(script, tmp_path / "torchrun"),
                                             tmp_path / "seen-torchrun",
                                             base_env(Path(sys.executable).parent, shared["observe"]))

    seen = testbed.shared / f"seen-{script}"
    seen.mkdir()
    seen.chmod(0o1777)  # each host's user writes its ranks' records here
    port = free_port(testbed.gateway)
    workers = [host.worker(local_devices="cpu:2", env={"GLOO_SOCKET_IFNAME": "eth0",
                                                       "PYTHONPATH": str(shared["observe"]), OUT_VAR: str(seen)})
               for host in testbed.hosts]
    doc = testbed.cluster(workers)
    doc["cluster"]["controller"] = {"host": testbed.gateway, "port": port, "bind": testbed.gateway}
    run_line = f"{shared['python']} {shared['scripts'] / script}"
    project = write_project(short_tmp / "proj", {"train": {"cluster": True, "run": run_line, "args": args}}, doc)
    done = run_fdl("@cluster", "train", cwd=project, env=testbed_home, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-3000:]
    run_id = final_state(Path(testbed_home["HOME"]))["run_id"]

    fdl = collect(seen, 4)
    rows = compare(torchrun, torchrun_env, fdl, nodes=2, per_node=2, run_id=run_id,
                   master_addr=testbed.hosts[0].address, master_port=port + 1)
    print(table(rows))
    assert [fdl[r]["env"]["FDL_HOST"] for r in range(4)] == ["h1", "h1", "h2", "h2"]
    assert [fdl[r]["threads"] for r in range(4)] == [1, 1, 1, 1]
    for host in testbed.hosts:  # said once per host, as a launcher note naming the host
        assert f"fdl: launch: {host.name}: OMP_NUM_THREADS=1 for each of this host's 2 ranks" in done.stderr
    sums = parameter_sums(done.stdout)
    assert sorted(sums) == [0, 1, 2, 3] and len(set(sums.values())) == 1, done.stdout[-3000:]
    if script == "elastic_checkpoint.py":
        h1 = testbed.hosts[0]
        assert (h1.home / ".flodl" / "launch" / "runs" / run_id / "checkpoints" / f"{run_id}.pt").is_file()
        assert "[h2/2] node 1/2: 2 workers, role default, attempt 1 of at most 1, 1 intra-op threads" in done.stdout
