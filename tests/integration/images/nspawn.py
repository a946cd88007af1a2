"""A Debian 12 machine under a real systemd, for the image tests: a cached root file system, and boots of it
with `systemd-nspawn -b` on the testbed's bridge.

The root file system comes from `debootstrap` against the Debian mirror this machine's apt already uses
(read from apt's own configuration, never hard-coded). It is built once and kept outside the repository
under `/var/cache/fdl-tests/rootfs-<hash of its inputs>` (a lock guards concurrent builds, a build lands
by one rename). Every boot runs on an overlay of the cached layers, so nothing a boot does reaches the
cache, and the test writes the files a boot needs (network, credentials handed over at boot) into the
overlay's upper layer first, the way cloud-init would.

The host has no systemd of its own, hence `--register=no --keep-unit`. Commands run in a booted machine
through `nsenter` into its PID 1's namespaces, so systemctl and journalctl answer from the machine's own
systemd. Needs root, debootstrap and systemd-container (scripts/apt-test.txt). Standard library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.conftest import descendants
from tests.testbed.bed import flock_waiting

CACHE = Path(os.environ.get("FDL_TEST_CACHE", "/var/cache/fdl-tests"))
SUITE = "bookworm"  # Debian 12: the container's Python is 3.11
# What a worker image needs beyond minbase: systemd as PID 1, Python 3.11 with venv (the role's virtualenv)
# and packaging (Ansible's pip module), an sshd for the bake, sshfs + fuse3 for the agent's data mounts,
# iproute2 to address the network while baking.
PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "python3-packaging",
            "openssh-server", "sshfs", "fuse3", "iproute2")
RECIPE = "3"  # bump when the preparation below changes: it is part of the cache key
TOOLS = {"debootstrap": "debootstrap", "systemd-nspawn": "systemd-container", "nsenter": "util-linux",
         "journalctl": "systemd", "systemctl": "systemd"}
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class MachineError(RuntimeError):
    """The root file system could not be built, or a machine could not be booted or reached."""

    __test__ = False


def missing_tools() -> list[str]:
    """The Debian packages this machine lacks for building and booting the root file system."""
    return sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})


def _run(argv: list[str], *, timeout: float = 60, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and done.returncode != 0:
        raise MachineError(f"{' '.join(argv)} failed (rc {done.returncode}): {done.stderr.strip()[-3000:]}")
    return done


# ---------------------------------------------------------------------------------------------- the mirror

def apt_mirror(root: Path = Path("/")) -> str:
    """The Debian archive URI apt uses here for the suite (deb822 `.sources` files or one-line `.list`s)."""
    apt = root / "etc" / "apt"
    files = [apt / "sources.list"] + sorted((apt / "sources.list.d").glob("*.list")) \
        + sorted((apt / "sources.list.d").glob("*.sources"))
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = _deb822(stanza)
                if fields.get("enabled", "yes").lower() == "no" or "deb" not in fields.get("types", "").split():
                    continue
                if SUITE in fields.get("suites", "").split() and fields.get("uris"):
                    return fields["uris"].split()[0]
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb" and words[2] == SUITE:
                    return words[1]
    raise MachineError(f"apt has no 'deb' source for Debian {SUITE} in {apt} (sources.list, sources.list.d/): "
                       f"debootstrap needs the mirror apt already uses")


def _deb822(stanza: str) -> dict:
    fields: dict[str, str] = {}
    key = None
    for line in stanza.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line[0].isspace() and key:
            fields[key] += " " + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            key = key.strip().lower()
            fields[key] = value.strip()
    return fields


# ---------------------------------------------------------------------------------------------- the cache

def digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


@contextlib.contextmanager
def cache_lock(name: str, timeout: float = 1800):
    """An exclusive lock on CACHE/<name>.lock (a second builder waits for the first one's result)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    fd = flock_waiting(CACHE / f"{name}.lock", timeout, poll=0.5)
    if fd is None:
        raise MachineError(f"{CACHE / name}.lock was held for {timeout:.0f} s")
    try:
        yield
    finally:
        os.close(fd)


KEEP_UNUSED_S = 2 * 24 * 3600  # a cache entry nobody used for this long is removed (its inputs moved on)


def cached(name: str, build) -> Path:
    """CACHE/<name>, made by build(tmp_dir) into a temporary sibling and renamed into place, once.

    Every use touches its `.complete`; entries of the same kind (the name up to its last '-') that nobody
    used for KEEP_UNUSED_S are removed, so a cache keyed by a changing checkout does not grow without end.
    """
    final = CACHE / name
    _prune(name.rsplit("-", 1)[0], keep=name)
    if (final / ".complete").exists():
        os.utime(final / ".complete")
        return final
    with cache_lock(name):
        if (final / ".complete").exists():
            return final
        shutil.rmtree(final, ignore_errors=True)
        tmp = CACHE / f".{name}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            build(tmp)
            (tmp / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _prune(kind: str, keep: str) -> None:
    for entry in CACHE.glob(f"{kind}-*"):
        marker = entry / ".complete"
        if entry.name == keep or not entry.is_dir() or not marker.exists():
            continue
        if time.time() - marker.stat().st_mtime > KEEP_UNUSED_S:
            with contextlib.suppress(MachineError, OSError), cache_lock(entry.name, timeout=0):
                marker.unlink()  # no longer a cache hit for anyone, then gone
                shutil.rmtree(entry, ignore_errors=True)


def debootstrap_version() -> str:
    return _run(["dpkg-query", "-W", "-f=${Version}", "debootstrap"], check=False).stdout.strip()


def base_rootfs() -> Path:
    """The cached minimal Debian 12 root file system (systemd as init), built on first use."""
    mirror = apt_mirror()
    arch = _run(["dpkg", "--print-architecture"]).stdout.strip()
    key = digest(SUITE, PACKAGES, mirror, arch, debootstrap_version(), RECIPE)

    def build(tmp: Path) -> None:
        root = tmp / "root"
        done = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
                               str(root), mirror], capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            log = root / "debootstrap" / "debootstrap.log"
            raise MachineError(f"debootstrap {SUITE} from {mirror} failed (rc {done.returncode}): "
                               f"{done.stderr.strip()[-2000:]}\n{log.read_text()[-3000:] if log.exists() else ''}")
        # The network comes from systemd-networkd (a .network file written per boot), which also makes
        # network-online.target mean something; a persistent journal lets the test read a powered-off machine.
        _run(["systemctl", f"--root={root}", "enable", "systemd-networkd.service"])
        _run(["systemctl", f"--root={root}", "mask", "console-getty.service", "getty@tty1.service"])
        (root / "var" / "log" / "journal").mkdir(exist_ok=True)
        (root / "etc" / "hostname").unlink(missing_ok=True)  # the machine's name is the hostname
        for deb in (root / "var" / "cache" / "apt" / "archives").glob("*.deb"):
            deb.unlink()

    return cached(f"rootfs-{key}", build) / "root"


# Debian 12's cloud-init and what the farm's generated user-data has a worker install (rsync for door b's
# pulls; openssh-client and sshfs are in the base already): a worker image that boots from user-data.
CLOUD_PACKAGES = ("cloud-init", "rsync")
CLOUD_RECIPE = "1"  # bump when the preparation below changes: it is part of the cache key
# The image's own cloud-init settings, as a cloud image carries them in /etc/cloud/cloud.cfg.d/.
CLOUD_IMAGE_CFG = """\
# The fdl test image under systemd-nspawn (tests/integration/images/nspawn.py, cloud_init_layer):
# user-data comes from a NoCloud seed (/var/lib/cloud/seed/nocloud/) written before each boot;
datasource_list: [NoCloud]
# the network is systemd-networkd's (a .network file written per boot), not cloud-init's;
network: {config: disabled}
# the image has no locales package, so there is no locale for cloud-init's locale module to set.
locale: false
"""


def cloud_init_layer(base: Path) -> Path:
    """A cached layer over the base root file system (the upper directory of an overlay on it): Debian 12's
    cloud-init and rsync installed with the base's own apt from the mirror its sources name, the image's
    cloud-init settings (CLOUD_IMAGE_CFG), and no apt source left, since a booted machine on the testbed's
    bridge reaches no mirror: the packages a user-data's `packages:` names are baked in, and cloud-init's
    `apt-get update` then has nothing to fetch. Keyed by the base, the packages and the recipe."""
    key = digest(base.parent.name, CLOUD_PACKAGES, CLOUD_RECIPE, CLOUD_IMAGE_CFG)

    def build(tmp: Path) -> None:
        upper, work, root = tmp / "upper", tmp / "ovlwork", tmp / "root"
        for sub in (upper, work, root):
            sub.mkdir()
        _run(["mount", "-t", "overlay", "fdl-cloud-init-layer", "-o",
              f"lowerdir={base},upperdir={upper},workdir={work}", str(root)])
        try:
            # nspawn without a network option shares this machine's network: the mirror is reachable
            install = ("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                       f"--no-install-recommends {' '.join(CLOUD_PACKAGES)} && apt-get clean")
            _run(["systemd-nspawn", "--register=no", "--keep-unit", "--quiet", "-D", str(root), "--as-pid2",
                  "/bin/sh", "-c", install], timeout=1800)
            (root / "etc" / "cloud" / "cloud.cfg.d" / "90-fdl-test-image.cfg").write_text(CLOUD_IMAGE_CFG)
            (root / "etc" / "apt" / "sources.list").write_text("# no mirror reachable from the testbed\n")
            for stale in ("cloud", "cloud-init.log", "cloud-init-output.log"):  # nothing of a boot yet
                path = root / ("var/lib" if stale == "cloud" else "var/log") / stale
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
        finally:
            _run(["umount", str(root)], check=False)
        subprocess.run(["rm", "-rf", str(work), str(root)], check=True)

    return cached(f"cloudinit-{key}", build) / "upper"


# ---------------------------------------------------------------------------------------------- a machine

class Machine:
    """One boot (or one bake) of an overlay over cached layers, on a bridge, with a systemd-nspawn process."""

    def __init__(self, layers: list[Path], work: Path, *, name: str, bridge: str):
        self.layers = layers  # uppermost first
        self.work = work
        self.name = name
        self.bridge = bridge
        self.root = work / "root"
        self.upper = work / "upper"
        self.console = work / "console.log"
        self.address: str | None = None  # its address on the bridge, once the caller has given it one
        self.proc: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.mounted = False

    # the overlay ------------------------------------------------------------------------------------
    def mount(self) -> Machine:
        for sub in ("root", "upper", "ovlwork"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        lower = ":".join(str(p) for p in self.layers)
        _run(["mount", "-t", "overlay", f"fdl-{self.name}", "-o",
              f"lowerdir={lower},upperdir={self.upper},workdir={self.work / 'ovlwork'}", str(self.root)])
        self.mounted = True
        return self

    def path(self, inside: str) -> Path:
        """A path of the machine's file system, as seen from the host."""
        return self.root / inside.lstrip("/")

    def write(self, inside: str, text: str, *, mode: int = 0o644, owner: str | None = None) -> Path:
        path = self.path(inside)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        if owner is not None:
            uid, gid = self.ids(owner)
            os.chown(path, uid, gid)
        return path

    def ids(self, user: str) -> tuple[int, int]:
        """uid and gid of an account in the machine's /etc/passwd."""
        for line in self.path("/etc/passwd").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == user:
                return int(fields[2]), int(fields[3])
        raise MachineError(f"no account {user!r} in the machine's /etc/passwd")

    def network(self, address: str, prefix_len: int = 24) -> None:
        """systemd-networkd's configuration of the container's end of the bridge veth."""
        self.write("/etc/systemd/network/10-fdl-test.network",
                   f"[Match]\nName=host0\n\n[Network]\nAddress={address}/{prefix_len}\nLinkLocalAddressing=no\n"
                   f"IPv6AcceptRA=no\n")

    # the nspawn process -------------------------------------------------------------------------------
    def boot(self, *, binds: tuple[str, ...] = (), command: tuple[str, ...] | None = None,
             tmpfs: tuple[str, ...] = ()) -> Machine:
        """Start systemd-nspawn: `-b` (systemd as PID 1) unless a command is given (then a stub init runs it).
        `binds`: SRC:DST (read-only with a leading `ro:`); `tmpfs`: PATH[:OPTIONS], a file system of its own."""
        argv = ["systemd-nspawn", "--register=no", "--keep-unit", "--quiet", "-D", str(self.root),
                f"--machine={self.name}", f"--network-bridge={self.bridge}", "--console=read-only"]
        argv += [f"--bind={b}" if not b.startswith("ro:") else f"--bind-ro={b[3:]}" for b in binds]
        argv += [f"--tmpfs={t}" for t in tmpfs]
        argv += ["-b"] if command is None else ["--as-pid2", *command]
        log = self.console.open("ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float) -> int | None:
        """nspawn's own exit status once the machine is gone (0: powered off), or None after timeout."""
        if self.proc is None:
            return self.exit_code
        try:
            self.exit_code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.exit_code

    def leader(self, timeout: float = 30) -> int:
        """The host PID of the machine's PID 1 (a descendant of nspawn whose own PID namespace calls it 1)."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running():
                raise MachineError(f"systemd-nspawn exited (rc {self.proc.returncode if self.proc else None}):\n"
                                   f"{self.console_text()[-3000:]}")
            for pid in descendants(self.proc.pid):
                with contextlib.suppress(OSError):
                    status = Path(f"/proc/{pid}/status").read_text()
                    nspid = re.search(r"^NSpid:\s+(.*)$", status, re.M)
                    if nspid and nspid.group(1).split()[-1] == "1" and len(nspid.group(1).split()) > 1:
                        return pid
            if time.monotonic() > deadline:
                raise MachineError(f"no PID 1 appeared under systemd-nspawn {self.proc.pid}")
            time.sleep(0.1)

    def sh(self, command: str, *, timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess:
        """Run a shell command inside the machine (all of PID 1's namespaces), as root."""
        argv = ["nsenter", "-t", str(self.leader()), "-m", "-u", "-i", "-n", "-p", "-C", "--",
                "/usr/bin/env", "-i", f"PATH={PATH}", "LANG=C.UTF-8", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0",
                "/bin/sh", "-c", command]
        return _run(argv, timeout=timeout, check=check)

    # systemd's view ----------------------------------------------------------------------------------
    def wait_booted(self, timeout: float = 90) -> str:
        """Wait until the machine's systemd finished starting up; returns `systemctl is-system-running`."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.sh("systemctl is-system-running", timeout=20).stdout.strip() if self.running() else ""
            if state in ("running", "degraded"):
                return state
            if not self.running() or time.monotonic() > deadline:
                raise MachineError(f"{self.name} did not finish booting (state {state!r}):\n"
                                   f"{self.console_text()[-3000:]}")
            time.sleep(0.3)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """`systemctl show -p ...` of a unit, as a dict."""
        done = self.sh(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props), check=True)
        return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)

    def journal(self, unit: str | None = None) -> str:
        """The machine's journal (of one unit) as text, read by its own journalctl while it runs."""
        try:
            done = self.sh("journalctl --no-pager -o short-monotonic" + (f" -u {unit}" if unit else ""), timeout=60)
        except MachineError:  # it is gone
            return ""
        return done.stdout

    def entries(self, unit: str | None = None) -> list[dict]:
        """The machine's journal (of one unit) as structured entries, read by its own journalctl."""
        done = self.sh("journalctl --no-pager -o json" + (f" -u {unit}" if unit else ""), timeout=60, check=True)
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    def saved_journal(self, unit: str | None = None) -> list[dict]:
        """The persistent journal a stopped machine left in its overlay, read by the host's journalctl."""
        directory = self.upper / "var" / "log" / "journal"
        argv = ["journalctl", "--no-pager", "-o", "json", "-D", str(directory)] + (["-u", unit] if unit else [])
        done = _run(argv, check=False)
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    def console_text(self) -> str:
        return self.console.read_text(errors="replace") if self.console.exists() else ""

    # teardown ----------------------------------------------------------------------------------------
    def stop(self, timeout: float = 30) -> None:
        """Power the machine off if it still runs (SIGTERM to nspawn asks PID 1 to), then unmount."""
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            if self.wait_exit(timeout) is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.mounted:
            done = _run(["umount", str(self.root)], check=False)
            if done.returncode != 0:
                _run(["umount", "-l", str(self.root)], check=False)
            self.mounted = False

    def __enter__(self) -> Machine:
        return self.mount()

    def __exit__(self, *exc: object) -> None:
        self.stop()
