"""The farm end to end, the way docs/join-config.md has an operator build it, under a real systemd.

The controller box is testbed host h1, and its operator is h1's own account, in h1's network namespace: it
runs `fdl join-config` for door b, the tunnel-only door and door a (the wizard installs the key lines through
the fdl_join_door role, as that account), then the privileged line each report prints, as root (the drop-ins
checked with sshd -t and h1's sshd reloaded through its pid file; door a's account, jail and read-only bind),
then each door's self-test. h1's sshd configuration gets what a Debian box has and a testbed host lacks: an
`Include` of its sshd_config.d/ at the top (and door a's account in its AllowUsers). The jail's bind mount
is made in this machine's mount namespace, which a running testbed sshd does not see (`ip netns exec` gave it
a copy of the mount table at its start): h1's sshd is started again once, after the privileged lines, so that
door a's self-test reaches the bound data. That is as far as door a goes here; the worker below is door b's.

The operator publishes a training tree (`fdl publish`, into the served directory door b serves), and boots a
worker from door b's generated cloud-init user-data: a Debian 12 root with systemd as PID 1 under
systemd-nspawn (tests/integration/images/nspawn.py; cached, with Debian's cloud-init 22.4 baked into a layer
of its own), on the testbed's bridge. The real cloud-init applies the user-data at boot from a NoCloud seed:
no step of it is replayed by the test. The image has fdl on its PATH (/usr/local/bin/fdl, into a venv of the
image's own python3 that sees this suite's packages, torch included: bound read-only, the way a golden image
carries its install). The user-data is MIME multipart, as operators combine their own cloud-config with a
generated one: the generated part byte for byte, and the operator's part (merged by cloud-init's
`merge_how`), which adds what join-config does not know about: a dataset on a data host (testbed host h3,
whose account trusts the farm key read-only) and one CPU rank (the box has no GPU) as an env overlay of the
worker's fdl.yml (`fdl.box.yml`, selected with FDL_ENV in the unit's environment file), quick re-dials
(FDL_JOIN_BACKOFF_*), the gloo interface, and the data host's key in known_hosts. /home is a small file
system of its own (16 MB).

The worker joins through door b with the farm key: the forward to the controller and the published tree pulled
through rrsync. A 2-host run trains (`fdl @<farm> train`, start: manual, so the operator fires `fdl @<farm>
start` once both are in): testbed host h2 is the roster worker, the booted box the walk-in, one CPU rank
each, gloo between them over the bridge, and both print the same weights checksum. Then, while the
`--persist` worker waits for the next run, each fault in turn: (1) the controller dies (SIGKILL, its worker
admitted and waiting for the world) and starts again; (2) the data host's sshd restarts, killing the sshfs
session (the mount goes stale); (3) another account of the worker box (cloud-init's default user) fills
/home, where the agent's stage is; (4) a publish whose `bin` was renamed (a `--no-build` publish: nothing
gates it). After each: the unit is still active with the same main process and no restart, the box is up,
and once the fault clears the worker trains in the next run. Last, the worker's own configuration is made to
name a binary that is not there (its overlay: `source: null`, `bin: <missing>`) and the unit restarted: the
agent exits 2 before any dial, and the unit's ExecStopPost powers the box off (nspawn exits 0).

A failure's message carries the unit's journal (the agent's log), the last launcher's output (the
controller's log), cloud-init's status and the door's sshd log.
"""

from __future__ import annotations

import contextlib
import email.mime.multipart
import email.mime.text
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.integration.images import nspawn
from tests.integration.images.conftest import require_machines
from tests.integration.launch.helpers import DEMO, fdl_python

pytestmark = [pytest.mark.testbed(hosts=3), pytest.mark.slow]

UNIT = "flodl-join.service"  # the unit --cloud-init writes (fdl.farm.wizard.apply.CLOUD_UNIT)
SIGNATURE = "f4a9e0d1c2b3a495"
STEPS = "3"
BOX_ENV = "box"  # the worker's own env overlay (fdl.box.yml beside the generated fdl.yml, FDL_ENV=box)
DATA_PATH = "/home/flodl/data"  # the worker's dataset root: in the agent's home (/ is root's)
HOME_SIZE = "16m"
MISSING_BIN = "/opt/train/train-that-is-not-there"
MSG_PROCESS_EXIT = "98e322203f7a4ed290d09fe03c09fe15"  # journald's catalogue: EXIT_CODE=, EXIT_STATUS=
MSG_RESTART_SCHEDULED = "5eb03494b6584870a536b337290809b3"  # ... and a restart systemd scheduled
# The published tree's training script, one file (the launcher ships a roster host the bin alone): it answers
# fdl's model-signature probe, says what the data its box mounted holds, then is the quickstart's DDP demo.
TRAIN = """#!{python}
# The farm's training script: the signature, the data this box sees, then the quickstart's demo below.
__doc__ = "the quickstart's demo, published to a farm"  # the demo's argparse reads it (its own docstring follows)
import os
import sys

if os.environ.get("FDL_SIGNATURE_PROBE") == "1":
    print("fdl-signature: {signature}", flush=True)
    sys.exit(0)
try:
    with open(os.path.join(os.environ["FDL_DATA_PATH"], "shard-0")) as shard:
        print("data:", shard.read().strip(), flush=True)
except (KeyError, OSError) as exc:
    print("data: none", type(exc).__name__, flush=True)
"""
CHECKSUM = re.compile(r"^\[(?P<host>[^/\]]+)/(?P<rank>\d+)\] rank (?P=rank)/2 on \S+: .*weights checksum "
                      r"(?P<sum>[0-9a-f]{16})$", re.M)


# ------------------------------------------------------------------------------------------------ the operator

def operator_python(where: Path) -> Path:
    """A python3 any testbed account (and the booted worker) can run, that imports fdl and torch, with fdl's
    console scripts (fdl, ansible-playbook, ...) beside it: fdl runs the Ansible installed next to it."""
    python = fdl_python(where)
    ours = Path(sys.executable).parent
    for script in [ours / "fdl", *sorted(ours.glob("ansible*"))]:
        text = script.read_text()
        first, _, rest = text.partition("\n")
        if not first.startswith("#!") or "python" not in first:
            continue
        target = python.parent / script.name
        target.write_text(f"#!{python}\n{rest}")
        target.chmod(0o755)
    subprocess.run(["chmod", "-R", "a+rX", str(where)], check=True)
    return python


class Operator:
    """The controller box's operator: testbed host h1's own account, in h1's network namespace."""

    def __init__(self, host, python: Path):
        self.host = host
        self.python = python
        self.home = host.home
        self.project = host.home / "farm"
        self.launched: list[tuple[str, str]] = []  # every launcher's (stdout, stderr), for diagnostics

    def argv(self, *args: str) -> list[str]:
        h = self.host
        return ["ip", "netns", "exec", h.namespace, "setpriv", f"--reuid={h.user}", f"--regid={h.user}",
                "--init-groups", "env", "-i", f"HOME={self.home}", f"USER={h.user}", f"LOGNAME={h.user}",
                f"PATH={self.python.parent}:/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "NO_COLOR=1", *args]

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        self.host.bed.verify()
        return subprocess.run(self.argv(*args), cwd=self.project, capture_output=True, text=True, timeout=timeout)

    def fdl(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.run(str(self.python), "-m", "fdl", *args, timeout=timeout)

    def launch(self, *args: str) -> subprocess.Popen:
        self.host.bed.verify()
        return subprocess.Popen(self.argv(str(self.python), "-m", "fdl", *args), cwd=self.project,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def write(self, path: Path, text: str, mode: int = 0o644) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        shutil.chown(path, self.host.user, self.host.user)
        return path

    def mkdir(self, path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        shutil.chown(path, self.host.user, self.host.user)
        return path


# ------------------------------------------------------------------------------------------------ the farm

class Farm:
    """Everything the test builds, and what a failure's message reads."""

    def __init__(self, bed, work: Path):
        self.bed = bed
        self.work = work
        self.ctl, self.roster, self.data = bed.hosts
        self.op = Operator(self.ctl, operator_python(work / "py"))
        self.labels = {door: f"{bed.prefix}{door[0]}" for door in ("b", "tunnel-only", "a")}
        self.label = self.labels["b"]
        ports = iter(range(24000 + int(nspawn.digest(bed.prefix), 16) % 500 * 2, 26000))
        self.door_port = {door: next(ports) for door in self.labels}
        self.controller_port = {door: next(ports) + 100 for door in self.labels}
        self.jail_base = work / "doors"  # door a's jail: every directory above it root's alone (sshd's rule)
        self.served_a = work / "door-a-data"
        self.machine: nspawn.Machine | None = None
        self.name = f"{bed.prefix}w1"
        self.reports: dict[str, dict] = {}
        self.started = time.monotonic()

    def phase(self, name: str) -> None:
        """A line per phase with the seconds since the test began (pytest shows it with -s, or on a failure)."""
        print(f"farm: +{time.monotonic() - self.started:6.1f} s  {name}", flush=True)

    # the controller box ----------------------------------------------------------------------------------
    def sshd_config(self) -> Path:
        return self.ctl.sshd_dir / "sshd_config"

    def prepare_controller_box(self) -> None:
        """What a Debian box has and a testbed host lacks: an Include of sshd_config.d/ first (and the jailed
        account of door a allowed in); the operator's ssh key and known hosts for the roster worker."""
        self.drop_jailed_account()  # a crashed run's
        self.jail_base.mkdir(mode=0o755)
        config = self.sshd_config()
        dropins = config.parent / "sshd_config.d"
        dropins.mkdir(exist_ok=True)
        text = config.read_text().replace(f"AllowUsers {self.ctl.user}",
                                          f"AllowUsers {self.ctl.user} fdl-{self.labels['a']}")
        config.write_text(f"Include {dropins}/*.conf\n{text}")
        subprocess.run(["/usr/sbin/sshd", "-t", "-f", str(config)], check=True, capture_output=True)
        self.restart_ctl_sshd()
        ssh = self.op.mkdir(self.op.home / ".ssh")
        self.op.write(ssh / "id_ed25519", self.bed.key.read_text(), 0o600)
        self.op.write(ssh / "known_hosts_testbed", self.bed.known_hosts.read_text())
        self.op.mkdir(self.op.project)

    def restart_ctl_sshd(self) -> None:
        self.ctl.stop_sshd()
        self.ctl.start_sshd()

    def write_project(self) -> None:
        """fdl.yml: the training command, in launcher mode (cluster: true, what opens a farm's window), and the
        roster worker (h2); the training tree under src/."""
        op, h2 = self.op, self.roster
        demo = DEMO.read_text().replace("from __future__ import annotations\n", "")
        op.write(op.project / "src" / "train.py", TRAIN.format(python=op.python, signature=SIGNATURE) + demo, 0o755)
        doc = {"commands": {"train": {"cluster": True, "bin": "src/train.py", "args": ["--steps", STEPS]}},
               "cluster": {"ssh": {"known_hosts": str(op.home / ".ssh" / "known_hosts_testbed")},
                           "workers": [{"host": h2.name, "address": h2.address, "user": h2.user,
                                        "identity": str(op.home / ".ssh" / "id_ed25519"), "local_devices": "cpu:1",
                                        "env": {"GLOO_SOCKET_IFNAME": "eth0"}}]}}
        op.write(op.project / "fdl.yml", yaml.safe_dump(doc, sort_keys=False))
        self.served_a.mkdir()
        (self.served_a / "shard-0").write_text("door a's data\n")
        subprocess.run(["chmod", "-R", "a+rX", str(self.served_a)], check=True)

    def join_config(self, door: str) -> dict:
        label, user = self.labels[door], self.ctl.user
        extra: list[str] = []
        if door == "a":
            user = f"fdl-{label}"
            extra = ["--served", str(self.served_a), "--jail-dir", str(self.jail_base)]
        done = self.op.fdl("join-config", label, "--door", door, "--controller",
                           f"{user}@{self.ctl.address}:{self.door_port[door]}", "--port",
                           str(self.controller_port[door]), "--sshd-config", str(self.sshd_config()),
                           "--install-key", "--cloud-init", "--yes", "--json", *extra)
        assert done.returncode == 0, f"join-config {label} (door {door}): {done.stderr}{done.stdout}"
        report = json.loads(done.stdout)
        self.reports[door] = report
        return report

    def apply_privileged(self, door: str) -> None:
        """The report's one privileged line, as root (who this test is; --become would ask sudo for it)."""
        (step,) = [s for s in self.reports[door]["steps"] if s["command"] and "ansible-playbook" in s["command"]]
        command = step["command"]
        assert command.endswith(f"-e @.fdl/{self.labels[door]}/join-door.yml --become"), command
        command = command.removesuffix(" --become")
        if door == "a":  # the fstab line goes to a file of the test's: this machine's boot is not the test's
            command += f" -e fdl_join_door_fstab={self.work / 'fstab'}"
        home = self.work / "root-home"
        home.mkdir(exist_ok=True, mode=0o700)
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}
        done = subprocess.run(["/bin/sh", "-c", command], cwd=self.op.project, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"the privileged line of door {door}: {command}\n{done.stdout}{done.stderr}"

    def selftest(self, door: str) -> None:
        done = self.op.run("sh", f".fdl/{self.labels[door]}/door-selftest.sh", timeout=300)
        out = done.stdout + done.stderr
        assert done.returncode == 0 and "door self-test passed" in out and "FAIL" not in out, \
            f"door {door}'s self-test:\n{out}"

    def farm_dir(self, door: str = "b") -> Path:
        return self.op.project / ".fdl" / self.labels[door]

    def token(self) -> str:
        return (self.farm_dir() / "token").read_text().strip()

    def publish(self, *args: str) -> subprocess.CompletedProcess:
        return self.op.fdl("publish", f"file://{self.op.project / 'src'}", *args, "--", "--steps", STEPS,
                           timeout=600)

    # the data host ---------------------------------------------------------------------------------------
    def serve_data(self) -> str:
        """h3's account serves a dataset over sftp to the farm key (read-only, no forwarding, no shell)."""
        h3 = self.data
        dataset = h3.home / "dataset"
        dataset.mkdir()
        (dataset / "shard-0").write_text(f"tokens from {h3.name}\n")
        subprocess.run(["chown", "-R", f"{h3.user}:{h3.user}", str(dataset)], check=True)
        public = (self.farm_dir() / "key.pub").read_text().strip()
        h3.authorize(f'restrict,command="internal-sftp -R" {public}')
        return f"sshfs://{h3.user}@{h3.address}:{dataset}"

    # the worker ------------------------------------------------------------------------------------------
    def user_data(self, data_source: str) -> str:
        """Door b's generated user-data and the operator's own part, as one MIME multipart user-data."""
        generated = (self.farm_dir() / "cloud-init.yml").read_text()
        known = [line for line in self.bed.known_hosts.read_text().splitlines()
                 if line.startswith(self.data.address + " ")]
        operator = {
            "merge_how": [{"name": "list", "settings": ["append"]},
                          {"name": "dict", "settings": ["no_replace", "recurse_list"]}],
            "write_files": [
                {"path": "/etc/fdl/join.env", "permissions": "0600",
                 "content": f"FDL_ENV={BOX_ENV}\nFDL_JOIN_BACKOFF_BASE_S=0.5\nFDL_JOIN_BACKOFF_MAX_S=2\n"
                            "GLOO_SOCKET_IFNAME=host0\n"},
                {"path": f"/etc/fdl/{self.label}/fdl.{BOX_ENV}.yml", "permissions": "0644",
                 "content": yaml.safe_dump({"join": {"devices": "cpu:1", "data_source": data_source,
                                                     "data_path": DATA_PATH}})},
                {"path": "/etc/ssh/ssh_known_hosts", "permissions": "0644", "append": True,
                 "content": "\n".join(known) + "\n"},
            ]}
        operator_text = ("#cloud-config\n# The operator's part: a CPU rank, the data, quick re-dials, gloo's "
                         "interface.\n" + yaml.safe_dump(operator, sort_keys=False))
        self.parts = {"generated": generated, "operator": operator_text}
        mime = email.mime.multipart.MIMEMultipart()
        for name, text in self.parts.items():
            part = email.mime.text.MIMEText(text, "cloud-config")
            part.add_header("Content-Disposition", "attachment", filename=f"{name}.yml")
            mime.attach(part)
        return mime.as_string()

    def boot(self, image: list[Path], user_data: str) -> nspawn.Machine:
        bed = self.bed
        address = f"{bed.net}.{200 + int(nspawn.digest(bed.prefix), 16) % 50}"
        machine = nspawn.Machine(image, self.work / "w1", name=self.name, bridge=bed.bridge).mount()
        self.machine = machine
        machine.address = address
        machine.network(address)
        machine.write("/var/lib/cloud/seed/nocloud/meta-data",
                      f"instance-id: {self.name}-{int(time.time())}\nlocal-hostname: {self.name}\n")
        machine.write("/var/lib/cloud/seed/nocloud/user-data", user_data, mode=0o600)
        # the golden image's fdl on PATH: the operator's python (bound in below) and its console script
        fdl = machine.path("/usr/local/bin/fdl")
        fdl.parent.mkdir(parents=True, exist_ok=True)
        fdl.symlink_to(self.op.python.parent / "fdl")
        # /dev/fuse as udev leaves it on a Debian machine (0666), for the agent's sshfs (this host has no udev)
        fuse = self.work / "fuse"
        os.mknod(fuse, stat.S_IFCHR | 0o666, os.makedev(10, 229))
        fuse.chmod(0o666)
        binds = [f"{fuse}:/dev/fuse", f"ro:{self.work / 'py'}:{self.work / 'py'}", f"ro:{REPO}:{REPO}"]
        site = Path(sys.prefix)
        if not site.is_relative_to(REPO):
            binds.append(f"ro:{site}:{site}")
        bed.verify()
        machine.boot(binds=tuple(binds), tmpfs=(f"/home:mode=0755,size={HOME_SIZE}",))
        return machine

    # runs ------------------------------------------------------------------------------------------------
    def status(self) -> dict | None:
        done = self.op.fdl(f"@{self.label}", "status", "--json", timeout=60)
        if done.returncode != 0:
            return None
        with contextlib.suppress(json.JSONDecodeError):
            return json.loads(done.stdout)
        return None

    def admitted(self) -> bool:
        state = self.status()
        return state is not None and {m["host"] for m in state.get("roster", [])} >= {self.name, self.roster.name}

    def train(self, what: str, *, restart_controller: bool = False) -> dict:
        """One farm run: the launcher, both hosts admitted, `fdl start`, the run done; returns its state. With
        restart_controller the first launcher is killed (SIGKILL) once the worker is admitted, and a second one
        opens the window the worker then joins."""
        if restart_controller:
            first = self.op.launch(f"@{self.label}", "train")
            try:
                wait_until(self.admitted, 300, f"{what}: the worker admitted by the first controller", self)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(first.pid, signal.SIGKILL)
                out, err = first.communicate(timeout=60)
                self.op.launched.append((out, err))
        before = self.worker_checksums()
        launcher = self.op.launch(f"@{self.label}", "train")
        try:
            wait_until(self.admitted, 300, f"{what}: both hosts admitted", self)
            fired = self.op.fdl(f"@{self.label}", "start", timeout=120)
            assert fired.returncode == 0, f"{what}: fdl start: {fired.stderr}{fired.stdout}"
            out, err = launcher.communicate(timeout=600)
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
                out, err = launcher.communicate(timeout=60)
            self.op.launched.append((out, err))
        assert launcher.returncode == 0, f"{what}: the launcher exited {launcher.returncode}"
        state = final_state(self.op.home)
        assert state["phase"] == "done", f"{what}: {state}"
        assert {m["host"]: m["exit_code"] for m in state["roster"]} == {self.roster.name: 0, self.name: 0}, state
        # both ranks trained the same weights: h2's line came back to the launcher, the worker's is in its journal
        mine = [m for m in CHECKSUM.finditer(out) if m["host"] == self.roster.name]
        theirs = self.worker_checksums()[len(before):]
        assert len(mine) == 1 and len(theirs) == 1, f"{what}: checksum lines {mine} {theirs}"
        assert mine[0]["rank"] == "0" and theirs[0][0] == "1" and mine[0]["sum"] == theirs[0][1], (mine, theirs)
        return state

    def worker_checksums(self) -> list[tuple[str, str]]:
        return [(m["rank"], m["sum"]) for m in CHECKSUM.finditer(self.fdl_lines()) if m["host"] == self.name]

    def fdl_lines(self) -> str:
        """What the agent (and its ranks, through it) wrote to the journal."""
        assert self.machine is not None
        return self.machine.sh(f"journalctl --no-pager -o cat _SYSTEMD_UNIT={UNIT}", timeout=60).stdout

    def show(self) -> dict[str, str]:
        assert self.machine is not None
        return self.machine.show(UNIT, "ActiveState", "SubState", "NRestarts", "MainPID", "Result")

    def still_up(self, what: str, main_pid: str) -> None:
        """The box up, the unit active with the same main process, never restarted."""
        machine = self.machine
        assert machine is not None and machine.running(), f"{what}: the worker box went down"
        state = machine.sh("systemctl is-system-running", timeout=60).stdout.strip()
        assert state in ("running", "degraded"), f"{what}: the box's systemd says {state}"
        status = self.show()
        assert status["ActiveState"] == "active" and status["SubState"] == "running", f"{what}: {status}"
        assert status["NRestarts"] == "0" and status["MainPID"] == main_pid, f"{what}: {status} (was {main_pid})"

    def wait_for_lines(self, text: str, count: int, timeout: float, what: str) -> None:
        wait_until(lambda: self.fdl_lines().count(text) >= count, timeout, what, self)

    # what a failure's message carries ---------------------------------------------------------------------
    def diagnostics(self) -> str:
        parts = []
        machine = self.machine
        if machine is not None and machine.running():
            with contextlib.suppress(Exception):
                parts.append(f"--- the unit's journal ({UNIT}), last lines:\n{machine.journal(UNIT)[-8000:]}")
            with contextlib.suppress(Exception):
                parts.append("--- cloud-init status:\n" + machine.sh("cloud-init status --long").stdout[-2000:])
            with contextlib.suppress(Exception):
                parts.append("--- rank logs:\n" + machine.sh(
                    "for f in $(ls -td /home/flodl/.flodl/join/logs/* 2>/dev/null | head -1)/*; do echo \"== $f\"; "
                    "tail -n 30 \"$f\"; done").stdout[-4000:])
        elif machine is not None:
            entries = machine.saved_journal(UNIT)
            parts.append("--- the unit's saved journal:\n" + "\n".join(str(e.get("MESSAGE")) for e in entries)[-8000:])
            parts.append(f"--- console:\n{machine.console_text()[-3000:]}")
        for out, err in self.op.launched[-2:]:
            parts.append(f"--- a launcher's output (the controller's log):\n{out[-3000:]}\n{err[-5000:]}")
        log = self.ctl.sshd_dir / "sshd.log"
        if log.exists():
            parts.append(f"--- the doors' sshd log (h1), last lines:\n{log.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def close(self) -> None:
        if self.machine is not None:
            self.machine.stop()
        if self.ctl.sshd is None:
            self.ctl.start_sshd()
        data = self.jail_base / self.labels["a"] / "jail" / "data"
        subprocess.run(["umount", str(data)], capture_output=True, timeout=30)
        assert not os.path.ismount(data), f"door a's bind on {data} is still mounted"
        self.drop_jailed_account()

    def drop_jailed_account(self) -> None:
        account = f"fdl-{self.labels['a']}"
        subprocess.run(["userdel", account], capture_output=True, timeout=30)
        subprocess.run(["groupdel", account], capture_output=True, timeout=30)


def wait_until(predicate, timeout: float, what: str, farm: Farm | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if farm is not None and farm.machine is not None and not farm.machine.running():
            raise AssertionError(f"the worker box stopped while waiting for {what} (nspawn rc "
                                 f"{farm.machine.wait_exit(5)})")
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def final_state(home: Path) -> dict:
    runs = sorted((home / ".flodl" / "launch" / "runs").glob("*/state.json"), key=lambda p: p.stat().st_mtime)
    assert runs, f"no kept state.json under {home}"
    return json.loads(runs[-1].read_text())


# ------------------------------------------------------------------------------------------------ the test

@pytest.fixture
def farm(testbed):
    require_machines()
    for path in (REPO, Path(sys.prefix)):
        # the booted worker sees them through binds; the unit's PrivateTmp would hide anything below these
        assert not any(path.is_relative_to(p) for p in ("/tmp", "/var/tmp")), f"{path} is below a temp directory"
    work = Path(tempfile.mkdtemp(prefix=f"{testbed.prefix}-farm-", dir="/var/lib"))
    os.chmod(work, 0o755)
    built: Farm | None = None
    try:
        built = Farm(testbed, work)
        yield built
    finally:
        if built is not None:
            built.close()
        subprocess.run(["rm", "-rf", str(work)], check=False)


def test_the_farm_end_to_end_under_systemd(farm):
    try:
        _the_farm(farm)
    except (AssertionError, subprocess.SubprocessError, nspawn.MachineError) as exc:
        raise AssertionError(f"{exc}\n\n{farm.diagnostics()}") from exc


def _the_farm(farm: Farm) -> None:
    base = nspawn.base_rootfs()
    image = [nspawn.cloud_init_layer(base), base]

    # the controller box: three farms, their doors opened by the printed privileged lines, each self-tested
    farm.phase("the controller box")
    farm.prepare_controller_box()
    farm.write_project()
    for door in farm.labels:
        report = farm.join_config(door)
        assert report["files"]["cloud_init"], report
    for door in farm.labels:
        farm.apply_privileged(door)
    farm.restart_ctl_sshd()  # door a's read-only bind, made after this sshd started (see the module's doc)
    published = farm.publish("--build", "true", "--bin", "train.py")  # into the directory door b serves
    assert published.returncode == 0, published.stderr + published.stdout
    for door in farm.labels:
        farm.selftest(door)

    # the worker boots from door b's user-data, with the real cloud-init
    farm.phase("the worker boots")
    data_source = farm.serve_data()
    machine = farm.boot(image, farm.user_data(data_source))
    machine.wait_booted(timeout=180)
    done = machine.sh("cloud-init status --wait --long", timeout=300)
    assert done.returncode == 0 and "status: done" in done.stdout, done.stdout + done.stderr
    for door in farm.labels:  # every door's generated user-data passes cloud-init's own schema check
        farm.parts[f"door {door}"] = (farm.farm_dir(door) / "cloud-init.yml").read_text()
    for name, text in farm.parts.items():
        machine.write("/root/check.yml", text, mode=0o600)
        checked = machine.sh("cloud-init schema --config-file /root/check.yml", timeout=120)
        assert checked.returncode == 0 and "Valid cloud-config" in checked.stdout, \
            f"cloud-init schema, {name}: {checked.stdout}{checked.stderr}"
    machine.sh("rm -f /root/check.yml")
    assert machine.sh(f"systemctl is-enabled {UNIT}").stdout.strip() == "enabled"
    # what cloud-init wrote is what join-config says a worker holds: its worker.yml as fdl.yml, and the door's
    # host key as the testbed's own sshd presents it (pinned when the wizard ran, no first-use trust)
    worker_dir = f"/etc/fdl/{farm.label}"
    assert machine.path(f"{worker_dir}/fdl.yml").read_text() == (farm.farm_dir() / "worker.yml").read_text()
    door_key = next(line.split()[1:3] for line in farm.bed.known_hosts.read_text().splitlines()
                    if line.startswith(farm.ctl.address + " "))
    pinned = machine.path(f"{worker_dir}/known_hosts").read_text()
    assert f"[{farm.ctl.address}]:{farm.door_port['b']} {' '.join(door_key)}" in pinned, pinned
    first = farm.show()
    assert first["ActiveState"] == "active" and first["MainPID"] != "0", first
    main_pid = first["MainPID"]

    # a 2-host run: the roster worker and the booted one, through door b with the farm key
    farm.phase("the first run")
    farm.train("the first run")
    fdl = farm.fdl_lines()
    assert f"data: tokens from {farm.data.name}" in fdl, fdl  # the rank read the sshfs mount
    assert "source: run " in fdl and "tunnel:" in fdl, fdl
    farm.still_up("after the first run", main_pid)

    # (1) the controller restarts while the worker waits for the world
    farm.phase("(1) the controller restarts")
    admitted = farm.fdl_lines().count("admitted by 127.0.0.1:")
    farm.train("after the controller restarted", restart_controller=True)
    assert farm.fdl_lines().count("admitted by 127.0.0.1:") == admitted + 2  # by the first, then the second
    farm.still_up("after the controller restarted", main_pid)

    # (2) the data host's sshd restarts: the sshfs session dies with it
    farm.phase("(2) the data host's sshd restarts")
    farm.data.stop_sshd()
    try:
        marker = farm.fdl_lines().count("the data host")
        farm.wait_for_lines("the data host", marker + 2, 180, "two dials while the data host is down")
        farm.still_up("while the data host is down", main_pid)
    finally:
        farm.data.start_sshd()
    farm.train("after the data host came back")
    assert farm.fdl_lines().count(f"data: tokens from {farm.data.name}") >= 3
    farm.still_up("after the data host came back", main_pid)

    # (3) another account of the worker box fills /home, where the agent's stage is
    farm.phase("(3) another account fills the disk")
    other = "debian"  # cloud-init's default user
    filled = machine.sh(f"setpriv --reuid={other} --regid={other} --init-groups sh -c "
                        f"'dd if=/dev/zero of=/home/{other}/filler bs=64k 2>/dev/null; exit 0'", timeout=120)
    assert filled.returncode == 0, filled.stderr
    full = machine.sh("dd if=/dev/zero of=/home/probe bs=4k count=1 conv=fsync 2>&1; rm -f /home/probe")
    assert "No space left on device" in full.stdout, full.stdout
    marker = farm.fdl_lines().count("ENOSPC")
    farm.wait_for_lines("ENOSPC", marker + 2, 180, "two dials on the full disk")
    farm.still_up("while the disk is full", main_pid)
    machine.sh(f"rm -f /home/{other}/filler", check=True)
    farm.train("after the disk was freed")
    farm.still_up("after the disk was freed", main_pid)

    # (4) a publish whose bin was renamed reaches the worker (--no-build: nothing gates it)
    farm.phase("(4) the published bin is renamed")
    src = farm.op.project / "src"
    (src / "train.py").rename(src / "train-renamed.py")
    broken = farm.publish("--no-build", "--build", "true", "--bin", "train.py")
    assert broken.returncode == 0, broken.stderr + broken.stdout
    marker = farm.fdl_lines().count("is not there")
    farm.wait_for_lines("is not there", marker + 2, 180, "two dials on the renamed bin")
    farm.still_up("while the published bin is renamed", main_pid)
    (src / "train-renamed.py").rename(src / "train.py")
    fixed = farm.publish("--build", "true", "--bin", "train.py")
    assert fixed.returncode == 0, fixed.stderr + fixed.stdout
    farm.train("after the publish was fixed")
    farm.still_up("after the publish was fixed", main_pid)
    fdl = farm.fdl_lines()
    assert "exited 2" not in fdl and farm.token() not in fdl

    # last: the worker's own configuration names a binary that is not there, and the box powers itself off
    farm.phase("a missing binary of the worker's own configuration")
    overlay = machine.path(f"/etc/fdl/{farm.label}/fdl.{BOX_ENV}.yml")
    doc = yaml.safe_load(overlay.read_text())
    doc["join"].update(source=None, bin=MISSING_BIN)  # null deletes the generated source: key
    overlay.write_text(yaml.safe_dump(doc))
    machine.sh(f"systemctl restart {UNIT}", timeout=120)
    code = machine.wait_exit(180)
    assert code == 0, f"nspawn did not see the worker power off (rc {code})"  # poweroff, not a reboot (133)
    unit = [e for e in machine.saved_journal() if UNIT in (e.get("UNIT"), e.get("_SYSTEMD_UNIT"))]
    exits = [(e.get("EXIT_CODE"), e.get("EXIT_STATUS")) for e in unit if e.get("MESSAGE_ID") == MSG_PROCESS_EXIT]
    assert exits[-1] == ("exited", "2"), exits
    restarts = [e for e in unit if e.get("MESSAGE_ID") == MSG_RESTART_SCHEDULED]
    assert not restarts, restarts  # RestartPreventExitStatus=2: no restart, the poweroff instead
    said = "\n".join(str(e.get("MESSAGE")) for e in unit if e.get("_SYSTEMD_UNIT") == UNIT)
    assert f"the training binary {MISSING_BIN} is not on this box" in said, said[-3000:]
    farm.phase("done")
