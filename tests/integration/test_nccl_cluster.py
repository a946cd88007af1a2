"""`fdl @cluster nccl build --host NAME`: the same role, on a worker reached over real ssh.

The worker is this machine behind its own OpenSSH sshd on a loopback port (started
and stopped here), so Ansible really connects over ssh and runs the role there with
the worker's Python. The session gets its PATH from the sshd config (SetEnv): the
docker stand-in of tests/fakes/docker_standin.py comes first, because there is no
Docker engine on these machines. The build root is a temporary directory (--root),
so the worker user's real home is never written; the worker's host key is pinned in
a known_hosts file named by the cluster file (cluster.ssh.known_hosts), and fdl's
cache (SSH control sockets) lives in a temporary directory, so ~/.ssh and ~/.cache
are not touched either.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import need_root_or_skip, run_fdl
from tests.fakes.nccl import clean_path, docker_calls, install_docker_standin
from tests.fakes.nccl_fixtures import nccl_project  # noqa: F401 - pytest fixture

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def worker(tmp_path):
    """An sshd on 127.0.0.1:<free port> letting this user in with a fresh key."""
    need_root_or_skip("sshd must run as root to open login sessions")
    base = tmp_path / "ssh"
    base.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(base / "host_key")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(base / "id_worker")], check=True)
    (base / "authorized_keys").write_text((base / "id_worker.pub").read_text())
    port = free_port()
    (base / "known_hosts").write_text(f"[127.0.0.1]:{port} " + (base / "host_key.pub").read_text())
    cache = Path(tempfile.mkdtemp(prefix="fdl-nccl-"))  # short: control socket paths must fit in 104 bytes
    root = tmp_path / "worker-root"
    bin_dir = tmp_path / "bin"
    install_docker_standin(bin_dir)
    log, state = tmp_path / "docker-calls.jsonl", tmp_path / "docker-state.json"
    (base / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {base / 'host_key'}\nPidFile {base / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {base / 'authorized_keys'}\nPasswordAuthentication no\n"
        f"KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
        f"SetEnv PATH={clean_path(bin_dir)} FAKE_DOCKER_LOG={log} FAKE_DOCKER_STATE={state}\n")
    Path("/run/sshd").mkdir(exist_ok=True)
    with open(base / "sshd.log", "w") as sshd_log:
        sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(base / "sshd_config")],
                                stdout=subprocess.DEVNULL, stderr=sshd_log)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError as exc:
                if sshd.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("test sshd did not start: " + (base / "sshd.log").read_text()) from exc
                time.sleep(0.1)
        yield {"port": port, "key": base / "id_worker", "known_hosts": base / "known_hosts", "root": root,
               "log": log, "user": getpass.getuser(), "env": {"XDG_CACHE_HOME": str(cache)}}
    finally:
        for master in (cache / "fdl" / "cp").glob("*"):  # the persistent ssh masters fdl left for reuse
            subprocess.run(["ssh", "-o", f"ControlPath={master}", "-O", "exit", "node-b"], check=False,
                           capture_output=True, timeout=10)
        sshd.terminate()
        sshd.wait(timeout=10)
        shutil.rmtree(cache, ignore_errors=True)


def cluster_file(project: Path, w: dict) -> None:
    (project / "fdl.cluster.yml").write_text(
        "cluster:\n"
        "  controller: 127.0.0.1:1337\n"
        f"  ssh: {{known_hosts: {w['known_hosts']}}}\n"
        "  workers:\n"
        "    - host: node-b\n"
        "      address: 127.0.0.1\n"
        f"      port: {w['port']}\n"
        f"      user: {w['user']}\n"
        f"      identity: {w['key']}\n"
        "      local_devices: [0]\n")


def test_build_on_a_worker_over_ssh(nccl_project, worker):
    cluster_file(nccl_project, worker)
    result = run_fdl("@cluster", "nccl", "build", "--host", "node-b", "--archs", "6.1", "--root",
                     str(worker["root"]), cwd=nccl_project, env=worker["env"], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    library = worker["root"] / "libtorch/nccl/builds/v2.27.5-sm61/lib/libnccl.so.2"
    assert os.readlink(library) == "libnccl.so.2.27.5"
    assert f"Built {library} on node-b" in result.stdout
    assert "Preload it on node-b" in result.stdout and f"      LD_PRELOAD: {library}\n" in result.stdout
    dockerfile = worker["root"] / "libtorch/nccl/context/v2.27.5-sm61/Dockerfile.nccl.source"
    assert "-gencode=arch=compute_61,code=sm_61" in dockerfile.read_text()
    assert ["build", "--tag", "fdl-nccl:v2.27.5-sm61", "--file", str(dockerfile), str(dockerfile.parent)] \
        in docker_calls(worker["log"])
    assert not (nccl_project / "libtorch/nccl").exists()  # nothing was built here


def test_worker_dry_run_and_json(nccl_project, worker):
    cluster_file(nccl_project, worker)
    result = run_fdl("@cluster", "nccl", "build", "--host", "node-b", "--archs", "6.1;8.6", "--root", "/srv/flodl",
                     "--dry-run", "--json", cwd=nccl_project, env=worker["env"])
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["library"] == "/srv/flodl/libtorch/nccl/builds/v2.27.5-sm61-sm86/lib/libnccl.so.2"
    assert docker_calls(worker["log"]) == []  # a dry run does not even connect
    relative = run_fdl("@cluster", "nccl", "build", "--host", "node-b", "--archs", "6.1", "--root", "srv/flodl",
                       "--dry-run", cwd=nccl_project)
    assert relative.returncode == 1 and "--root 'srv/flodl'" in relative.stderr


def test_unreachable_worker_is_a_clear_error(nccl_project, worker):
    cluster_file(nccl_project, {**worker, "port": free_port()})
    result = run_fdl("@cluster", "nccl", "build", "--host", "node-b", "--archs", "6.1", "--root",
                     str(worker["root"]), cwd=nccl_project, env=worker["env"], timeout=300)
    assert result.returncode == 1
    assert "cannot reach node-b over ssh" in result.stderr
    assert "Traceback" not in result.stderr
