"""examples/cluster/try-local: a two-host cluster on one machine over a private sshd, probed and trained
(the quickstart demo, two gloo CPU ranks), and nothing left running afterwards: no process, no sshd, no
listening port, no SSH master socket, no temporary directory, nothing written into the clone.

The full run goes as an ordinary account (a testbed user: a real account of this machine, not root), which
is what proves "no root needed"; the Ctrl-C run goes as whoever runs the suite.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import IN_CI, REPO
from tests.integration.launch.helpers import torch_python

SCRIPT = REPO / "examples" / "cluster" / "try-local"
CHECKSUM = re.compile(r"^\[(here/0|over-ssh/1)\] rank \d/2 on \S+: 30 steps, loss \S+, weights checksum "
                      r"([0-9a-f]{16})$", re.M)

pytestmark = pytest.mark.slow


def need_torch() -> None:
    if importlib.util.find_spec("torch") is None:  # the demo's ranks import it
        reason = "PyTorch is not installed in the suite's environment (pip install torch==2.13.0)"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)


def suite_bin(where: Path) -> Path:
    """A bin directory holding `fdl` and `ansible-playbook` under the suite's own interpreter."""
    where.mkdir(parents=True, exist_ok=True)
    for name in ("fdl", "ansible-playbook"):
        source = Path(sys.executable).parent / name
        body = source.read_text().split("\n", 1)[1]
        (where / name).write_text(f"#!{sys.executable}\n{body}")
        (where / name).chmod(0o755)
    return where


def account_bin(where: Path) -> Path:
    """`fdl` and `ansible-playbook` another account can run: a venv of /usr/bin/python3 that sees the suite's
    packages and this clone (the suite's own interpreter may live where other accounts cannot enter)."""
    python = torch_python(where)
    lib = next((python.parent.parent / "lib").glob("python3*")) / "site-packages"
    (lib / "fdl-test-clone.pth").write_text(f"{REPO}\n")
    bin_dir = python.parent
    for name in ("fdl", "ansible-playbook"):
        body = (Path(sys.executable).parent / name).read_text().split("\n", 1)[1]
        (bin_dir / name).write_text(f"#!{python}\n{body}")
        (bin_dir / name).chmod(0o755)
    subprocess.run(["chmod", "-R", "a+rX", str(where)], check=True)
    return bin_dir


def ports_of(stderr: str, stdout: str) -> tuple[int, int | None]:
    """The private sshd's port and the run's controller port, from what the script and fdl print."""
    sshd = int(re.search(r"private sshd for \S+ on 127\.0\.0\.1:(\d+)", stderr)[1])
    controller = re.search(r"controller on 127\.0\.0\.1:(\d+)", stderr + stdout)
    return sshd, int(controller[1]) if controller else None


def sockets_on(port: int) -> list[str]:
    """TCP sockets of this machine with `port` at either end, other than TIME_WAIT (which no process holds).

    Catches what a process listing cannot name: an sshd session process rewrites its command line and
    environment (setproctitle), but its connection to the private sshd's port is still here."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            ports = {int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)}
            if port in ports and state != "06":
                found.append(f"{table}: {local} -> {remote} state {state}")
    return found


def processes_mentioning(marker: str) -> list[str]:
    """Processes whose command line or environment names `marker` (a path only this test uses)."""
    found = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in cmdline or needle in environ:
            found.append(f"{entry}: {_words(cmdline)}")
    return found


def _words(cmdline: bytes) -> str:
    return cmdline.replace(b"\0", b" ").decode(errors="replace").strip()


def processes_of(uid: int) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    found.append(f"{entry}: {_words(Path(f'/proc/{entry}/cmdline').read_bytes())}")
            except OSError:
                continue
    return found


def assert_nothing_left(done_err: str, done_out: str, tmp: Path, cache: Path, leftovers: list[str]) -> None:
    sshd_port, controller_port = ports_of(done_err, done_out)
    assert not leftovers, "left running:\n" + "\n".join(leftovers)
    assert not sockets_on(sshd_port), f"sockets on the private sshd's port: {sockets_on(sshd_port)}"
    if controller_port is not None:
        assert not sockets_on(controller_port), f"sockets on the controller port: {sockets_on(controller_port)}"
    assert not list(tmp.glob("fdl-try-local.*")), "the script's temporary directory is still there"
    sockets = [p for p in cache.rglob("*") if p.is_socket()] if cache.exists() else []
    assert not sockets, f"SSH master sockets left: {sockets}"


def clone_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "examples"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.testbed
@pytest.mark.parametrize("testbed", [1], indirect=True)  # one host: its user is the ordinary account
def test_an_ordinary_account_probes_and_trains_over_ssh_and_leaves_nothing(testbed, tmp_path: Path) -> None:
    """As the docs say: `examples/cluster/try-local`, with fdl and PyTorch installed and nothing else set up."""
    need_torch()
    account = testbed.hosts[0]
    entry = pwd.getpwnam(account.user)
    bin_dir = account_bin(testbed.shared / "try-local-py")
    home = account.home  # the account's own, empty apart from the testbed's .ssh
    env = {"HOME": str(home), "USER": account.user, "LOGNAME": account.user, "TMPDIR": str(home / "tmp"),
           "XDG_CACHE_HOME": str(home / ".cache"), "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
           "LANG": "C.UTF-8"}
    subprocess.run(["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups",
                    "mkdir", "-m", "0700", str(home / "tmp")], check=True, env=env)
    before = clone_status()
    done = subprocess.run(["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups",
                           str(SCRIPT)], cwd=home, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "here: ready: CPU host (cpu:1, gloo; GPU and NCCL checks skipped), libtorch 2.13.0" in out, out
    assert "over-ssh: ready: CPU host (cpu:1, gloo; GPU and NCCL checks skipped), libtorch 2.13.0" in out, out
    assert "ok       libtorch_match  Every host has libtorch 2.13.0." in out  # one interpreter, one torch
    assert "cluster: ready: 2 hosts, hosts agree on libtorch and clocks" in out
    sums = dict(CHECKSUM.findall(out))
    assert set(sums) == {"here/0", "over-ssh/1"} and len(set(sums.values())) == 1, out
    assert "try-local: OK: the cluster probed green and trained over SSH" in done.stderr
    assert f"private sshd for {account.user} on 127.0.0.1:" in done.stderr
    time.sleep(0.5)  # an exiting process's last moments
    assert_nothing_left(done.stderr, out, home / "tmp", home / ".cache", processes_of(entry.pw_uid))
    assert clone_status() == before  # the demo ran in a copy of examples/quickstart


def test_the_smoke_test_spans_both_workers_this_machine_s_included(short_tmp: Path) -> None:
    """`fdl @cluster probe --collective` on try-local's cluster: one rank on `here` (this machine, through the
    role's local connection) and one on `over-ssh`, one world of 2 ranks over loopback with real bandwidth
    figures; the run leaves nothing behind."""
    need_torch()
    home = short_tmp / "home"
    (home / "tmp").mkdir(parents=True)
    os.chmod(home / "tmp", 0o700)
    bin_dir = suite_bin(short_tmp / "bin")
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(home / "tmp"), "XDG_CACHE_HOME": str(home / ".cache"),
           "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    env.pop("XDG_RUNTIME_DIR", None)
    env.pop("FDL_ENV", None)
    done = subprocess.run([str(SCRIPT), "--", "fdl", "@cluster", "probe", "--json", "--skip-mount", "--collective",
                           "--collective-max-size", "64K"], cwd=short_tmp, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert [h["host"] for h in doc["hosts"]] == ["here", "over-ssh"] and doc["ok"], done.stdout
    check = next(c for c in doc["cluster"] if c["name"] == "collective")
    data = check["data"]
    assert check["status"] == "ok", check["message"]
    assert data["hosts"] == {"here": [0], "over-ssh": [1]} and data["world_size"] == 2, data
    assert data["skipped_hosts"] == {} and data["completed_ranks"] == 2
    assert [r["bytes"] for r in data["rows"]] == [8 << 10, 16 << 10, 32 << 10, 64 << 10]
    assert all(r["busbw_gbs"] > 0 for r in data["rows"]), data["rows"]  # traffic between the two, not a 1-rank 0
    time.sleep(0.5)
    assert_nothing_left(done.stderr, done.stdout, home / "tmp", home / ".cache", processes_mentioning(str(short_tmp)))


def test_ctrl_c_mid_training_stops_every_rank_and_the_private_sshd(short_tmp: Path) -> None:
    """Ctrl-C from the terminal reaches the script and fdl together (one process group); the script then stops
    everything the private sshd's sessions started and removes what it wrote."""
    need_torch()
    tmp_path = short_tmp  # SSH master sockets live below it (a socket path must fit in 108 bytes)
    home = tmp_path / "home"
    (home / "tmp").mkdir(parents=True)
    os.chmod(home / "tmp", 0o700)
    bin_dir = suite_bin(tmp_path / "bin")
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(home / "tmp"), "XDG_CACHE_HOME": str(home / ".cache"),
           "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    env.pop("XDG_RUNTIME_DIR", None)
    env.pop("FDL_ENV", None)
    proc = subprocess.Popen([str(SCRIPT), "--", "fdl", "@cluster", "train", "--", "--steps", "100000",
                             "--pause", "0.05"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    err_lines: list[str] = []
    try:
        deadline = time.monotonic() + 300
        assert proc.stderr is not None
        for line in proc.stderr:
            err_lines.append(line)
            if "ranks started on 2 host(s)" in line:
                break
            assert time.monotonic() < deadline, "".join(err_lines)
        else:
            out, err = proc.communicate(timeout=60)
            pytest.fail("the run never started its ranks:\n" + "".join(err_lines) + err + out)
        time.sleep(2)  # both ranks training
        ranks = processes_mentioning(str(tmp_path))
        assert any("train.py" in p for p in ranks), ranks
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = "".join(err_lines) + err
    assert proc.returncode == 130, err
    assert "try-local: exit 130; the private sshd is stopped and its directory removed." in err
    time.sleep(0.5)
    assert_nothing_left(err, out, home / "tmp", home / ".cache", processes_mentioning(str(tmp_path)))
