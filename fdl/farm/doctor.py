"""The host doctor: what this box still lacks for a farm door, each gap with its fix.

Two halves, so every finding can be tested for every platform without that
platform: `gather_facts()` observes this machine once (files, PATH, a TCP
connect, a few read-only commands) into a `HostFacts`; `diagnose()` is a pure
function from facts to findings. A fix is spelled for the platform the facts
describe: apt, dnf or brew; ssh.service or sshd.service (or macOS's Remote
Login); ufw or firewalld; semanage where SELinux applies.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from fdl.hostside.checks.report import ERROR, OK, WARNING, CheckResult
from fdl.hostside.farm.doors import DOOR_A, DOOR_B
from fdl.hostside.farm.sshd_config import SshdConfigScan, scan

DEFAULT_SSHD_CONFIG = "/etc/ssh/sshd_config"
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/libexec/sftp-server",
                "/usr/lib/ssh/sftp-server")
RRSYNC_DOC_COPY = "/usr/share/doc/rsync/scripts/rrsync.gz"  # Debian/Ubuntu before rrsync moved to /usr/bin


@dataclass
class HostFacts:
    """Everything the doctor looks at, observed once. Tests build these by hand, one per platform."""

    system: str = "Linux"  # platform.system(): Linux, Darwin
    distro: str | None = None  # os-release ID: debian, ubuntu, fedora, rhel...
    distro_like: tuple[str, ...] = ()
    package_manager: str | None = None  # apt, dnf, brew
    init: str | None = None  # systemd, launchd
    ssh_units: tuple[str, ...] = ()  # which of ssh.service / sshd.service / ssh.socket exist
    ssh_socket_active: bool | None = None  # Debian/Ubuntu socket activation holds the listener
    sshd_path: str | None = None
    sshd_config: SshdConfigScan | None = None  # scanned with the drop-in virtually in place
    dropin_target: str | None = None  # where the privileged step (the fdl_join_door role) installs the drop-in
    door_listening: bool = False
    door_banner: str | None = None  # first line a TCP connect to the door port read (SSH-2.0-...)
    rrsync_path: str | None = None
    rrsync_doc_copy: bool = False
    served: str | None = None
    served_is_dir: bool = False
    selinux: str | None = None  # enforcing, permissive, disabled
    selinux_ssh_ports: tuple[int, ...] | None = None  # ports labelled ssh_port_t (None: not known)
    semanage_path: str | None = None
    firewall: str | None = None  # ufw, firewalld
    firewall_active: bool | None = None
    firewall_port_open: bool | None = None
    remote_login: bool | None = None  # macOS Remote Login (sshd under launchd)
    in_container: bool = False  # /.dockerenv or /run/.containerenv: its ~/.ssh is rarely the workers' sshd's
    existing_files: frozenset[str] = field(default_factory=frozenset)  # paths the doctor asked about

    @property
    def macos(self) -> bool:
        return self.system == "Darwin"

    @property
    def debian_like(self) -> bool:
        return self.distro in ("debian", "ubuntu") or bool({"debian", "ubuntu"} & set(self.distro_like))


# --------------------------------------------------------------------------- platform spelling


@dataclass(frozen=True)
class Spelling:
    """How this platform says the fixes."""

    facts: HostFacts

    @property
    def service(self) -> str:
        if "ssh.service" in self.facts.ssh_units:
            return "ssh"
        if "sshd.service" in self.facts.ssh_units:
            return "sshd"
        return "ssh" if self.facts.debian_like else "sshd"

    def install(self, *, apt: str | None, dnf: str | None, brew: str | None) -> str | None:
        pm = self.facts.package_manager
        if pm == "apt" and apt:
            return f"sudo apt-get install -y {apt}"
        if pm == "dnf" and dnf:
            return f"sudo dnf install -y {dnf}"
        if pm == "brew" and brew:
            return f"brew install {brew}"
        return None

    def reload(self) -> str:
        if self.facts.macos:
            return "sudo launchctl kickstart -k system/com.openssh.sshd"
        if self.facts.init == "systemd":
            return f"sudo systemctl reload {self.service}"
        return f"sudo kill -HUP \"$(cat {self.pidfile})\""

    @property
    def pidfile(self) -> str:
        if self.facts.sshd_config is not None and self.facts.sshd_config.top("pidfile"):
            return self.facts.sshd_config.top("pidfile")[0].value
        return "/var/run/sshd.pid"

    def reload_command(self) -> str | None:
        """What the fdl_join_door role's handler runs to reload sshd here, as root (its reload_command: a
        command line, no shell); None where the service manager reloads it (its sshd_service)."""
        if self.facts.macos:
            return "launchctl kickstart -k system/com.openssh.sshd"
        if self.facts.init == "systemd":
            return None
        return "/bin/sh -c " + shlex.quote(f"kill -HUP \"$(cat {shlex.quote(self.pidfile)})\"")

    def enable(self) -> str:
        if self.facts.macos:
            return "sudo systemsetup -setremotelogin on"
        if self.facts.init == "systemd":
            return f"sudo systemctl enable --now {self.service}"
        return "start sshd with your init system"

    def sshd_test(self) -> str:
        config = self.facts.sshd_config.main if self.facts.sshd_config is not None else DEFAULT_SSHD_CONFIG
        extra = "" if config == DEFAULT_SSHD_CONFIG else f" -f {config}"
        return f"sudo {self.facts.sshd_path or 'sshd'} -t{extra}"

    def open_port(self, port: int) -> str | None:
        if self.facts.firewall == "ufw":
            return f"sudo ufw allow {port}/tcp"
        if self.facts.firewall == "firewalld":
            return f"sudo firewall-cmd --permanent --add-port={port}/tcp && sudo firewall-cmd --reload"
        return None


# --------------------------------------------------------------------------- diagnosis (pure)


def _daemon(facts: HostFacts, say: Spelling) -> CheckResult:
    """Is there an ssh daemon at all?"""
    if facts.sshd_path is None:
        if facts.macos:
            return CheckResult("sshd", ERROR, "no ssh daemon is available: on macOS sshd is Remote Login, and it is "
                               "off or missing", hint=say.enable())
        fix = say.install(apt="openssh-server", dnf="openssh-server", brew=None) or \
            "install the OpenSSH server with your package manager"
        return CheckResult("sshd", ERROR, "no ssh daemon (sshd) is installed", hint=f"{fix} && {say.enable()}")
    if facts.macos and facts.remote_login is False:
        return CheckResult("sshd", ERROR, "Remote Login (macOS's sshd) is off", hint=say.enable())
    return CheckResult("sshd", OK, f"ssh daemon present ({facts.sshd_path})", data={"path": facts.sshd_path})


def _config(facts: HostFacts, say: Spelling) -> CheckResult | None:
    """Does sshd read sshd_config.d at all, and does anything read earlier beat the door's settings?"""
    scan_ = facts.sshd_config
    if facts.sshd_path is None or scan_ is None or not facts.dropin_target:
        return None
    if scan_.main in scan_.unreadable:
        return CheckResult("sshd-config", WARNING, f"could not read {scan_.main}; the drop-in and the ports it keeps "
                           "could not be checked against it", hint="run the wizard as a user who can read it, or "
                           "check by hand with " + say.sshd_test())
    if not scan_.virtual_read:
        target_dir = os.path.dirname(facts.dropin_target)
        return CheckResult(
            "sshd-config", ERROR, f"{scan_.main} never reads {target_dir}/*.conf, so the drop-in would have no effect",
            hint=f"add the line 'Include {target_dir}/*.conf' at the top of {scan_.main} (before any Match block), "
                 f"then {say.sshd_test()}")
    shadow = scan_.shadowing(os.path.abspath(facts.dropin_target))
    if not shadow:
        return CheckResult("sshd-config", OK, f"sshd reads {facts.dropin_target} and nothing read before it "
                           "overrides the door's settings")
    named = "; ".join(f"{d.keyword} {d.value} ({d.file}:{d.line})" for d in shadow[:5])
    return CheckResult(
        "sshd-config", WARNING,
        f"settings read before the drop-in win over its Match block (sshd keeps the first value): {named}",
        hint="move those lines after the Include line, or into a Match block of their own",
        data={"shadowing": [f"{d.file}:{d.line}" for d in shadow]})


def _listener(facts: HostFacts, say: Spelling, door_port: int) -> list[CheckResult]:
    """The listener on the door port, and systemd's socket that would keep it from opening."""
    out = []
    if facts.ssh_socket_active:
        out.append(CheckResult(
            "ssh.socket", ERROR,
            "ssh.socket (systemd socket activation) holds sshd's listener: while it does, sshd's Port "
            f"directive is ignored outright and port {door_port} will never open",
            hint="sudo systemctl disable --now ssh.socket && sudo systemctl enable --now ssh.service "
                 "(or, where your release generates the socket from sshd_config, sudo systemctl daemon-reload "
                 "&& sudo systemctl restart ssh.socket after installing the drop-in)"))
    if not facts.door_listening:
        hint = f"install the drop-in (it carries 'Port {door_port}'), then {say.reload()}"
        if facts.macos:
            hint += " (Remote Login must be on)"
        out.append(CheckResult("listener", WARNING, f"nothing listens on port {door_port} yet", hint=hint))
    elif facts.door_banner and facts.door_banner.startswith("SSH-"):
        out.append(CheckResult("listener", OK, f"an ssh daemon answers on port {door_port} ({facts.door_banner})"))
    else:
        out.append(CheckResult("listener", ERROR, f"port {door_port} is taken by something that is not an ssh "
                               "daemon", hint=f"pick another door port (--controller USER@HOST:PORT) or stop "
                               f"what listens there (sudo ss -ltnp 'sport = :{door_port}')"))
    return out


def _selinux_port(facts: HostFacts, say: Spelling, door_port: int) -> CheckResult | None:
    """SELinux refuses sshd a port not labelled ssh_port_t, and sshd's error does not say so."""
    if facts.selinux != "enforcing" or door_port == 22:
        return None
    if facts.selinux_ssh_ports is not None and door_port in facts.selinux_ssh_ports:
        return CheckResult("selinux", OK, f"SELinux allows sshd on port {door_port}")
    fix = f"sudo semanage port -a -t ssh_port_t -p tcp {door_port}"
    if facts.semanage_path is None:
        pkg = say.install(apt="policycoreutils-python-utils", dnf="policycoreutils-python-utils", brew=None)
        fix = (pkg + " && " if pkg else "install semanage (policycoreutils-python-utils), then ") + fix
    known = "" if facts.selinux_ssh_ports is None else " (it is not labelled ssh_port_t)"
    return CheckResult(
        "selinux", ERROR if facts.selinux_ssh_ports is not None else WARNING,
        f"SELinux is enforcing and refuses sshd a non-standard port{known}; sshd's own error will not mention "
        f"SELinux", hint=fix)


def _firewall_port(facts: HostFacts, say: Spelling, door_port: int) -> CheckResult | None:
    if not (facts.firewall and facts.firewall_active):
        return None
    if facts.firewall_port_open:
        return CheckResult("firewall", OK, f"{facts.firewall} lets port {door_port} in")
    return CheckResult("firewall", WARNING, f"{facts.firewall} is active and port {door_port} is not known to be open",
                       hint=say.open_port(door_port))


def _rrsync(facts: HostFacts, say: Spelling) -> CheckResult:
    """Door b's key runs rrsync."""
    if facts.rrsync_path:
        return CheckResult("rrsync", OK, f"rrsync present ({facts.rrsync_path})")
    if facts.rrsync_doc_copy:
        return CheckResult("rrsync", ERROR, "rrsync is only shipped as documentation on this release",
                           hint=f"sudo sh -c 'gunzip -c {RRSYNC_DOC_COPY} > /usr/local/bin/rrsync && "
                                f"chmod 755 /usr/local/bin/rrsync'")
    fix = say.install(apt="rsync", dnf="rsync rsync-rrsync", brew="rsync") or \
        "install rsync 3.2.4 or newer, which ships rrsync"
    return CheckResult("rrsync", ERROR, "rrsync is missing, and door b's key runs it", hint=fix)


def _sftp(facts: HostFacts, say: Spelling) -> CheckResult | None:
    """Door a's sshfs needs an sftp subsystem sshd can start."""
    scan_ = facts.sshd_config
    if scan_ is None or scan_.main in scan_.unreadable:
        return None
    server = scan_.subsystem("sftp")
    program = server.split()[0] if server else None
    if program is None:
        return CheckResult("sftp", ERROR, "sshd has no 'Subsystem sftp' line, so sshfs cannot start an sftp session "
                           "(door a's key then runs sshd's built-in server)",
                           hint=f"add 'Subsystem sftp internal-sftp' to {scan_.main}, then {say.reload()}")
    if program == "internal-sftp" or program in facts.existing_files:
        return CheckResult("sftp", OK, f"sftp subsystem configured ({server})")
    fix = say.install(apt="openssh-sftp-server", dnf="openssh-server", brew=None) or \
        f"install the program {program} names, or set 'Subsystem sftp internal-sftp'"
    return CheckResult("sftp", ERROR, f"the sftp subsystem names {program}, which is not installed: sshd refuses "
                       "the session before door a's key can run", hint=fix)


def _served(facts: HostFacts, door: str) -> CheckResult | None:
    if door not in (DOOR_A, DOOR_B) or not facts.served:
        return None
    if facts.served_is_dir:
        return CheckResult("served", OK, f"served directory {facts.served} exists")
    what = "the dataset to mount" if door == DOOR_A else "the run tree `fdl publish --to` writes"
    fix = (f"fdl publish SOURCE --bin BIN --to {facts.served}" if door == DOOR_B
           else f"mkdir -p {facts.served} and put the data there")
    return CheckResult("served", WARNING, f"served directory {facts.served} does not exist yet ({what})", hint=fix)


def diagnose(facts: HostFacts, *, door: str, door_port: int) -> list[CheckResult]:
    """The findings for one door on the host the facts describe: the daemon and its configuration, the
    listener, the two that fail without saying why (SELinux, the firewall), what the door runs, what it
    serves."""
    say = Spelling(facts)
    found: list[CheckResult | None] = [_daemon(facts, say), _config(facts, say)]
    found += _listener(facts, say, door_port)
    found += [_selinux_port(facts, say, door_port), _firewall_port(facts, say, door_port)]
    if door == DOOR_B:
        found.append(_rrsync(facts, say))
    if door == DOOR_A:
        found.append(_sftp(facts, say))
    found.append(_served(facts, door))
    return [f for f in found if f is not None]


# --------------------------------------------------------------------------- observation


def _run(argv: list[str], timeout: float = 5) -> subprocess.CompletedProcess[str] | None:
    # The C locale: the status lines read below (ufw's "Status: active", its ALLOW rules) are translated
    # in other locales, and a German box must read the same as an English one.
    env = dict(os.environ, LC_ALL="C", LANG="C", LANGUAGE="")
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError):
        return None


def _os_release() -> tuple[str | None, tuple[str, ...]]:
    try:
        text = Path("/etc/os-release").read_text(encoding="utf-8")
    except OSError:
        return None, ()
    values = {}
    for line in text.splitlines():
        if "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip().strip('"')
    return values.get("ID"), tuple(values.get("ID_LIKE", "").split())


def probe_banner(host: str, port: int, timeout: float = 2.0) -> tuple[bool, str | None]:
    """(something accepts TCP on host:port, the first line it sends)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            try:
                data = sock.recv(256)
            except OSError:
                return True, None
    except OSError:
        return False, None
    line = data.split(b"\n", 1)[0].strip().decode("ascii", "replace")
    return True, line or None


def _selinux() -> tuple[str | None, tuple[int, ...] | None, str | None]:
    semanage = shutil.which("semanage")
    try:
        enforce = Path("/sys/fs/selinux/enforce").read_text().strip()
    except OSError:
        return None, None, semanage
    mode = "enforcing" if enforce == "1" else "permissive"
    ports: tuple[int, ...] | None = None
    if semanage:
        done = _run([semanage, "port", "-l"], timeout=20)
        if done is not None and done.returncode == 0:
            found: list[int] = []
            for line in done.stdout.splitlines():
                if line.startswith("ssh_port_t"):
                    for field_ in line.split()[2:]:
                        item = field_.strip(",")
                        if "-" in item:
                            lo, _, hi = item.partition("-")
                            if lo.isdigit() and hi.isdigit():
                                found.extend(range(int(lo), int(hi) + 1))
                        elif item.isdigit():
                            found.append(int(item))
            ports = tuple(found)
    return mode, ports, semanage


def _firewall(port: int) -> tuple[str | None, bool | None, bool | None]:
    if shutil.which("firewall-cmd"):
        state = _run(["firewall-cmd", "--state"])
        active = None if state is None else state.returncode == 0
        query = _run(["firewall-cmd", f"--query-port={port}/tcp"]) if active else None
        return "firewalld", active, None if query is None else query.returncode == 0
    if shutil.which("ufw") or os.path.exists("/etc/ufw/ufw.conf"):
        active = None
        try:
            conf = Path("/etc/ufw/ufw.conf").read_text(encoding="utf-8")
            active = "ENABLED=yes" in conf.replace(" ", "")
        except OSError:
            pass  # unreadable: whether ufw is on stays unknown (None), and the finding says "not known to be open"
        status = _run(["ufw", "status"]) if os.geteuid() == 0 and shutil.which("ufw") else None
        open_ = None
        if status is not None and status.returncode == 0:
            active = "Status: active" in status.stdout
            open_ = any(line.split()[0] in (str(port), f"{port}/tcp") for line in status.stdout.splitlines()
                        if line.strip() and "ALLOW" in line)
        return "ufw", active, open_
    return None, None, None


def gather_facts(*, door_port: int, served: str | None, sshd_config: str = DEFAULT_SSHD_CONFIG,
                 dropin_target: str | None = None, dropin_lines: list[str] | None = None,
                 probe_host: str = "127.0.0.1") -> HostFacts:
    """Observe this machine (read-only: files, PATH, one TCP connect, a few status commands)."""
    system = platform.system()
    distro, like = _os_release()
    pm = next((name for name, exe in (("apt", "apt-get"), ("dnf", "dnf"), ("brew", "brew")) if shutil.which(exe)),
              None)
    if pm is None and shutil.which("yum"):
        pm = "dnf"
    init = "systemd" if os.path.isdir("/run/systemd/system") else ("launchd" if system == "Darwin" else None)
    units = tuple(unit for unit in ("ssh.service", "sshd.service", "ssh.socket")
                  if any(os.path.exists(os.path.join(d, unit))
                         for d in ("/lib/systemd/system", "/usr/lib/systemd/system", "/etc/systemd/system")))
    socket_active = None
    if init == "systemd" and "ssh.socket" in units:
        done = _run(["systemctl", "is-active", "ssh.socket"])
        socket_active = None if done is None else done.stdout.strip() == "active"
    sshd = shutil.which("sshd") or next((p for p in ("/usr/sbin/sshd", "/usr/local/sbin/sshd") if os.path.exists(p)),
                                        None)
    config_scan = None
    if sshd is not None or os.path.exists(sshd_config):
        virtual = (dropin_target, dropin_lines or []) if dropin_target else None
        config_scan = scan(sshd_config, virtual=virtual)
    listening, banner = probe_banner(probe_host, door_port)
    remote_login = None
    if system == "Darwin":
        remote_login = listening or probe_banner("127.0.0.1", 22)[0]
    selinux, selinux_ports, semanage = _selinux() if system == "Linux" else (None, None, None)
    firewall, fw_active, fw_open = _firewall(door_port) if system == "Linux" else (None, None, None)
    existing = set()
    sftp_program = config_scan.subsystem("sftp") if config_scan else None
    for candidate in ((sftp_program.split()[0],) if sftp_program else ()) + SFTP_SERVERS:
        if os.path.exists(candidate):
            existing.add(candidate)
    return HostFacts(
        system=system, distro=distro, distro_like=like, package_manager=pm, init=init, ssh_units=units,
        ssh_socket_active=socket_active, sshd_path=sshd, sshd_config=config_scan, dropin_target=dropin_target,
        door_listening=listening, door_banner=banner, rrsync_path=shutil.which("rrsync"),
        rrsync_doc_copy=os.path.exists(RRSYNC_DOC_COPY), served=served,
        served_is_dir=os.path.isdir(served) if served else False, selinux=selinux, selinux_ssh_ports=selinux_ports,
        semanage_path=semanage, firewall=firewall, firewall_active=fw_active, firewall_port_open=fw_open,
        remote_login=remote_login, existing_files=frozenset(existing),
        in_container=os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"),
    )


__all__ = ["HostFacts", "Spelling", "diagnose", "gather_facts", "probe_banner"]
