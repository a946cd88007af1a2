"""Plan: everything `prepare()` settles before a question about the key file is asked or a file is written.

The farm's place and shape, its credentials (found and vetted, or to be minted), the sshd drop-in planned
(its values, from the library the fdl_join_door role's module shares; the role renders it, in apply()), the
door's host keys workers will pin, the host observed by the doctor, and the authorized_keys file read once.
The record is frozen: the decisions taken on it (decide.py) are a record of their own. sshd -t runs in one
place only, the role's validate: where the drop-in is installed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fdl.config.discover import find_base, overlay_file
from fdl.errors import FdlError
from fdl.farm import credentials as creds_mod
from fdl.farm.doctor import HostFacts, diagnose, gather_facts
from fdl.farm.wizard.shape import (
    Origins,
    Prompter,
    Request,
    Shape,
    recover_shape,
    refusal,
    settle_label,
    settle_shape,
)
from fdl.hostside.checks.report import ERROR, WARNING, CheckResult
from fdl.hostside.farm.authorized_keys import KeyIdentity, find_key, under_forbidden_root
from fdl.hostside.farm.doors import (
    DOOR_A,
    DoorError,
    check_label,
    dropin_name,
    dropin_scan_lines,
    dropin_vars,
    key_line,
    known_hosts_lines,
)
from fdl.hostside.farm.sshd_config import scan

FARM_ROOT = ".fdl"
WORKER_YML, DROPIN = "worker.yml", "sshd-door.conf"
_DEFAULT_KEY_FILES = (".ssh/authorized_keys", "%h/.ssh/authorized_keys", "~/.ssh/authorized_keys")


class Observe(Protocol):
    """How the host is observed (doctor.gather_facts; tests hand in facts built for one platform)."""

    def __call__(self, *, door_port: int, served: str | None, sshd_config: str, dropin_target: str | None,
                 dropin_lines: list[str] | None, probe_host: str) -> HostFacts: ...


@dataclass(frozen=True)
class KeyFile:
    """The authorized_keys file the door's line goes to, read once (data None: absent or unreadable)."""

    path: str
    explicit: bool  # named with --authorized-keys: its directory is the operator's
    data: bytes | None

    @classmethod
    def read(cls, path: str, explicit: bool) -> tuple[KeyFile, str | None]:
        """The file and, when it exists but could not be read, a note saying so."""
        try:
            return cls(path, explicit, Path(path).read_bytes()), None
        except FileNotFoundError:
            return cls(path, explicit, None), None
        except OSError as exc:
            return cls(path, explicit, None), (f"could not read {path} ({exc.strerror}): a farm key line in it "
                                               f"cannot be seen, so it is treated as absent.")

    def find(self, key: KeyIdentity) -> int | None:
        """1-based number of the first line carrying key."""
        return None if self.data is None else find_key(self.data, key)

    def holds(self, key: KeyIdentity, line: str) -> tuple[int | None, bool]:
        """(where key sits, whether that line is exactly `line`)."""
        at = self.find(key)
        if at is None or self.data is None:
            return None, False
        return at, self.data.split(b"\n")[at - 1].rstrip(b"\r") == line.encode()


@dataclass(frozen=True)
class Plan:
    """What prepare() settled; apply() writes from it and the Decisions taken on it."""

    label: str
    root: Path
    farm_dir: Path
    overlay: Path
    shape: Shape
    shape_from: Origins
    existing: creds_mod.Credentials | None
    rotate: bool
    facts: HostFacts
    findings: tuple[CheckResult, ...]
    dropin: dict[str, object]  # the drop-in's values (doors.dropin_vars): what the role's render must show
    dropin_target: str
    sshd_config: str  # the main sshd configuration (absolute): the drop-in goes to its sshd_config.d/
    rrsync: str
    key_file: KeyFile
    inherit_from: str | None
    cloud_init: bool
    notes: tuple[str, ...]
    host_keys: tuple[str, ...] = ()  # the door's known_hosts lines ([host]:port TYPE KEY), read from its sshd

    def key_line(self, public_key: str) -> str:
        """The door's authorized_keys line for a public key."""
        return key_line(self.shape.door, public_key, label=self.label, controller_port=self.shape.controller_port,
                        served=self.shape.served, rrsync=self.rrsync)


# --------------------------------------------------------------------------- prepare, step by step


def _check_flags(req: Request, label: str) -> None:
    if req.inherit_from is not None:
        if req.inherit_from == label:
            raise refusal(f"--inherit-from {label}: a farm cannot inherit from itself.")
        try:
            check_label(req.inherit_from)
        except DoorError as exc:
            raise refusal(f"--inherit-from: {exc}.") from None
    if req.authorized_keys is not None and req.install_key is False:
        raise refusal("--authorized-keys names where to install the key line, and --no-install-key says not to "
                      "install it. Drop one of them.")


def _key_file_path(req: Request) -> str:
    path = os.path.abspath(os.path.expanduser(req.authorized_keys or "~/.ssh/authorized_keys"))
    if under_forbidden_root(path):
        raise refusal(
            f"{req.authorized_keys or path} is under /etc/ssh, and fdl never edits anything there.",
            hint="install the line with your configuration management (the fdl_join_door role), or point sshd's "
                 "AuthorizedKeysFile at a file the account owns")
    return path


def _project_root(cwd: Path, label: str, notes: list[str]) -> Path:
    base = find_base(cwd)
    root = base.parent if base is not None else cwd.resolve()
    if base is None:
        notes.append(f"no fdl.yml in {root} or above: `fdl @{label} <cmd>` needs one next to fdl.{label}.yml.")
    return root


def _credentials(req: Request, prompter: Prompter | None, farm_dir: Path, notes: list[str]
                 ) -> tuple[creds_mod.Credentials | None, bool]:
    """(credentials found, rotate them?)."""
    try:
        existing = creds_mod.load(farm_dir)
        # Found credentials may come from a copied or cloned directory: reuse only what this user minted here.
        if existing is not None and not req.regen:
            creds_mod.vet(existing, farm_dir)
    except FdlError as exc:
        if not req.regen:
            raise refusal(exc.message, hint=exc.hint) from None
        notes.append(f"--regen: the credentials in {farm_dir} could not be reused ({exc.message}); new ones are "
                     f"minted.")
        existing = None
    if existing is None:
        if req.regen:
            notes.append("--regen: there were no credentials to rotate; new ones are minted.")
        return None, False
    if req.regen:
        return existing, True
    person = req.asks(prompter)
    keep = person is None or person.confirm(
        f"The farm already has a key ({existing.fingerprint}) and a token. Keep them? (no = rotate both: "
        f"workers holding the old ones stop being admitted)", True)
    return existing, not keep


def _observe(req: Request, label: str, shape: Shape, observe: Observe) -> tuple[dict[str, object], str, HostFacts]:
    """(the drop-in's values, where it goes, the host's facts): the drop-in is planned and scanned in place,
    as the role's fdl_join_door_plan module plans it (the same library)."""
    target_dir = os.path.join(os.path.dirname(os.path.abspath(req.sshd_config)), "sshd_config.d")
    target = os.path.join(target_dir, dropin_name(label))
    explicit = scan(req.sshd_config).ports(exclude=(target,)) if os.path.exists(req.sshd_config) else []
    values = dropin_vars(shape.door, label=label, door_port=shape.door_port, controller_port=shape.controller_port,
                         explicit_ports=explicit, jail_base=shape.jail_base)
    facts = observe(door_port=shape.door_port, served=shape.served, sshd_config=req.sshd_config,
                    dropin_target=target, dropin_lines=dropin_scan_lines(values), probe_host=shape.host)
    if shape.door == DOOR_A and facts.macos:
        raise refusal("door a jails its account with a read-only bind mount, which this fdl builds on Linux only.",
                      hint="serve the data from a Linux box, or use door b (rrsync) for what it can carry")
    return values, target, facts


def _host_keys(req: Request, shape: Shape, facts: HostFacts) -> tuple[tuple[str, ...], CheckResult]:
    """The door's host keys as known_hosts lines for the address workers dial, and the doctor's word on them.
    Read from the public halves of the keys the door's sshd serves (its HostKey lines, else sshd's defaults)."""
    config = facts.sshd_config if facts.sshd_config is not None else (
        scan(req.sshd_config) if os.path.exists(req.sshd_config) else None)
    keys = config.public_host_keys() if config is not None else []
    lines = tuple(known_hosts_lines(shape.host, shape.door_port, keys))
    if lines:
        kinds = ", ".join(line.split()[1] for line in lines)
        return lines, CheckResult("host-keys", "ok", f"workers pin the door's host keys ({kinds}): known_hosts "
                                                     f"for [{shape.host}]:{shape.door_port}")
    where = ", ".join(f + ".pub" for f in config.host_key_files()) if config is not None else req.sshd_config
    status = ERROR if req.cloud_init else WARNING
    return lines, CheckResult(
        "host-keys", status,
        f"the door's host keys cannot be read ({where}): workers could not pin the door, and one booted from "
        f"cloud-init user-data would find no known_hosts entry for it and stop for good",
        hint="install and start the OpenSSH server (its first start makes the host keys), or name the sshd "
             "configuration that serves the door with --sshd-config")


def _findings(req: Request, shape: Shape, facts: HostFacts, ak_explicit: bool) -> list[CheckResult]:
    findings = diagnose(facts, door=shape.door, door_port=shape.door_port)
    ak_files = facts.sshd_config.authorized_keys_files() if facts.sshd_config is not None else None
    if shape.door != DOOR_A and not ak_explicit and ak_files is not None \
            and not any(f in _DEFAULT_KEY_FILES for f in ak_files):
        findings.append(CheckResult(
            "authorized-keys-file", WARNING,
            f"sshd reads keys from {' '.join(ak_files)}, not ~/.ssh/authorized_keys: a line installed there is "
            f"ignored", hint="name the file sshd reads with --authorized-keys PATH (never one under /etc/ssh)"))
    return findings


def prepare(req: Request, prompter: Prompter | None = None, observe: Observe = gather_facts) -> Plan:
    """Settle everything and check the host; writes nothing."""
    label = settle_label(req)
    _check_flags(req, label)
    ak_path = _key_file_path(req)
    notes: list[str] = []
    root = _project_root(req.cwd, label, notes)
    farm_dir = root / FARM_ROOT / label
    recovered = recover_shape(farm_dir / WORKER_YML)
    shape, shape_from = settle_shape(req, prompter, recovered, label)
    if recovered and req.controller is None and req.door is None:
        notes.append(f"farm shape recovered from {farm_dir / WORKER_YML}: door {shape.door}, {shape.controller} "
                     f"(name --door or --controller to change it).")
    existing, rotate = _credentials(req, prompter, farm_dir, notes)
    dropin, dropin_target, facts = _observe(req, label, shape, observe)
    findings = _findings(req, shape, facts, req.authorized_keys is not None)
    host_keys, host_key_finding = _host_keys(req, shape, facts)
    findings.append(host_key_finding)
    if req.cloud_init and not host_keys:
        raise refusal(f"{host_key_finding.message}. Nothing was written.", hint=host_key_finding.hint)
    key_file, unreadable = KeyFile.read(ak_path, req.authorized_keys is not None)
    if unreadable:
        notes.append(unreadable)
    return Plan(
        label=label, root=root, farm_dir=farm_dir, overlay=overlay_file(root, label) or root / f"fdl.{label}.yml",
        shape=shape, shape_from=shape_from, existing=existing, rotate=rotate, facts=facts,
        findings=tuple(findings), dropin=dropin, dropin_target=dropin_target, host_keys=host_keys,
        sshd_config=os.path.abspath(req.sshd_config),
        rrsync=facts.rrsync_path or "rrsync", key_file=key_file, inherit_from=req.inherit_from,
        cloud_init=req.cloud_init, notes=tuple(notes))
