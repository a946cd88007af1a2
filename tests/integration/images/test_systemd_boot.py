"""A worker image booted under a real systemd: the unit's exit-code recipe, proven live.

A minimal Debian 12 root file system (tests/integration/images/nspawn.py, cached outside the repository) is
baked with the fdl_join_worker role the way an image build runs it: Ansible over SSH against the machine
being built, the collection playbook flodl.fdl.join_worker (found through fdl's own resource lookup) with
`fdl_join_worker_start=false`, fdl installed offline from a wheel of this checkout. The bake runs while no
systemd runs in the machine (a stub init and sshd only), so the role enables the unit offline, and is
cached too, keyed by everything that goes into it.

Each case then boots the baked image with `systemd-nspawn -b` (systemd as PID 1) on the testbed's bridge,
with a real controller on the testbed gateway, and asserts on systemd's own view: `systemctl show`,
`is-active`, the structured journal, and nspawn's exit when the machine powers itself off. What a boot
needs that an image does not carry (its address, the data host's key and host key, the training binary, or
not for the permanent case, faster re-dial timings in a drop-in) is written into the boot's overlay before it
starts,
the way cloud-init hands such things over. The data host is a testbed host serving a directory over sshfs;
the libtorch mirror is an HTTP directory on the gateway. This machine has no GPU: /dev/null bound at
/dev/nvidia0 stands in for a GPU's device node (a rank must see and open it; PrivateDevices= would hide it).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import io
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.integration.images import nspawn
from tests.integration.images.conftest import BIN, fdl_wheel, require_machines, tool_env
from tests.integration.join.helpers import Squatter, controller, policy
from tests.prometheus import promtool_accepts, samples

pytestmark = [pytest.mark.testbed(hosts=1), pytest.mark.slow]

UNIT = "flodl-join.service"
TOKEN_LABEL = "fdl-boot-test"
TRAIN = "/opt/fdl-test/train"
MODE = "/opt/fdl-test/mode"
DATA_KEY = "/etc/fdl/data_key"
DATA_PATH = "/var/lib/fdl-join/data"
SIGNATURE = "5157e57b007ab1e5"
# A training binary is all a rank needs to be: it answers fdl's signature probe, prints what a rank sees
# under the unit's hardening, then does what the mode file says (ok, fail: exit 1, hold: run until stopped).
TRAINER = rf"""#!/bin/sh
if [ "$FDL_SIGNATURE_PROBE" = 1 ]; then echo "fdl-signature: {SIGNATURE}"; exit 0; fi
mode=$(cat {MODE} 2>/dev/null || echo ok)
echo "train: rank=$RANK world=$WORLD_SIZE mode=$mode user=$(id -un)"
echo "train: data=$(ls "$FDL_DATA_PATH" 2>&1 | tr '\n' ' ')"
case "$LIBTORCH_PATH" in
  "$HOME"/.flodl/libtorch/*) [ -e "$LIBTORCH_PATH/lib/libtorch.so" ] && echo "train: libtorch=$LIBTORCH_PATH" ;;
  *) echo "train: libtorch=missing ($LIBTORCH_PATH)" ;;
esac
if [ -c /dev/nvidia0 ] && : < /dev/nvidia0; then echo "train: device=readable"; else echo "train: device=missing"; fi
case "$mode" in
  fail) echo "train: failing on purpose"; exit 1 ;;
  hold) echo "train: holding until stopped"; while :; do sleep 1; done ;;
esac
echo "train: done"
"""
# The readiness probe's timer (fdl_join_worker_probe_timer), baked in with a short interval; the join cases mask
# it, the probe case scripts a GPU for it through the fake NVML.
PROBE_TIMER = "flodl-probe.timer"
PROBE_SERVICE = "flodl-probe.service"
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
TEXTFILE = f"{TEXTFILE_DIR}/fdl-probe.prom"
PROBE_GPUS = "H100:9.0:80G:ecc_vol=1"  # one uncorrectable ECC error: a host that is not ready
FAKE_NVML_DIR = "/opt/fdl-test/nvml"
# journald's catalogue ids (systemd's sd-messages.h): structured fields, not wording
MSG_PROCESS_EXIT = "98e322203f7a4ed290d09fe03c09fe15"  # EXIT_CODE=, EXIT_STATUS=
MSG_UNIT_RESULT = "d9b373ed55a64feb8242e02dbe79a49c"  # UNIT_RESULT=
MSG_RESTART_SCHEDULED = "5eb03494b6584870a536b337290809b3"  # N_RESTARTS=
MSG_UNIT_STARTED = "39f53479d3a045ac8e11786248231fbf"  # JOB_RESULT= (a oneshot's "Finished ...")


# ------------------------------------------------------------------------------------------------ fixtures

class Site:
    """The testbed side of every boot: addresses, the data host, the libtorch mirror, the controller's port."""

    def __init__(self, bed, work: Path):
        self.bed = bed
        self.work = work
        self.data_host = bed.hosts[0]
        self.export = bed.shared / "dataset"
        self.export.mkdir(exist_ok=True)
        (self.export / "shard-0").write_text("tokens\n")
        os.chmod(self.export, 0o755)
        self.port = self._controller_port()
        self.token = hashlib.sha256(f"{TOKEN_LABEL}:{bed.prefix}:{bed.net}".encode()).hexdigest()[:32]
        self.mirror = self._serve_mirror()
        self.boots = 0

    def _controller_port(self) -> int:
        """The port baked into the join block: the first bindable of a fixed sequence, so the bake stays cached."""
        seed = int(nspawn.digest(self.bed.prefix, self.bed.net), 16)
        for i in range(16):
            port = 28000 + (seed + 97 * i) % 1000
            with socket.socket() as sock:
                try:
                    sock.bind((self.bed.gateway, port))
                except OSError:
                    continue
                return port
        raise RuntimeError("no free controller port in 28000-28999 on the testbed gateway")

    def _serve_mirror(self) -> str:
        """A libtorch mirror on the gateway: a tiny libtorch-cpu.zip and its sha256."""
        root = self.work / "mirror"
        root.mkdir()
        blob = io.BytesIO()
        with zipfile.ZipFile(blob, "w") as zf:
            zf.writestr("libtorch/lib/libtorch.so", b"")
            zf.writestr("libtorch/build-version", "2.13.0+cpu\n")
        (root / "libtorch-cpu.zip").write_bytes(blob.getvalue())
        (root / "libtorch-cpu.zip.sha256").write_text(
            f"{hashlib.sha256(blob.getvalue()).hexdigest()}  libtorch-cpu.zip\n")

        class Quiet(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(root), **kwargs)

            def log_message(self, *args) -> None:
                pass

        self.bed.verify()
        self.http = http.server.ThreadingHTTPServer((self.bed.gateway, 0), Quiet)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return f"http://{self.bed.gateway}:{self.http.server_address[1]}"

    @property
    def controller_addr(self) -> str:
        return f"{self.bed.gateway}:{self.port}"

    def join_vars(self) -> dict:
        """The fdl_join_worker variables of the bake (what an image build's join_vars file holds)."""
        h1 = self.data_host
        return {
            "fdl_join_worker_controller": self.controller_addr,
            "fdl_join_worker_token": self.token,
            "fdl_join_worker_devices": "cpu:1",
            "fdl_join_worker_libtorch": "cpu",
            "fdl_join_worker_identity": DATA_KEY,
            "fdl_join_worker_data_path": DATA_PATH,
            "fdl_join_worker_join_extra": {"bin": TRAIN, "data_source": f"sshfs://{h1.user}@{h1.address}:"
                                                                       f"{self.export}"},
            "fdl_join_worker_probe_timer": True,
            "fdl_join_worker_probe_interval_s": 10,
            "fdl_join_worker_probe_random_delay_s": 2,
        }

    def next_address(self) -> str:
        self.boots += 1
        address = f"{self.bed.net}.{200 + self.boots % 50}"
        assert address in {str(a) for a in self.bed.network.hosts()}
        return address


@pytest.fixture(scope="module")
def site(testbed):
    require_machines()
    work = Path(tempfile.mkdtemp(prefix=f"{testbed.prefix}-boot-", dir="/var/tmp"))
    s = Site(testbed, work)
    try:
        yield s
    finally:
        s.http.shutdown()
        s.http.server_close()
        subprocess.run(["rm", "-rf", str(work)], check=False)


def checkout_digest() -> str:
    """Everything of this checkout that lands in the image: the package and the Ansible content it ships."""
    from fdl import resources

    h = hashlib.sha256()
    from fdl.collection import PARTS

    roots = [REPO / "fdl", *(REPO / part for _, part in PARTS), resources.templates_dir(), resources.ansible_cfg(),
             REPO / "pyproject.toml"]
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()
                                                      and "__pycache__" not in p.parts)
        for path in files:
            h.update(str(path.relative_to(REPO) if path.is_relative_to(REPO) else path).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="module")
def image(site, request) -> list[Path]:
    """The baked image's layers (uppermost first): the role's layer over the cached Debian root."""
    base = nspawn.base_rootfs()
    key = nspawn.digest(base.parent.name, checkout_digest(), site.join_vars(), nspawn.RECIPE)

    def build(tmp: Path) -> None:
        wheelhouse = request.getfixturevalue("wheelhouse")
        bake(tmp, base=base, site=site, wheelhouse=wheelhouse)

    baked = nspawn.cached(f"worker-{key}", build)
    return [baked / "upper", base]


def bake(tmp: Path, *, base: Path, site: Site, wheelhouse: Path) -> None:
    """Run the collection playbook join_worker.yml over SSH against the machine being built, as an image build does."""
    from fdl import resources

    bed = site.bed
    address = site.next_address()
    client = Path(tempfile.mkdtemp(prefix="fdlb", dir="/tmp"))  # short: ssh control sockets live under it
    key = client / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    machine = nspawn.Machine([base], tmp, name=f"{bed.prefix}bake", bridge=bed.bridge)
    with machine:
        machine.write("/root/.ssh/authorized_keys", key.with_suffix(".pub").read_text(), mode=0o600)
        machine.path("/root/.ssh").chmod(0o700)
        host_key = machine.path("/etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
        (client / "known_hosts").write_text(f"{address} {' '.join(host_key)}\n")
        bed.verify()
        # No systemd runs while baking: a stub init, the network and sshd, nothing else.
        machine.boot(binds=(f"ro:{wheelhouse}:/srv/wheels",), command=(
            "/bin/sh", "-c", f"ip link set lo up && ip addr add {address}/24 dev host0 && ip link set host0 up "
                             f"&& mkdir -p /run/sshd && exec /usr/sbin/sshd -D -e"))
        wait_port(address, 22, machine)
        inventory = client / "hosts.yml"
        inventory.write_text(yaml.safe_dump({"all": {"hosts": {"worker": {
            "ansible_host": address, "ansible_user": "root", "ansible_ssh_private_key_file": str(key),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={client / 'known_hosts'}"}}}}))
        variables = client / "join-vars.json"
        variables.write_text(json.dumps({
            **site.join_vars(),
            "fdl_join_worker_install_from": "wheel", "fdl_join_worker_wheel": str(fdl_wheel(wheelhouse)),
            "fdl_join_worker_pip_extra_args": ["--no-index", "--find-links", "/srv/wheels"],
        }))
        env = tool_env(client / "home", {"ANSIBLE_CONFIG": str(resources.ansible_cfg()),
                                          "ANSIBLE_COLLECTIONS_PATH": str(resources.collections_path())})
        done = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory),
                               str(resources.playbook("join_worker.yml")), "-e", f"@{variables}",
                               "-e", json.dumps({"fdl_join_worker_start": False})],
                              capture_output=True, text=True, env=env, timeout=900)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-8000:]
        assert site.token not in out
    # the image keeps what the role made, not the bake's own access
    for leftover in ("root/.ssh/authorized_keys", "srv/wheels"):
        path = tmp / "upper" / leftover
        if path.is_dir():
            path.rmdir()
        else:
            path.unlink(missing_ok=True)
    subprocess.run(["rm", "-rf", str(tmp / "ovlwork"), str(tmp / "root"), str(client)], check=True)


def wait_port(address: str, port: int, machine: nspawn.Machine, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
            return
        if not machine.running() or time.monotonic() > deadline:
            raise AssertionError(f"{address}:{port} never answered:\n{machine.console_text()[-3000:]}")
        time.sleep(0.2)


@contextlib.contextmanager
def booted(site: Site, image: list[Path], *, mode: str = "ok", token: str | None = None,
           probe_nvml: Path | None = None, binary: bool = True):
    """Boot the baked image on the bridge, with the per-boot files written first; always torn down.

    The readiness probe's timer is masked unless `probe_nvml` (a built fake NVML's directory) is given: then
    the probe's service finds that library and PROBE_GPUS, and the GPU's device nodes are bound in. With
    `binary=False` the training binary the unit names is missing (a permanent, local failure)."""
    bed = site.bed
    address = site.next_address()
    work = Path(tempfile.mkdtemp(prefix="boot-", dir=site.work))
    machine = nspawn.Machine(image, work, name=f"{bed.prefix}w{site.boots}", bridge=bed.bridge)
    with machine:
        machine.network(address)
        machine.write("/etc/systemd/system/flodl-join.service.d/50-boot-test.conf", "\n".join([
            "# The boot tests: quick re-dials, and the libtorch mirror on the testbed gateway.",
            "[Service]",
            "Environment=FDL_JOIN_BACKOFF_BASE_S=0.5 FDL_JOIN_BACKOFF_MAX_S=2",
            f"Environment=FDL_LIBTORCH_MIRROR={site.mirror}", ""]))
        machine.write(DATA_KEY, site.bed.key.read_text(), mode=0o600, owner="flodl")
        machine.write("/etc/ssh/ssh_known_hosts", site.bed.known_hosts.read_text())
        if binary:
            machine.write(TRAIN, TRAINER, mode=0o755)
        machine.write(MODE, mode + "\n")
        if token is not None:
            machine.write("/etc/fdl/join.env", f"FDL_JOIN_TOKEN={token}\n", mode=0o600)
        # /dev/fuse as udev leaves it on a Debian machine (0666: the agent's sshfs opens it unprivileged first);
        # this host has no udev, and its own node is 0600.
        fuse = work / "fuse"
        os.mknod(fuse, stat.S_IFCHR | 0o666, os.makedev(10, 229))
        fuse.chmod(0o666)
        binds = [f"{fuse}:/dev/fuse", "/dev/null:/dev/nvidia0"]
        if probe_nvml is None:  # the join cases count the agent's processes and journal: no probe among them
            timer = machine.path(f"/etc/systemd/system/{PROBE_TIMER}")
            timer.unlink()
            timer.symlink_to("/dev/null")
        else:
            lib = machine.path(f"{FAKE_NVML_DIR}/libnvidia-ml.so.1")
            lib.parent.mkdir(parents=True)
            shutil.copy(probe_nvml / "libnvidia-ml.so.1", lib)
            # The bake is a CPU worker (cpu:1), so its timer judges the host as a CPU host; here the host is
            # given a GPU, and its probe runs as a GPU worker's would: the baked command without that one flag.
            (baked,) = [line for line in machine.path(f"/etc/systemd/system/{PROBE_SERVICE}").read_text()
                        .splitlines() if line.startswith("ExecStart=")]
            assert " probe --devices cpu:1 " in baked, baked
            machine.write(f"/etc/systemd/system/{PROBE_SERVICE}.d/50-boot-test.conf", "\n".join([
                "# The boot test: a scripted GPU for NVML, and proof that the unit's hardening leaves a GPU's",
                "# device node open for reading and writing (here a real character device that is not one of",
                "# the pseudo-devices every device policy allows).",
                "[Service]",
                f'Environment=LD_LIBRARY_PATH={FAKE_NVML_DIR} "FDL_FAKE_NVML={PROBE_GPUS}"',
                "ExecStartPre=/bin/sh -c ': <>/dev/nvidia0'",
                "ExecStart=", baked.replace(" probe --devices cpu:1 ", " probe "), ""]))
            binds = [f"{fuse}:/dev/fuse", f"{fuse}:/dev/nvidia0", "/dev/null:/dev/nvidiactl",
                     "/dev/null:/dev/nvidia-uvm"]
        bed.verify()
        machine.boot(binds=tuple(binds))
        machine.address = address
        try:
            yield machine
        except BaseException:
            print_journal(machine)
            raise


def print_journal(machine: nspawn.Machine) -> None:
    """On a failure: the unit's journal lines and the console, for whoever reads the test report."""
    print(f"----- {machine.name}: journal of {UNIT}")
    text = ""
    with contextlib.suppress(nspawn.MachineError):
        if machine.running() and machine.sh("systemctl is-system-running").stdout.strip() in ("running", "degraded"):
            text = machine.journal(UNIT)
    if not text:  # gone or going down: read what it left on disk
        machine.wait_exit(30)
        text = "\n".join(f"{e.get('SYSLOG_IDENTIFIER', '')}: {e.get('MESSAGE')}" for e in machine.saved_journal()
                         if UNIT in (e.get("UNIT"), e.get("_SYSTEMD_UNIT")))
    print(text[-12000:])
    print(f"----- {machine.name}: console")
    print(machine.console_text()[-3000:])


def fdl_lines(machine: nspawn.Machine) -> str:
    """What fdl itself (and its ranks, through it) wrote to the journal: the unit's messages."""
    return machine.sh(f"journalctl --no-pager -o cat _SYSTEMD_UNIT={UNIT}", timeout=30).stdout


def wait_until(predicate, timeout: float, what: str, machine: nspawn.Machine | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if machine is not None and not machine.running():
            raise AssertionError(f"{machine.name} stopped while waiting for {what} (nspawn rc "
                                 f"{machine.wait_exit(5)})")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def show(machine: nspawn.Machine) -> dict:
    return machine.show(UNIT, "ActiveState", "SubState", "Result", "NRestarts", "MainPID", "ExecMainPID",
                        "ExecMainCode", "ExecMainStatus", "ControlGroup")


def in_cgroup(machine: nspawn.Machine, cgroup: str) -> list[str]:
    """PIDs in the machine whose cgroup is the unit's (cgroup v1 or v2: /proc/PID/cgroup names it either way)."""
    assert cgroup.startswith("/system.slice/"), cgroup
    found = machine.sh(f"grep -lE ':{cgroup}(/|$)' /proc/[0-9]*/cgroup").stdout.split()
    return [path.split("/")[2] for path in found if path.split("/")[2] != "self"]


def a_policy(site: Site, **kwargs):
    base = dict(token=site.token, max_hosts=1, window_s=60, heartbeat_s=0.5, poll_s=2.0)
    base.update(kwargs)
    return policy(**base)


def finished(server) -> bool:
    return server.state()["phase"] in ("done", "failed")


# ------------------------------------------------------------------------------------------------ the cases

def test_the_unit_starts_at_boot_joins_and_its_rank_runs_under_the_hardening(site, image):
    with controller(a_policy(site), host=site.bed.gateway, port=site.port) as server, \
            booted(site, image) as machine:
        machine.wait_booted()
        assert machine.sh(f"systemctl is-enabled {UNIT}").stdout.strip() == "enabled"
        wait_until(lambda: finished(server), 90, "the run to finish", machine)
        state = server.state()
        status = show(machine)
        fdl = fdl_lines(machine)
        assert state["phase"] == "done", state
        (member,) = state["roster"]
        assert member["exit_code"] == 0 and member["host"] == machine.name and member["address"] == machine.address
        # systemd's view: the unit started at boot, still runs (persist re-dials), never restarted
        assert status["ActiveState"] == "active" and status["SubState"] == "running", status
        assert status["NRestarts"] == "0" and status["Result"] == "success", status
        assert machine.sh(f"systemctl is-active {UNIT}").stdout.strip() == "active"
        # fdl's own lines in the journal: the libtorch cache, the sshfs mount, admission, the rank's report
        assert f"admitted by {site.controller_addr}" in fdl, fdl
        assert "libtorch: installed cpu" in fdl and "mounted sshfs://" in fdl, fdl
        assert "train: rank=0 world=1 mode=ok user=flodl" in fdl, fdl
        # what the hardening must leave working, as a rank saw it
        assert "train: data=shard-0" in fdl, fdl  # the sshfs data mount (setuid fusermount3, /dev/fuse)
        assert "train: libtorch=/home/flodl/.flodl/libtorch/precompiled/cpu" in fdl, fdl  # the cache in ~
        assert "train: device=readable" in fdl, fdl  # a device node bound in, the way a GPU's is
        assert "ranks finished: exit 0" in fdl, fdl


def test_transient_failures_are_redialled_without_a_restart_storm(site, image):
    with booted(site, image, mode="fail") as machine:
        machine.wait_booted()
        first = show(machine)
        # the controller is down at boot: fdl re-dials inside the same process
        wait_until(lambda: fdl_lines(machine).count("persist: re-dialing") >= 2, 60, "re-dials", machine)
        with controller(a_policy(site), host=site.bed.gateway, port=site.port) as server:
            wait_until(lambda: finished(server), 60, "the failing window", machine)
            assert server.state()["phase"] == "failed" and server.state()["roster"][0]["exit_code"] == 1
        machine.write(MODE, "ok\n")
        with controller(a_policy(site), host=site.bed.gateway, port=site.port) as server:
            wait_until(lambda: finished(server), 60, "the next window", machine)
            assert server.state()["phase"] == "done" and server.state()["roster"][0]["exit_code"] == 0
        status = show(machine)
        assert status["ActiveState"] == "active" and status["NRestarts"] == "0", status
        assert status["MainPID"] == first["MainPID"] != "0", (first, status)  # one process all along
        fdl = fdl_lines(machine)
        assert f"transient failure: no run listening at {site.controller_addr}" in fdl, fdl
        assert "train: failing on purpose" in fdl and "persist: the agent exited 1" in fdl, fdl

        # a crash (the agent killed outright) is systemd's to mend: Restart=always, once, after RestartSec
        machine.sh(f"kill -KILL {status['MainPID']}", check=True)
        wait_until(lambda: show(machine)["NRestarts"] == "1" and show(machine)["SubState"] == "running", 30,
                   "systemd to restart the agent", machine)
        with controller(a_policy(site), host=site.bed.gateway, port=site.port) as server:
            wait_until(lambda: finished(server), 60, "the window after the restart", machine)
            assert server.state()["phase"] == "done"
        status = show(machine)
        assert status["NRestarts"] == "1" and status["ActiveState"] == "active", status
        assert status["MainPID"] not in (first["MainPID"], "0")
        restarts = [e for e in machine.entries(UNIT) if e.get("MESSAGE_ID") == MSG_RESTART_SCHEDULED]
        assert [e.get("N_RESTARTS") for e in restarts] == ["1"], restarts


def test_a_squatter_or_a_wrong_token_makes_the_unit_redial_not_power_off(site, image):
    """regression: any answer without a valid proof was permanent, so whatever answered at the controller's
    address (an unprivileged account's listener on the training port between runs, a reused address) made the
    agent exit 2 and the unit power the box off; so did a controller holding another token. Both are learned
    from the network: the agent re-dials in the same process, says the likely causes, and joins the real run."""
    with booted(site, image) as machine:
        machine.wait_booted()
        first = show(machine)
        squatter = Squatter(site.port, host=site.bed.gateway)  # another account of the controller box
        try:
            wait_until(lambda: "dials in a row reached no controller that proves" in fdl_lines(machine), 120,
                       "the loud warning", machine)
        finally:
            squatter.stop()
        with controller(a_policy(site, token="another-farms-token"), host=site.bed.gateway, port=site.port) as other:
            # another token cannot check that controller's signed GET /join/id: nothing more is sent to it
            wait_until(lambda: other.accepted >= 2, 60, "dials at another token", machine)
            assert other.state()["roster"] == [] and other.state()["refusals"] == {}
        with controller(a_policy(site), host=site.bed.gateway, port=site.port) as server:
            wait_until(lambda: finished(server), 90, "the real run", machine)
            assert server.state()["phase"] == "done" and server.state()["roster"][0]["exit_code"] == 0
        status = show(machine)
        fdl = fdl_lines(machine)
        assert machine.running()
        assert status["ActiveState"] == "active" and status["NRestarts"] == "0", status  # re-dialled by fdl
        assert status["MainPID"] == first["MainPID"] != "0", (first, status)  # one process all along
        assert "could not prove it holds the run's token" in fdl and "go away" not in fdl, fdl  # nothing asked
        assert "something else answers at that address" in fdl and "timedatectl set-ntp true" in fdl, fdl
        assert not [e for e in machine.entries(UNIT) if e.get("MESSAGE_ID") == MSG_PROCESS_EXIT]  # never exited
        assert site.token not in fdl


def test_a_missing_binary_stops_the_unit_and_powers_the_machine_off(site, image):
    with controller(a_policy(site), host=site.bed.gateway, port=site.port) as server, \
            booted(site, image, binary=False) as machine:
        # no wait_booted(): the permanent check runs before any dial, so the box may power off before its boot
        # is seen as finished; what the test asks is that it powers off, and the journal says why
        code = machine.wait_exit(90)
        assert code == 0, f"nspawn did not see the machine power off (rc {code})"  # poweroff, not a reboot (133)
        state = server.state()
        journal = machine.saved_journal()
        unit = [e for e in journal if e.get("UNIT") == UNIT or e.get("_SYSTEMD_UNIT") == UNIT]
        try:
            exits = [e for e in unit if e.get("MESSAGE_ID") == MSG_PROCESS_EXIT]
            assert [(e.get("EXIT_CODE"), e.get("EXIT_STATUS")) for e in exits] == [("exited", "2")], exits
            results = [e.get("UNIT_RESULT") for e in unit if e.get("MESSAGE_ID") == MSG_UNIT_RESULT]
            assert results == ["exit-code"], results
            assert not [e for e in unit if e.get("MESSAGE_ID") == MSG_RESTART_SCHEDULED]
            fdl = "\n".join(str(e.get("MESSAGE")) for e in unit if e.get("_SYSTEMD_UNIT") == UNIT)
            assert f"the training binary {TRAIN} is not on this box" in fdl, fdl
            assert site.token not in fdl
        except AssertionError:
            print_journal(machine)
            raise
        # found on the box before any dial: the controller never heard of it
        assert state["refusals"] == {} and state["roster"] == [], state


def test_systemctl_stop_ends_ranks_and_agent_cleanly(site, image):
    with controller(a_policy(site), host=site.bed.gateway, port=site.port) as server, \
            booted(site, image, mode="hold") as machine:
        machine.wait_booted()
        wait_until(lambda: "train: holding until stopped" in fdl_lines(machine), 90, "the rank to run", machine)
        assert server.state()["phase"] == "training"
        cgroup = show(machine)["ControlGroup"]
        assert len(in_cgroup(machine, cgroup)) >= 2  # the agent and its rank
        stopped = machine.sh(f"systemctl stop {UNIT}", timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        status = show(machine)
        state = server.state()
        fdl = fdl_lines(machine)
        # systemd's view: a clean stop (fdl died of the SIGTERM it was sent), nothing left of the unit
        assert status["ActiveState"] == "inactive" and status["Result"] == "success", (status, fdl)
        assert status["ExecMainCode"] == "2" and status["ExecMainStatus"] == "15", status  # killed by SIGTERM
        assert status["NRestarts"] == "0" and status["ControlGroup"] == "", status
        assert in_cgroup(machine, cgroup) == [], "processes outlived the unit"
        flodl = machine.ids("flodl")[0]
        assert machine.sh(f"find /proc -maxdepth 1 -user {flodl} -name '[0-9]*'").stdout.strip() == ""
        # the controller heard of it
        (member,) = state["roster"]
        assert member["exit_code"] == 128 + 15, state
        assert "ranks finished: exit 143" in fdl, fdl


def test_the_probe_timer_keeps_the_metrics_file_fresh_as_the_agents_account(site, image, fake_nvml):
    with booted(site, image, probe_nvml=fake_nvml.lib_dir) as machine:
        machine.wait_booted()
        assert machine.sh(f"systemctl is-enabled {PROBE_TIMER}").stdout.strip() == "enabled"
        assert machine.sh(f"systemctl is-active {PROBE_TIMER}").stdout.strip() == "active"
        textfile = machine.path(TEXTFILE)

        def last_run() -> float | None:
            with contextlib.suppress(OSError, KeyError):
                return samples(textfile.read_text())[("fdl_probe_last_run_timestamp_seconds", ())]
            return None

        first = wait_until(last_run, 90, "the first metrics file", machine)
        text = textfile.read_text()
        later = wait_until(lambda: (last_run() or 0) > first and last_run(), 90, "the timer's next probe", machine)
        assert later > first
        # what the probe found, through the unit's sandbox: NVML answered, the device nodes are usable, the
        # scripted ECC error counted and made the host not ready
        promtool_accepts(text)
        values = samples(text)
        assert values[("fdl_probe_check_status", (("check", "gpu"), ("status", "ok")))] == 1
        assert values[("fdl_probe_check_status", (("check", "device_nodes"), ("status", "ok")))] == 1
        assert values[("fdl_gpu_ecc_uncorrected_errors_total", (("gpu", "0"), ("scope", "volatile")))] == 1
        assert values[("fdl_probe_ready", ())] == 0
        # systemd's view: the timer started the oneshot as the agent's account; "not ready" (exit 1) is a
        # success of the unit, the answer being in the file
        status = machine.show(PROBE_SERVICE, "User", "Result", "ExecMainStatus", "NRestarts")
        assert status["User"] == "flodl" and status["Result"] == "success", status
        assert status["ExecMainStatus"] == "1", status
        runs = [e for e in machine.entries(PROBE_SERVICE) if e.get("MESSAGE_ID") == MSG_UNIT_STARTED]
        assert len(runs) >= 2 and {e.get("JOB_RESULT") for e in runs} == {"done"}, runs  # "Finished ...", twice
        # the file: the account's own, world-readable (node_exporter reads it), alone in the directory (no
        # temporary file left); the directory: the probe group's to write, sticky
        uid, gid = machine.ids("flodl")
        info = textfile.stat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (uid, gid, 0o644)
        assert sorted(p.name for p in textfile.parent.iterdir()) == ["fdl-probe.prom"]
        directory = textfile.parent.stat()
        group = machine.sh("getent group fdl-textfile", check=True).stdout.split(":")
        assert (directory.st_uid, directory.st_gid, stat.S_IMODE(directory.st_mode)) == (0, int(group[2]), 0o1775)
        # the agent itself runs without that group: only the probe's service may write there
        agent = show(machine)["MainPID"]
        groups = machine.sh(f"grep '^Groups:' /proc/{agent}/status", check=True).stdout.split()[1:]
        assert agent != "0" and group[2] not in groups, groups
