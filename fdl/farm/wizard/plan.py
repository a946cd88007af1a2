"""Plan: everything `prepare()` settles before a question about the key file is asked or a file is written.

The farm's place and shape, its credentials (found and vetted, or to be minted), the sshd drop-in rendered
and checked, the host observed by the doctor, and the authorized_keys file read once. The record is frozen:
the decisions taken on it (decide.py) are a record of their own.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fdl.config.discover import find_base, overlay_file
from fdl.errors import FdlError
from fdl.farm import credentials as creds_mod
from fdl.farm.doctor import HostFacts, diagnose, gather_facts
from fdl.farm.render import render_dropin
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
from fdl.hostside.checks.report import ERROR, OK, SKIPPED, WARNING, CheckResult
from fdl.hostside.farm.authorized_keys import KeyIdentity, find_key, under_forbidden_root
from fdl.hostside.farm.doors import DOOR_A, DoorError, check_label, dropin_name, dropin_vars, key_line
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
    dropin_text: str
    dropin_target: str
    sshd_config: str  # the main sshd configuration (absolute): the drop-in goes to its sshd_config.d/
    rrsync: str
    key_file: KeyFile
    inherit_from: str | None
    cloud_init: bool
    notes: tuple[str, ...]

    def key_line(self, public_key: str) -> str:
        """The door's authorized_keys line for a public key."""
        return key_line(self.shape.door, public_key, label=self.label, controller_port=self.shape.controller_port,
                        served=self.shape.served, rrsync=self.rrsync)


# --------------------------------------------------------------------------- drop-in check


def validate_dropin(sshd: str, main_config: str, text: str) -> CheckResult:
    """`sshd -t` over this box's configuration with the new drop-in read first (as root)."""
    if os.geteuid() != 0:
        return CheckResult("sshd -t", SKIPPED, "the drop-in was not checked with sshd -t (that needs root, to read "
                           "the host keys)", hint="the privileged step runs sshd -t before the drop-in goes live")
    with tempfile.TemporaryDirectory(prefix="fdl-dropin-") as tmp:
        dropin = Path(tmp) / "door.conf"
        dropin.write_text(text)
        wrapper = Path(tmp) / "sshd_config"
        wrapper.write_text(f"Include {dropin}\nInclude {os.path.abspath(main_config)}\n")
        try:
            done = subprocess.run([sshd, "-t", "-f", str(wrapper)], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            return CheckResult("sshd -t", WARNING, f"sshd -t could not run: {exc}")
    if done.returncode == 0:
        return CheckResult("sshd -t", OK, "the drop-in passes sshd -t together with this box's configuration")
    detail = (done.stderr or done.stdout).strip().replace(str(dropin), DROPIN)
    return CheckResult("sshd -t", ERROR, f"sshd -t rejects the configuration with the drop-in: {detail}",
                       hint="fix what sshd names in your configuration, then run the wizard again")


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


def _observe(req: Request, label: str, shape: Shape, observe: Observe) -> tuple[str, str, HostFacts]:
    """(drop-in text, where it goes, the host's facts): the drop-in is rendered and scanned in place."""
    target_dir = os.path.join(os.path.dirname(os.path.abspath(req.sshd_config)), "sshd_config.d")
    target = os.path.join(target_dir, dropin_name(label))
    explicit = scan(req.sshd_config).ports(exclude=(target,)) if os.path.exists(req.sshd_config) else []
    text = render_dropin(dropin_vars(shape.door, label=label, door_port=shape.door_port,
                                     controller_port=shape.controller_port, explicit_ports=explicit,
                                     jail_base=shape.jail_base))
    facts = observe(door_port=shape.door_port, served=shape.served, sshd_config=req.sshd_config,
                    dropin_target=target, dropin_lines=text.splitlines(), probe_host=shape.host)
    if shape.door == DOOR_A and facts.macos:
        raise refusal("door a jails its account with a read-only bind mount, which this fdl builds on Linux only.",
                      hint="serve the data from a Linux box, or use door b (rrsync) for what it can carry")
    return text, target, facts


def _findings(req: Request, shape: Shape, facts: HostFacts, dropin_text: str, ak_explicit: bool) -> list[CheckResult]:
    findings = diagnose(facts, door=shape.door, door_port=shape.door_port)
    if facts.sshd_path is not None:
        findings.append(validate_dropin(facts.sshd_path, req.sshd_config, dropin_text))
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
    dropin_text, dropin_target, facts = _observe(req, label, shape, observe)
    findings = _findings(req, shape, facts, dropin_text, req.authorized_keys is not None)
    key_file, unreadable = KeyFile.read(ak_path, req.authorized_keys is not None)
    if unreadable:
        notes.append(unreadable)
    return Plan(
        label=label, root=root, farm_dir=farm_dir, overlay=overlay_file(root, label) or root / f"fdl.{label}.yml",
        shape=shape, shape_from=shape_from, existing=existing, rotate=rotate, facts=facts,
        findings=tuple(findings), dropin_text=dropin_text, dropin_target=dropin_target,
        sshd_config=os.path.abspath(req.sshd_config),
        rrsync=facts.rrsync_path or "rrsync", key_file=key_file, inherit_from=req.inherit_from,
        cloud_init=req.cloud_init, notes=tuple(notes))
