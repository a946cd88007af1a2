"""Run the same unmodified torchrun scripts under `torchrun` and under fdl, and compare what each rank saw.

The scripts in torchrun_scripts/ are written the way PyTorch's tutorials and pytorch/examples write them and
know nothing of fdl. What a rank saw is recorded from outside the script: `observer()` writes a
`sitecustomize.py` that Python imports at start-up (through PYTHONPATH); in a process that has RANK set it
snapshots the environment before the script runs and, at exit, adds `torch.get_num_threads()`.

`compare()` takes every variable torchrun added to its workers' environment (the diff against the
environment torchrun itself was started with, so a variable a future torch adds is caught) and checks it
on each fdl rank, by what the variable means:

- per-host values (LOCAL_RANK, LOCAL_WORLD_SIZE, ROLE_NAME, the restart pair, the thread defaults) equal
  those of the torchrun worker with the same local rank;
- job-wide counts and ranks (RANK, WORLD_SIZE, GROUP_*, ROLE_RANK, ROLE_WORLD_SIZE) equal torchrun's scaled
  to fdl's number of hosts (identical for one host);
- per-run values (TORCHELASTIC_RUN_ID, MASTER_ADDR, MASTER_PORT) are one value across the job: the run's
  id, rank 0's host, the run's rendezvous port;
- what only torchrun's own agent uses (EXCLUDED) must not be invented by fdl.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "torchrun_scripts"
OUT_VAR = "TORCHRUN_COMPARE_OUT"

OBSERVER = r'''
import atexit, json, os, sys

_out = os.environ.get("TORCHRUN_COMPARE_OUT")
if _out and "RANK" in os.environ:
    _env = dict(os.environ)

    def _record():
        torch = sys.modules.get("torch")
        seen = {"env": _env, "threads": torch.get_num_threads() if torch is not None else None}
        path = os.path.join(_out, "rank-%s.json" % _env["RANK"])
        with open(path + ".tmp", "w") as handle:
            json.dump(seen, handle)
        os.replace(path + ".tmp", path)

    atexit.register(_record)
'''

# Values that mean the same on every host: the rank with the same local rank under torchrun has the same one.
PER_HOST = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
# Ranks and sizes across the job: torchrun's single-host value scaled to `nodes` hosts of `per_node` ranks.
JOB_WIDE = ("RANK", "ROLE_RANK", "WORLD_SIZE", "ROLE_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")
PER_RUN = ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")
# torchrun's agent machinery; fdl has no such agent, so it must not invent them (docs/launcher.md says why).
EXCLUDED = ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE")


def observer(where: Path) -> Path:
    """A directory holding the observer's sitecustomize.py, to put on PYTHONPATH."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "sitecustomize.py").write_text(OBSERVER)
    return where


def collect(out: Path, ranks: int, timeout: float = 30) -> dict[int, dict]:
    """rank -> {"env": ..., "threads": ...}, once every rank has written its record."""
    deadline = time.monotonic() + timeout
    while True:
        found = {}
        for path in out.glob("rank-*.json"):
            doc = json.loads(path.read_text())
            found[int(doc["env"]["RANK"])] = doc
        if len(found) >= ranks or time.monotonic() > deadline:
            assert sorted(found) == list(range(ranks)), f"records of ranks {sorted(found)} in {out}"
            return found
        time.sleep(0.2)


def project_copy(script: str, where: Path) -> Path:
    """The script, unmodified, in a project directory of its own (as a user keeps it)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / script).write_bytes((SCRIPTS / script).read_bytes())
    return where


def run_torchrun(script: str, args: list[str], cwd: Path, out: Path, env: dict, nproc: int = 2,
                 timeout: float = 180) -> tuple[dict[int, dict], dict, subprocess.CompletedProcess]:
    """`torchrun --standalone --nproc-per-node N SCRIPT ARGS` in cwd (holding the script), from `env`.

    Returns what each worker saw, the environment torchrun was started with, and the finished process."""
    out.mkdir(parents=True, exist_ok=True)
    started = {**env, OUT_VAR: str(out)}
    torchrun = Path(sys.executable).parent / "torchrun"
    done = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", str(nproc), script, *args],
                          cwd=cwd, env=started, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-2000:]
    return collect(out, nproc), started, done


PARAM_SUM = re.compile(r"(?:\[GPU|rank )(\d+)[\]/].*parameter sum (\S+)$")


def parameter_sums(stdout: str) -> dict[int, str]:
    """rank -> the parameter sum the script printed when it finished training."""
    found = {}
    for line in stdout.splitlines():
        match = PARAM_SUM.search(line.strip())
        if match:
            found[int(match[1])] = match[2]
    return found


def added(seen: dict, started: dict) -> set[str]:
    """The variables a launcher added (or changed) for one worker."""
    return {k for k, v in seen["env"].items() if started.get(k) != v}


def is_loopback(name: str) -> bool:
    return all(info[4][0].startswith("127.") or info[4][0] == "::1"
               for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP))


def compare(torchrun: dict[int, dict], torchrun_env: dict, fdl: dict[int, dict], *, nodes: int, per_node: int,
            run_id: str, master_addr: str, master_port: int) -> list[tuple[str, str, str]]:
    """Check every fdl rank against torchrun, variable by variable; returns the rows (name, torchrun rank 0,
    fdl rank 0) of what was compared, for the test's output."""
    names: set[str] = set()
    for seen in torchrun.values():
        names |= added(seen, torchrun_env)
    unknown = names - set(PER_HOST) - set(JOB_WIDE) - set(PER_RUN) - set(EXCLUDED)
    assert not unknown, f"torchrun sets {sorted(unknown)}, which fdl's contract does not cover yet"
    assert sorted(fdl) == list(range(nodes * per_node)), sorted(fdl)
    assert len(torchrun) == per_node
    failures = []
    for rank, seen in fdl.items():
        env = seen["env"]
        node, local = divmod(rank, per_node)
        ref = torchrun[local]["env"]
        expected: dict[str, str | None] = {}
        for name in PER_HOST:
            expected[name] = ref.get(name)
        expected["RANK"] = expected["ROLE_RANK"] = str(node * per_node + int(ref["RANK"]))
        expected["WORLD_SIZE"] = expected["ROLE_WORLD_SIZE"] = str(nodes * int(ref["WORLD_SIZE"]))
        expected["GROUP_RANK"] = str(node + int(ref["GROUP_RANK"]))
        expected["GROUP_WORLD_SIZE"] = str(nodes * int(ref["GROUP_WORLD_SIZE"]))
        expected["TORCHELASTIC_RUN_ID"] = run_id
        expected["MASTER_ADDR"] = master_addr
        expected["MASTER_PORT"] = str(master_port)
        for name in sorted(names - set(EXCLUDED)):
            if env.get(name) != expected[name]:
                failures.append(f"rank {rank}: {name}={env.get(name)!r}, expected {expected[name]!r} "
                                f"(torchrun's local rank {local}: {ref.get(name)!r})")
        for name in EXCLUDED:
            if name in env:
                failures.append(f"rank {rank}: {name} is set ({env[name]!r}): only torchrun's own agent has it")
        if seen["threads"] != torchrun[local]["threads"]:
            failures.append(f"rank {rank}: torch.get_num_threads() is {seen['threads']}, under torchrun "
                            f"{torchrun[local]['threads']}")
    # torchrun's per-run values are one value across its workers too (what makes the rules above its meaning)
    for name in PER_RUN:
        values = {seen["env"].get(name) for seen in torchrun.values()}
        assert len(values) == 1 and None not in values, (name, values)
    assert is_loopback(torchrun[0]["env"]["MASTER_ADDR"])
    assert not failures, "\n".join(failures)
    return [(name, str(torchrun[0]["env"].get(name)), str(fdl[0]["env"].get(name))) for name in sorted(names)]


def fdl_extras(fdl: dict[int, dict], started: dict, torchrun_names: set[str]) -> set[str]:
    """What fdl adds beyond torchrun's contract: its own FDL_* and CUDA_VISIBLE_DEVICES are expected, and PWD
    from the /bin/sh that runs a `run:` line in the project directory."""
    extra: set[str] = set()
    for seen in fdl.values():
        extra |= added(seen, started) - torchrun_names
    return {name for name in extra if not name.startswith("FDL_") and name not in ("CUDA_VISIBLE_DEVICES", "PWD")}


def table(rows: list[tuple[str, str, str]]) -> str:
    width = max(len(name) for name, _, _ in rows)
    return "\n".join(f"{name:<{width}}  torchrun={t!r:<40}  fdl={f!r}" for name, t, f in rows)


def base_env(python_dir: Path, observe: Path, **extra: str) -> dict:
    """This suite's environment with its python first on PATH and the observer (after fdl's checkout) on
    PYTHONPATH; OMP_NUM_THREADS only when given, so torchrun's and fdl's defaults both show."""
    from tests.conftest import REPO

    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    env.update({"PATH": f"{python_dir}:{os.environ['PATH']}", "PYTHONPATH": f"{REPO}{os.pathsep}{observe}",
                "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "lo"}, **extra)
    return env
