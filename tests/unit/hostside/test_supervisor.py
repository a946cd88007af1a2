"""The rank supervisor with real child processes: fail fast, no orphans, standalone use."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fdl.hostside import supervisor as sup_module
from fdl.hostside.supervisor import RESULT_PREFIX, WORKER_ENV, Supervisor

SUPERVISOR_FILE = Path(sup_module.__file__)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); treat it as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_all_ranks_succeed_with_env_and_logs(tmp_path: Path) -> None:
    lines: list[tuple[int, str]] = []
    sup = Supervisor(py("import os; print('rank', os.environ['RANK'], os.environ['WORLD_SIZE'])"),
                     [{"rank": r, "env": {"RANK": r, "WORLD_SIZE": 2}} for r in range(2)],
                     log_dir=str(tmp_path), on_line=lambda rank, line: lines.append((rank, line)))
    result = sup.run()
    assert result.codes == {0: 0, 1: 0} and result.exit_code == 0 and result.reason == "ok"
    assert sorted(lines) == [(0, "rank 0 2"), (1, "rank 1 2")]
    assert (tmp_path / "rank-1.log").read_text() == "rank 1 2\n"


def test_first_failure_terminates_the_others(tmp_path: Path) -> None:
    code = "import os, sys, time\nif os.environ['RANK'] == '1':\n    time.sleep(0.3); sys.exit(3)\ntime.sleep(60)"
    sup = Supervisor(py(code), [{"rank": r, "env": {"RANK": r}} for r in range(3)], on_line=lambda rank, line: None,
                     grace_s=5)
    result = sup.run()
    assert result.first_failure == 1 and result.exit_code == 3 and result.reason == "rank-failed"
    # The 60 s sleepers ended by SIGTERM, not by finishing their sleep (that would be exit code 0).
    assert result.codes[0] == 128 + signal.SIGTERM and result.codes[2] == 128 + signal.SIGTERM
    assert not any(alive(p.pid) for p in sup.procs.values())


def test_sigterm_ignoring_rank_is_killed_after_grace() -> None:
    code = ("import os, signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "if os.environ['RANK'] == '0': time.sleep(1); sys.exit(1)\ntime.sleep(60)")
    sup = Supervisor(py(code), [{"rank": r, "env": {"RANK": r}} for r in range(2)], on_line=lambda rank, line: None,
                     grace_s=0.5)
    result = sup.run()
    assert result.codes[1] == 128 + signal.SIGKILL
    assert result.first_failure == 0


def test_grandchildren_do_not_survive(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    code = (f"import subprocess\np = subprocess.Popen(['sleep', '120'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n")
    result = Supervisor(py(code), [{"rank": 0}], on_line=lambda rank, line: None).run()
    assert result.exit_code == 0
    grandchild = int(pidfile.read_text())
    for _ in range(50):
        if not alive(grandchild):
            break
        time.sleep(0.05)
    assert not alive(grandchild)


def test_unstartable_binary_is_a_failure() -> None:
    result = Supervisor(["/nonexistent/train"], [{"rank": 0}, {"rank": 1}], on_line=lambda rank, line: None).run()
    assert result.exit_code == 127 and result.first_failure == 0


def _spec(tmp_path: Path, code: str, ranks: int, **extra) -> Path:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"argv": py(code), "label": "node-b", "log_dir": str(tmp_path / "logs"),
                                "grace_s": 2, "ranks": [{"rank": r, "env": {"RANK": str(r)}} for r in range(ranks)],
                                **extra}))
    return spec


def test_standalone_file_without_fdl_on_the_path(tmp_path: Path) -> None:
    """Remote hosts have no fdl: the module runs as plain `python3 - SPEC < supervisor.py`."""
    spec = _spec(tmp_path, "import os; print('hello from', os.environ['RANK'])", 2, watch_stdin=False)
    env = {"PATH": os.environ["PATH"]}
    with SUPERVISOR_FILE.open("rb") as source:
        out = subprocess.run([sys.executable, "-", str(spec)], stdin=source, capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "[node-b/0] hello from 0" in out.stdout and "[node-b/1] hello from 1" in out.stdout
    result = json.loads(out.stdout.strip().splitlines()[-1].removeprefix(RESULT_PREFIX))
    assert result == {"codes": {"0": 0, "1": 0}, "first_failure": None, "reason": "ok", "exit_code": 0}


def _rank_pids(tmp_path: Path, count: int) -> list[int]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pids = [p for p in (tmp_path / "pids").glob("*")] if (tmp_path / "pids").exists() else []
        if len(pids) == count:
            return [int(p.read_text()) for p in pids if p.read_text()]
        time.sleep(0.05)
    raise AssertionError("ranks did not start")


SLEEPER = ("import os, time, pathlib\nd = pathlib.Path(os.environ['PIDS']); d.mkdir(exist_ok=True)\n"
           "(d / os.environ['RANK']).write_text(str(os.getpid()))\ntime.sleep(120)")


@pytest.mark.parametrize("how", ["stdin-eof", "sigterm", "sigkill"])
def test_no_orphans_when_the_supervisor_goes_away(tmp_path: Path, how: str) -> None:
    spec = _spec(tmp_path, SLEEPER, 2)
    env = dict(os.environ, PIDS=str(tmp_path / "pids"))
    proc = subprocess.Popen([sys.executable, str(SUPERVISOR_FILE), str(spec)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    pids = _rank_pids(tmp_path, 2)
    assert all(alive(p) for p in pids)
    if how == "stdin-eof":
        proc.stdin.close()
    elif how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    else:
        proc.kill()
    proc.wait(timeout=30)
    out = proc.stdout.read()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        stream.close()
    if how != "sigkill":
        assert proc.returncode == 1
        reason = json.loads(out.strip().splitlines()[-1].removeprefix(RESULT_PREFIX))["reason"]
        assert reason == ("orphaned" if how == "stdin-eof" else "terminated")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(alive(p) for p in pids)


# --------------------------------------------------------------------------- torchrun's worker-side environment

ENV_PROBE = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {WORKER_ENV!r}}}))"


def rank_envs(ranks: int, base: dict, spec_env: dict | None = None, **kwargs) -> tuple[dict, list[str]]:
    lines: list[tuple[int, str]] = []
    notes: list[str] = []
    sup = Supervisor(py(ENV_PROBE), [{"rank": r, "env": dict(spec_env or {})} for r in range(ranks)],
                     base_env=base, on_line=lambda rank, line: lines.append((rank, line)), on_note=notes.append,
                     **kwargs)
    assert sup.run().exit_code == 0
    return {r: json.loads(line) for r, line in lines}, notes


def test_more_than_one_rank_on_a_host_gets_one_omp_thread_each_as_under_torchrun() -> None:
    envs, notes = rank_envs(2, {"PATH": os.environ["PATH"]})
    assert [envs[r]["OMP_NUM_THREADS"] for r in (0, 1)] == ["1", "1"]
    assert {envs[r]["TORCHELASTIC_RESTART_COUNT"] for r in (0, 1)} == {"0"}
    assert {envs[r]["TORCHELASTIC_MAX_RESTARTS"] for r in (0, 1)} == {"0"}
    assert {envs[r]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] for r in (0, 1)} == {"1"}
    assert all(None not in envs[r].values() for r in (0, 1))  # every name the worker side owns is set
    assert len(notes) == 1 and notes[0].startswith("OMP_NUM_THREADS=1 for each of this host's 2 ranks")


def test_a_lone_rank_keeps_every_core_and_nothing_set_is_overridden() -> None:
    envs, notes = rank_envs(1, {"PATH": os.environ["PATH"]})
    assert envs[0]["OMP_NUM_THREADS"] is None and not notes  # torchrun leaves one process per node alone
    base = {"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "3", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
    envs, notes = rank_envs(2, base)  # the user's environment
    assert {envs[r]["OMP_NUM_THREADS"] for r in (0, 1)} == {"3"} and not notes
    assert {envs[r]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] for r in (0, 1)} == {"0"}
    envs, notes = rank_envs(2, {"PATH": os.environ["PATH"]}, {"OMP_NUM_THREADS": "2"})  # a worker's env:
    assert {envs[r]["OMP_NUM_THREADS"] for r in (0, 1)} == {"2"} and not notes


def test_the_restart_pair_is_the_supervisors_own_not_the_specs() -> None:
    envs, _ = rank_envs(1, {"PATH": os.environ["PATH"]}, {"TORCHELASTIC_RESTART_COUNT": "9"}, restart_count=2,
                        max_restarts=5)
    assert envs[0]["TORCHELASTIC_RESTART_COUNT"] == "2" and envs[0]["TORCHELASTIC_MAX_RESTARTS"] == "5"


def test_a_standalone_supervisor_reads_the_restart_pair_from_its_spec(tmp_path: Path) -> None:
    spec = {"argv": py(ENV_PROBE), "label": "hx", "restart_count": 1, "max_restarts": 4, "watch_stdin": False,
            "ranks": [{"rank": 0, "env": {}}, {"rank": 1, "env": {}}]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, str(SUPERVISOR_FILE), str(tmp_path / "spec.json")], capture_output=True,
                          text=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0, done.stderr
    seen = [json.loads(line.split("] ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("[hx/")]
    assert seen == [{"OMP_NUM_THREADS": "1", "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "4",
                     "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}] * 2
    assert done.stderr.startswith("fdl supervisor: OMP_NUM_THREADS=1 for each of this host's 2 ranks")
