"""Single-host launcher runs through the real `fdl` entry point: auto-promotion (local_devices: cpu:N,
--gpus with two GPUs), the rank environment, a failing rank, the one-process fallback, and the quickstart
demo with plain `fdl status` finding it on 127.0.0.1:1337.

The ranks are real processes under the real rank supervisor and the controller a real HTTP endpoint. The
runs that must sit on the convention port 1337 (so `fdl status` needs no flags) get a network namespace of
their own: its loopback is theirs alone, so nothing else on this machine can hold or see that port.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.conftest import REPO, fdl_env, need_root_or_skip, run_fdl
from tests.integration.launch.helpers import checksums, final_state, free_port

# every rank prints its environment as one JSON line, then rank FAIL_RANK (if set) exits 7, the others linger
RANK_LINE = ("python3 -c 'import json, os; print(\"ENV \" + json.dumps({k: v for k, v in os.environ.items() "
             "if k in (\"RANK\", \"WORLD_SIZE\", \"LOCAL_RANK\", \"LOCAL_WORLD_SIZE\", \"MASTER_ADDR\", "
             "\"MASTER_PORT\", \"CUDA_VISIBLE_DEVICES\", \"FDL_RUN_ID\", \"FDL_CONTROLLER\", \"FDL_BACKEND\", "
             "\"FDL_DEVICE\", \"FDL_HOST\")}), flush=True)'; "
             "if [ \"$RANK\" = \"${FAIL_RANK:-x}\" ]; then exit 7; fi; [ -z \"$FAIL_RANK\" ] || sleep 60")


def project(root: Path, port: int, **command) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    spec = {"cluster": True, "run": RANK_LINE, **command}
    (root / "fdl.yml").write_text(yaml.safe_dump({"cluster": {"controller": {"port": port}},
                                                  "commands": {"job": spec}}, sort_keys=False))
    return root


def envs(stdout: str) -> dict[int, dict]:
    out = {}
    for line in stdout.splitlines():
        if "] ENV " in line:
            doc = json.loads(line.split("] ENV ", 1)[1])
            out[int(doc["RANK"])] = doc
    return out


def python_path_env(home: Path, **extra: str) -> dict:
    """HOME of the test, and this suite's python first on PATH (the ranks run `python3`)."""
    return {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **extra}


def test_local_devices_cpu_n_promotes_to_a_single_host_cluster(tmp_path):
    port = free_port()
    root = project(tmp_path / "proj", port, local_devices="cpu:3")
    done = run_fdl("job", "--", "--ignored-by-sh", cwd=root, env=python_path_env(tmp_path / "home"))
    assert done.returncode == 0, done.stderr + done.stdout
    ranks = envs(done.stdout)
    assert sorted(ranks) == [0, 1, 2]
    for rank, env in ranks.items():
        assert env["WORLD_SIZE"] == "3" and env["LOCAL_RANK"] == str(rank) and env["LOCAL_WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(port + 1)
        assert env["FDL_CONTROLLER"] == f"127.0.0.1:{port}" and env["FDL_BACKEND"] == "gloo"
        assert env["FDL_DEVICE"] == "cpu" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert len({env["FDL_RUN_ID"] for env in ranks.values()}) == 1
    assert f"controller on 127.0.0.1:{port} (watch with `fdl status`)" in done.stderr  # found from anywhere
    assert "run done: 3 rank(s) on 1 host(s) exited 0" in done.stderr
    state = final_state(tmp_path / "home")
    assert state["phase"] == "done" and state["world"]["size"] == 3
    logs = sorted(p.name for p in (tmp_path / "home" / ".flodl" / "launch" / "runs").glob("*/logs/*.log"))
    assert logs == ["rank-0.log", "rank-1.log", "rank-2.log"]


def test_a_failing_rank_fails_the_run_and_names_itself(tmp_path):
    root = project(tmp_path / "proj", free_port(), local_devices="cpu:3")
    done = run_fdl("job", cwd=root, env=python_path_env(tmp_path / "home", FAIL_RANK="1"), timeout=120)
    assert done.returncode == 1, done.stderr + done.stdout
    host = final_state(tmp_path / "home")["roster"][0]["host"]
    assert f"fdl: error: the run failed: host {host}, rank 1 exited 7 first" in done.stderr
    assert f"rank-1.log on {host}" in done.stderr  # the hint says where that rank's output is
    state = final_state(tmp_path / "home")
    assert state["phase"] == "failed" and state["reason"] == f"host {host} exited 7: rank 1 exited 7"


def test_gpus_naming_two_gpus_promotes_and_scopes_the_ranks(tmp_path, fake_nvml):
    root = project(tmp_path / "proj", free_port())  # no local_devices: --gpus alone decides
    env = python_path_env(tmp_path / "home", **fake_nvml.env("H100:9.0:80G,H100:9.0:80G,H100:9.0:80G"))
    done = run_fdl("--gpus", "1,2", "job", cwd=root, env=env)
    assert done.returncode == 0, done.stderr + done.stdout
    ranks = envs(done.stdout)
    assert sorted(ranks) == [0, 1]
    assert {env["CUDA_VISIBLE_DEVICES"] for env in ranks.values()} == {"1,2"}
    assert [ranks[r]["FDL_DEVICE"] for r in (0, 1)] == ["cuda:1", "cuda:2"]
    assert ranks[0]["FDL_BACKEND"] == "nccl"


def test_one_gpu_or_nothing_runs_the_command_once(tmp_path, fake_nvml):
    root = project(tmp_path / "proj", free_port())
    env = python_path_env(tmp_path / "home", **fake_nvml.env("H100:9.0:80G,H100:9.0:80G"))
    done = run_fdl("--gpus", "0", "job", cwd=root, env=env)
    assert done.returncode == 0, done.stderr
    assert "runs once, on this machine" in done.stderr and "controller" not in done.stderr
    # one process, no world (no RANK, no supervisor prefix), scoped to GPU 0 by --gpus
    assert done.stdout.strip() == 'ENV {"CUDA_VISIBLE_DEVICES": "0"}'


def test_local_devices_on_an_ordinary_command_is_refused(tmp_path):
    (tmp_path / "fdl.yml").write_text("commands:\n  t:\n    run: echo hi\n    local_devices: cpu:2\n")
    done = run_fdl("t", cwd=tmp_path)
    assert done.returncode == 1
    assert "commands.t.local_devices" in done.stderr and "only on a cluster: true command" in done.stderr
    assert "Traceback" not in done.stderr


@contextlib.contextmanager
def own_loopback(name: str):
    """A network namespace with only a loopback: port 1337 there belongs to this test alone."""
    subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        assert name in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                      check=True).stdout.split()
        yield ["ip", "netns", "exec", name]
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def test_quickstart_demo_two_cpu_ranks_with_fdl_status_finding_it(tmp_path):
    need_root_or_skip("the demo must own 127.0.0.1:1337, so it runs in a network namespace of its own")
    demo = tmp_path / "quickstart"
    shutil.copytree(REPO / "examples" / "quickstart", demo)
    env = fdl_env(python_path_env(tmp_path / "home", GLOO_SOCKET_IFNAME="lo"))
    with own_loopback(f"fdll6-{os.getpid()}") as inside:  # this run's own: another clone's run has another
        proc = subprocess.Popen([*inside, sys.executable, "-m", "fdl", "train", "--", "--pause", "0.3"], cwd=demo,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            seen = None
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and proc.poll() is None:
                status = subprocess.run([*inside, sys.executable, "-m", "fdl", "status"], cwd=demo, env=env,
                                        capture_output=True, text=True, timeout=60, check=False)
                if status.returncode == 0 and "training" in status.stdout:
                    seen = status
                    break
                time.sleep(0.3)
            out, err = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        after = subprocess.run([*inside, sys.executable, "-m", "fdl", "status"], cwd=demo, env=env,
                               capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, err + out
    assert seen is not None, "fdl status never showed the run training"
    assert "127.0.0.1:1337" in seen.stderr  # no flags: the convention default, noted
    assert "training" in seen.stdout
    ranks = checksums(out)
    assert sorted(ranks) == [0, 1] and len({r["sum"] for r in ranks.values()}) == 1
    assert after.returncode == 1 and "no run listening at 127.0.0.1:1337" in after.stderr


# --------------------------------------------------------------------------- a busy port

def _listening_on(port: int):
    import socket

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_a_taken_configured_port_moves_the_run_and_plain_status_finds_it(tmp_path):
    """Regression: a single-host run whose configured port is taken failed; it now moves to a free port,
    says so, and records where it listens so `fdl status` with no flags finds it."""
    port = free_port()
    home = tmp_path / "home"
    root = project(tmp_path / "proj", port, local_devices="cpu:2", run="sleep 12")
    env = fdl_env(python_path_env(home, XDG_RUNTIME_DIR=""))
    with _listening_on(port):
        proc = subprocess.Popen([sys.executable, "-m", "fdl", "job"], cwd=root, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            seen = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                status = subprocess.run([sys.executable, "-m", "fdl", "status", "--json", "--timeout", "1"], cwd=root,
                                        env=env, capture_output=True, text=True, timeout=60, check=False)
                if status.returncode == 0 and json.loads(status.stdout).get("phase") == "training":
                    seen = status
                    break
                time.sleep(0.2)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err + out
    assert f"127.0.0.1:{port} (the configured controller port) is taken" in err
    moved = int(err.split("listens on 127.0.0.1:", 1)[1].split()[0])
    assert moved != port
    assert seen is not None, "plain fdl status never found the moved run"
    run_id = err.split("launch: run ", 1)[1].split()[0]
    assert json.loads(seen.stdout)["run_id"] == run_id  # the moved run itself, not whatever holds the port
    live = home / ".flodl" / "launch" / "live"
    assert live.is_dir() and not list(live.iterdir())  # the record went with the launcher


def test_an_explicit_port_is_used_or_refused_when_taken(tmp_path):
    configured, wanted = free_port(), free_port()
    home = tmp_path / "home"
    root = project(tmp_path / "proj", configured, local_devices="cpu:2", run="true")
    env = python_path_env(home, XDG_RUNTIME_DIR="")
    done = run_fdl("job", "--port", str(wanted), cwd=root, env=env)
    assert done.returncode == 0, done.stderr
    assert final_state(home)["controller"].endswith(f":{wanted}") or f"127.0.0.1:{wanted}" in done.stderr
    with _listening_on(wanted):
        refused = run_fdl("job", "--port", str(wanted), cwd=root, env=env)
        assert refused.returncode == 2
        assert f"port {wanted} (--port) on 127.0.0.1 is taken" in refused.stderr and "Traceback" not in refused.stderr
        from_env = run_fdl("job", cwd=root, env={**env, "FDL_PORT": str(wanted)})
        assert from_env.returncode == 2 and f"port {wanted} (FDL_PORT)" in from_env.stderr
    bad = run_fdl("job", cwd=root, env={**env, "FDL_PORT": "http"})
    assert bad.returncode == 2 and "FDL_PORT='http' is not a port number" in bad.stderr


def test_omp_num_threads_one_per_rank_unless_the_commands_env_or_the_user_sets_it(tmp_path):
    line = "echo OMP=${OMP_NUM_THREADS:-unset} RANK=${RANK:-none}"
    root = tmp_path / "proj"
    root.mkdir()
    (root / "fdl.yml").write_text(yaml.safe_dump({"cluster": {"controller": {"port": free_port()}}, "commands": {
        "dflt": {"cluster": True, "run": line, "local_devices": "cpu:2"},
        "pinned": {"cluster": True, "run": line, "local_devices": "cpu:2", "env": {"OMP_NUM_THREADS": "3"}},
        "solo": {"cluster": True, "run": line, "local_devices": "cpu:1"},
        "plain": {"run": line, "env": {"OMP_NUM_THREADS": "5"}},
    }}, sort_keys=False))
    home = tmp_path / "home"

    def lines(command: str, **env: str) -> tuple[list[str], str]:
        done = run_fdl(command, cwd=root, env=python_path_env(home, **env))
        assert done.returncode == 0, done.stderr + done.stdout
        return sorted(text.split("] ", 1)[-1] for text in done.stdout.splitlines()), done.stderr

    out, err = lines("dflt")  # two ranks share this host: one thread each, as torchrun does, and said so
    assert out == ["OMP=1 RANK=0", "OMP=1 RANK=1"]
    assert "OMP_NUM_THREADS=1 for each of this host's 2 ranks, as torchrun does" in err
    out, err = lines("pinned")  # the command's env: wins
    assert out == ["OMP=3 RANK=0", "OMP=3 RANK=1"] and "OMP_NUM_THREADS=1" not in err
    out, err = lines("dflt", OMP_NUM_THREADS="2")  # so does the user's environment
    assert out == ["OMP=2 RANK=0", "OMP=2 RANK=1"] and "OMP_NUM_THREADS=1" not in err
    assert lines("solo")[0] == ["OMP=unset RANK=0"]  # a lone rank keeps every core
    assert lines("plain")[0] == ["OMP=5 RANK=none"]  # an ordinary command gets its env: too
