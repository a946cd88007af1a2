"""`fdl join-config`: everything a farm needs, in one pass on the controller box.

Two phases, so that nothing is written before every question is answered and
the host doctor has spoken:

- `prepare()` settles the farm's shape (flags, else what the farm's own
  worker yml says, else prompts or defaults), observes the host, renders and
  checks the sshd drop-in, and takes every decision (rotate? install the key
  line? fix permissions?). A decision needed without a terminal is a refusal.
- `apply()` writes: the farm directory, credentials, worker yml, drop-in,
  key line, cloud-init, self-test, the overlay (created, or only its token
  rewritten), and the authorized_keys line when consent was given.

The library never prints: questions go through a `Prompter` the caller
supplies, results come back as a `FarmReport`.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import yaml

from fdl.checks.report import ERROR, OK, SKIPPED, WARNING, CheckResult
from fdl.config.discover import find_base, overlay_file
from fdl.config.parse import split_host_port
from fdl.errors import FdlError
from fdl.farm import credentials as creds_mod
from fdl.farm.authorized_keys import (
    AuthorizedKeysError,
    KeyIdentity,
    PermissionIssue,
    atomic_write,
    check_permissions,
    find_key,
    fix_permissions,
    install_line,
    remove_keys,
    under_forbidden_root,
)
from fdl.farm.doctor import DEFAULT_SSHD_CONFIG, HostFacts, Spelling, diagnose, gather_facts, probe_banner
from fdl.farm.doors import (
    DEFAULT_CONTROLLER_PORT,
    DEFAULT_DOOR_PORT,
    DOOR_A,
    DOOR_B,
    DOOR_TUNNEL,
    DOORS,
    JAIL_BASE,
    JAIL_DATA,
    TITLES,
    DoorError,
    check_label,
    check_served,
    dropin_name,
    dropin_vars,
    jail,
    key_line,
)
from fdl.farm.overlay import OverlayEditError, current_token, has_token, read_crate, rewrite_token
from fdl.farm.render import render, render_dropin, render_unit
from fdl.farm.sshd_config import scan

FARM_ROOT = ".fdl"
WORKER_YML, DROPIN, KEY_LINE, CLOUD_INIT, SELFTEST, SNIPPET, INSTALLED = (
    "worker.yml", "sshd-door.conf", "authorized_keys.line", "cloud-init.yml", "door-selftest.sh",
    "overlay-snippet.yml", "installed-at")
WORKER_DIR = "/etc/fdl/{label}"  # where the setup steps and cloud-init put a worker's copy
# cloud-init's unit: templates/fdl-join.service.j2 under the name the fdl_join_worker role gives it, running the
# fdl the image put on PATH, as the account the role creates.
CLOUD_UNIT = "flodl-join.service"
CLOUD_USER = "flodl"
CLOUD_FDL = "/usr/bin/env fdl"
CLOUD_UNIT_MANAGED = "Written by fdl join-config {label} --cloud-init (templates/fdl-join.service.j2)."
DEFAULT_DATA_DIR = "/flodl/data"
_USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9._-]{0,31}")
_SHAPE_RE = re.compile(r"^# fdl-farm-shape: (.*)$", re.M)


def refusal(message: str, hint: str | None = None) -> FdlError:
    """Every refusal of the wizard exits 1 (its documented contract)."""
    return FdlError(message, hint=hint, exit_code=1)


class Prompter(Protocol):
    """How the wizard asks a person; only used when Request.interactive is true."""

    def choose(self, question: str, choices: tuple[str, ...], default: str) -> str: ...

    def text(self, question: str, default: str) -> str: ...

    def confirm(self, question: str, default: bool) -> bool: ...


@dataclass
class Request:
    """What the command line said (None: not given)."""

    label: str | None = None
    env_label: str | None = None  # the env selected with @NAME / --env / FDL_ENV
    env_source: str | None = None
    door: str | None = None
    controller: str | None = None
    port: int | None = None
    served: str | None = None
    inherit_from: str | None = None
    regen: bool = False
    install_key: bool | None = None
    authorized_keys: str | None = None
    cloud_init: bool = False
    sshd_config: str = DEFAULT_SSHD_CONFIG
    jail_base: str | None = None  # door a: where the jailed account's home and chroot go (default JAIL_BASE)
    assume_yes: bool = False
    interactive: bool = False
    cwd: Path = field(default_factory=Path.cwd)


@dataclass
class Shape:
    """The farm's shape: which door, where workers dial, what it serves."""

    door: str
    user: str
    host: str
    door_port: int
    controller_port: int
    served: str | None
    jail_base: str = JAIL_BASE  # door a only

    @property
    def controller(self) -> str:
        return f"{self.user}@{self.host}:{self.door_port}"


@dataclass
class Plan:
    label: str
    root: Path
    farm_dir: Path
    overlay: Path
    shape: Shape
    shape_from: dict[str, str]  # field -> "flag" | "worker yml" | "prompt" | "default"
    existing: creds_mod.Credentials | None
    rotate: bool
    facts: HostFacts
    findings: list[CheckResult]
    dropin_text: str
    dropin_target: str
    rrsync: str
    ak_path: str
    ak_explicit: bool
    install: bool
    fix_perms: bool
    perm_issues: list[PermissionIssue]
    old_line_at: int | None  # where the key being rotated out sits in ak_path
    inherit_from: str | None
    cloud_init: bool
    notes: list[str] = field(default_factory=list)
    cred_modes: list[creds_mod.ModeIssue] = field(default_factory=list)  # reused files wider than 0600
    fix_cred_modes: bool = False
    unconfined_at: int | None = None  # door a: line of ak_path where the farm key logs in unjailed (to remove)


@dataclass
class FarmReport:
    """What the wizard did: the human report and its JSON twin carry the same data."""

    label: str
    door: str
    shape: Shape
    shape_from: dict[str, str]
    farm_dir: Path
    files: dict[str, str]
    credentials: dict
    overlay: dict
    authorized_keys: dict
    doctor: list[CheckResult]
    steps: list[dict]
    worker_steps: list[str]
    notes: list[str]

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "door": self.door,
            "door_title": TITLES[self.door],
            "controller": {"user": self.shape.user, "host": self.shape.host, "door_port": self.shape.door_port,
                           "training_port": self.shape.controller_port, "ssh": self.shape.controller},
            "served": self.shape.served,
            "shape_from": self.shape_from,
            "farm_dir": str(self.farm_dir),
            "files": self.files,
            "credentials": self.credentials,
            "overlay": self.overlay,
            "authorized_keys": self.authorized_keys,
            "doctor": [{"name": c.name, "status": c.status, "message": c.message, "hint": c.hint}
                       for c in self.doctor],
            "steps": self.steps,
            "worker_steps": self.worker_steps,
            "notes": self.notes,
        }


# --------------------------------------------------------------------------- shape


def parse_controller(text: str, default_user: str) -> tuple[str, str, int]:
    """`[user@]host[:port]` -> (user, host, door port)."""
    user, _, rest = text.rpartition("@")
    user = user or default_user
    if not _USER_RE.fullmatch(user):
        raise refusal(f"--controller {text!r}: {user!r} is not a login name (letters, digits, '.', '-', '_').")
    try:
        host, port = split_host_port(rest, default_port=DEFAULT_DOOR_PORT)
    except ValueError as exc:
        raise refusal(f"--controller {text!r}: {exc}. Expected USER@HOST[:PORT], e.g. op@10.0.0.1:2222.") from None
    return user, host, port


def recover_shape(worker_yml: Path) -> dict:
    """The farm's shape as its own worker yml records it ({} when there is no such file)."""
    try:
        text = worker_yml.read_text(encoding="utf-8")
    except OSError:
        return {}
    out: dict = {}
    marker = _SHAPE_RE.search(text)
    if marker:
        for item in marker.group(1).split():
            key, _, value = item.partition("=")
            if key in ("door", "served", "jail") and value:
                out[key] = value
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return out
    join = doc.get("join") if isinstance(doc, dict) else None
    if not isinstance(join, dict):
        return out
    if isinstance(join.get("ssh"), str):
        try:
            out["user"], out["host"], out["door_port"] = parse_controller(join["ssh"], getpass.getuser())
        except FdlError:
            pass
    if join.get("controller") is not None:
        try:
            out["controller_port"] = split_host_port(str(join["controller"]))[1]
        except ValueError:
            pass
    if "door" not in out:  # a hand-edited file lost its marker: read the door off what it fetches
        out["door"] = DOOR_B if "source" in join else DOOR_A if "data_source" in join else DOOR_TUNNEL
    return out


def _primary_address() -> str:
    """This box's outward address (a UDP connect sends nothing), else its host name."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed, nothing is sent
            address = sock.getsockname()[0]
            if address and not address.startswith("0."):
                return address
    except OSError:
        pass
    return socket.gethostname()


def _decide(req: Request, what: str, flag: str, default_text: str) -> None:
    """Raise the refusal for a decision that needs a person when there is no terminal."""
    if not req.interactive and not req.assume_yes:
        raise refusal(f"{what} needs deciding and there is no terminal to ask on (stdin is not a tty, or --json).",
                      hint=f"pass {flag}, or --yes to take the default ({default_text})")


def _resolve_label(req: Request) -> str:
    label = req.label or req.env_label
    if req.label and req.env_label and req.label != req.env_label:
        raise refusal(f"two farm names: {req.label!r} on the command line and {req.env_label!r} from "
                      f"{req.env_source}. Name one.")
    if not label:
        raise refusal("name the farm: fdl join-config LABEL (or fdl @LABEL join-config); it becomes the env "
                      "overlay fdl.LABEL.yml.")
    try:
        return check_label(label)
    except DoorError as exc:
        raise refusal(str(exc) + ".") from None


def _settle_shape(req: Request, prompter: Prompter | None, recovered: dict,
                  label: str) -> tuple[Shape, dict[str, str]]:
    origin: dict[str, str] = {}
    me = getpass.getuser()

    # the door
    if req.door is not None:
        door, origin["door"] = req.door, "flag"
    elif "door" in recovered:
        door, origin["door"] = recovered["door"], "worker yml"
    else:
        _decide(req, "the door (a: sftp mount, b: source pull, tunnel-only)", "--door a|b|tunnel-only", "b")
        if req.interactive and prompter is not None:
            door, origin["door"] = prompter.choose(
                "Door: a = read-only sftp for mounting data, b = read-only rsync of the published run, "
                "tunnel-only = just the forward", DOORS, DOOR_B), "prompt"
        else:
            door, origin["door"] = DOOR_B, "default"
    if door not in DOORS:
        raise refusal(f"unknown door {door!r}: choose one of {', '.join(DOORS)}.")

    # the controller as workers dial it
    if req.controller is not None:
        user, host, door_port = parse_controller(req.controller, me)
        origin["controller"] = "flag"
    elif "host" in recovered:
        user, host, door_port = recovered["user"], recovered["host"], recovered["door_port"]
        origin["controller"] = "worker yml"
    else:
        default = f"{me}@{_primary_address()}:{DEFAULT_DOOR_PORT}"
        _decide(req, "the controller address workers dial", "--controller USER@HOST[:PORT]", default)
        if req.interactive and prompter is not None:
            user, host, door_port = parse_controller(
                prompter.text("Controller as workers reach its door (USER@HOST:PORT)", default), me)
            origin["controller"] = "prompt"
        else:
            user, host, door_port = parse_controller(default, me)
            origin["controller"] = "default"

    if req.port is not None:
        controller_port, origin["port"] = req.port, "flag"
    elif "controller_port" in recovered:
        controller_port, origin["port"] = recovered["controller_port"], "worker yml"
    else:
        controller_port, origin["port"] = DEFAULT_CONTROLLER_PORT, "default"

    served = None
    if door in (DOOR_A, DOOR_B):
        if req.served is not None:
            served, origin["served"] = os.path.abspath(os.path.expanduser(req.served)), "flag"
        elif recovered.get("served") and recovered.get("door") == door:
            served, origin["served"] = recovered["served"], "worker yml"
        else:
            served = DEFAULT_DATA_DIR if door == DOOR_A else str(Path.home() / ".flodl" / "run")
            origin["served"] = "default"
        try:
            served = check_served(served)
        except DoorError as exc:
            raise refusal(str(exc) + ".") from None
    elif req.served is not None:
        raise refusal("--served names what doors a and b serve; the tunnel-only door serves nothing. "
                      "Drop --served or pick door a or b.")

    jail_base = JAIL_BASE
    if door == DOOR_A:
        # Door a's key logs in as an account of its own, jailed; never as the controller's account.
        jail_base = req.jail_base or (recovered.get("jail") if recovered.get("door") == DOOR_A else None) or JAIL_BASE
        try:
            cell = jail(label, jail_base)
        except DoorError as exc:
            raise refusal(str(exc) + ".") from None
        named = (req.controller if origin.get("controller") == "flag" else "") or ""
        if user != cell.account and "@" in named:
            raise refusal(f"door a's workers log in as the door's own jailed account {cell.account}, not {user}: "
                          f"a key in {user}'s own key file could read everything {user} can.",
                          hint=f"name --controller {cell.account}@{host}:{door_port}")
        user = cell.account
    elif req.jail_base is not None:
        raise refusal("--jail-dir places door a's jail; this farm's door is not a. Drop --jail-dir.")

    if door_port == 22:
        raise refusal(
            "the door cannot be port 22: the drop-in confines every connection arriving on the door port, "
            "so on 22 it would confine your own logins too.",
            hint="give the door a port of its own, e.g. --controller USER@HOST:2222")
    if door_port == controller_port:
        raise refusal(f"the door port and the training port are both {door_port}; they must differ.")
    if not 1 <= controller_port <= 65535:
        raise refusal(f"--port {controller_port}: expected a TCP port from 1 to 65535.")
    return Shape(door, user, host, door_port, controller_port, served, jail_base), origin


# --------------------------------------------------------------------------- drop-in check


def validate_dropin(sshd: str, main_config: str, text: str) -> CheckResult:
    """`sshd -t` over this box's configuration with the new drop-in read first (as root)."""
    if os.geteuid() != 0:
        return CheckResult("sshd -t", SKIPPED, "the drop-in was not checked with sshd -t (that needs root, to read "
                           "the host keys)", hint="the setup steps run sshd -t before the reload")
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


# --------------------------------------------------------------------------- prepare


def prepare(req: Request, prompter: Prompter | None = None,
            observe: Callable[..., HostFacts] = gather_facts) -> Plan:
    """Settle everything and check the host; writes nothing."""
    label = _resolve_label(req)
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
    ak_explicit = req.authorized_keys is not None
    ak_path = os.path.abspath(os.path.expanduser(req.authorized_keys or "~/.ssh/authorized_keys"))
    if under_forbidden_root(ak_path):
        raise refusal(
            f"{req.authorized_keys or ak_path} is under /etc/ssh, and fdl never edits anything there.",
            hint="install the line with your configuration management (the fdl_join_door role), or point sshd's "
                 "AuthorizedKeysFile at a file the account owns")

    base = find_base(req.cwd)
    root = base.parent if base is not None else req.cwd.resolve()
    notes: list[str] = []
    if base is None:
        notes.append(f"no fdl.yml in {root} or above: `fdl @{label} <cmd>` needs one next to fdl.{label}.yml.")
    farm_dir = root / FARM_ROOT / label
    overlay = overlay_file(root, label) or root / f"fdl.{label}.yml"

    recovered = recover_shape(farm_dir / WORKER_YML)
    shape, shape_from = _settle_shape(req, prompter, recovered, label)
    if recovered and req.controller is None and req.door is None:
        notes.append(f"farm shape recovered from {farm_dir / WORKER_YML}: door {shape.door}, {shape.controller} "
                     f"(name --door or --controller to change it).")

    try:
        existing = creds_mod.load(farm_dir)
        # Found credentials may come from a copied or cloned directory: reuse only what passes the checks.
        cred_modes = creds_mod.vet(existing) if existing is not None and not req.regen else []
    except FdlError as exc:
        if not req.regen:
            raise refusal(exc.message, hint=exc.hint) from None
        notes.append(f"--regen: the credentials in {farm_dir} could not be reused ({exc.message}); new ones are "
                     f"minted.")
        existing, cred_modes = None, []
    rotate = False
    if existing is None:
        if req.regen:
            notes.append("--regen: there were no credentials to rotate; new ones are minted.")
    elif req.regen:
        rotate = True
    elif req.interactive and prompter is not None:
        rotate = not prompter.confirm(
            f"The farm already has a key ({existing.fingerprint}) and a token. Keep them? (no = rotate both: "
            f"workers holding the old ones stop being admitted)", True)

    # the host, before anything is written
    target_dir = os.path.join(os.path.dirname(os.path.abspath(req.sshd_config)), "sshd_config.d")
    dropin_target = os.path.join(target_dir, dropin_name(label))
    explicit = scan(req.sshd_config).ports(exclude=(dropin_target,)) if os.path.exists(req.sshd_config) else []
    dropin_text = render_dropin(dropin_vars(shape.door, label=label, door_port=shape.door_port,
                                            controller_port=shape.controller_port, explicit_ports=explicit,
                                            jail_base=shape.jail_base))
    facts = observe(door_port=shape.door_port, served=shape.served, sshd_config=req.sshd_config,
                    dropin_target=dropin_target, dropin_lines=dropin_text.splitlines(), probe_host=shape.host)
    if shape.door == DOOR_A and facts.macos:
        raise refusal("door a jails its account with a read-only bind mount, which this fdl builds on Linux only.",
                      hint="serve the data from a Linux box, or use door b (rrsync) for what it can carry")
    findings = diagnose(facts, door=shape.door, door_port=shape.door_port)
    if facts.sshd_path is not None:
        findings.append(validate_dropin(facts.sshd_path, req.sshd_config, dropin_text))
    scan_ = facts.sshd_config
    ak_files = scan_.authorized_keys_files() if scan_ is not None else None
    if shape.door != DOOR_A and not ak_explicit and ak_files is not None and not any(
            f in (".ssh/authorized_keys", "%h/.ssh/authorized_keys", "~/.ssh/authorized_keys") for f in ak_files):
        findings.append(CheckResult(
            "authorized-keys-file", WARNING,
            f"sshd reads keys from {' '.join(ak_files)}, not ~/.ssh/authorized_keys: a line installed there is "
            f"ignored", hint="name the file sshd reads with --authorized-keys PATH (never one under /etc/ssh)"))

    return Plan(
        label=label, root=root, farm_dir=farm_dir, overlay=overlay, shape=shape, shape_from=shape_from,
        existing=existing, rotate=rotate, facts=facts, findings=findings, dropin_text=dropin_text,
        dropin_target=dropin_target, rrsync=facts.rrsync_path or "rrsync", ak_path=ak_path, ak_explicit=ak_explicit,
        install=False, fix_perms=False, perm_issues=[], old_line_at=None,
        inherit_from=req.inherit_from, cloud_init=req.cloud_init, notes=notes, cred_modes=cred_modes)


def decide(plan: Plan, req: Request, prompter: Prompter | None = None) -> Plan:
    """Take the authorized_keys decisions (consent, permissions); writes nothing, may refuse."""
    ak_path, ak_explicit, notes = plan.ak_path, plan.ak_explicit, plan.notes
    existing, rotate = plan.existing, plan.rotate
    if plan.cred_modes and not rotate:
        listing = "; ".join(f"{i.path} is {i.mode:04o}" for i in plan.cred_modes)
        commands = " && ".join(i.command for i in plan.cred_modes)
        if req.interactive and prompter is not None:
            plan.fix_cred_modes = prompter.confirm(f"The farm's credentials are readable by others ({listing}). "
                                                   f"Make them 0600 before reusing them?", True)
        else:
            plan.fix_cred_modes = req.assume_yes
        if not plan.fix_cred_modes:
            raise refusal(f"the farm's credentials are readable by others ({listing}); fdl reuses a key and "
                          f"token only once they are 0600.",
                          hint=f"run `{commands}` (or add --yes to let the wizard do it), or --regen to mint new "
                               f"ones if others may have read them")
    if plan.shape.door == DOOR_A:
        return _decide_jailed(plan, req)
    # the authorized_keys decisions
    uid = os.getuid()
    if ak_explicit:
        for candidate in (ak_path, os.path.dirname(ak_path)):
            try:
                uid = os.stat(candidate).st_uid
                break
            except OSError:
                continue
    old_line_at = None
    if rotate and existing is not None:
        try:
            old_line_at = find_key(Path(ak_path).read_bytes(), existing.identity)
        except OSError:
            old_line_at = None
    install = bool(req.install_key)
    if existing is not None and not rotate and req.install_key is None and _line_is_current(plan, existing):
        pass  # the exact line is already in place: nothing to ask
    elif old_line_at is not None and req.install_key is None:
        if not req.interactive or prompter is None:
            raise refusal(
                f"rotating the farm's credentials leaves the old key installed in {ak_path} (line {old_line_at}), "
                f"where it would keep letting old workers in. Replacing that line needs your consent, and --yes "
                f"does not give it.", hint="add --install-key, or remove the line yourself first")
        install = prompter.confirm(f"Replace the old farm key line in {ak_path} (line {old_line_at}) with the "
                                   f"new key?", True)
        if not install:
            notes.append(f"the old farm key stays in {ak_path} (line {old_line_at}): workers holding it are still "
                         f"let in until you remove that line.")
    elif old_line_at is not None and req.install_key is False:
        notes.append(f"--no-install-key: the old farm key stays in {ak_path} (line {old_line_at}) and keeps letting "
                     f"workers that hold it in until you remove that line.")
    elif req.install_key is None and req.interactive and prompter is not None:
        install = prompter.confirm(f"Install the door's key line into {ak_path}? (only fdl's own line is "
                                   f"touched)", False)
    elif req.install_key is None:
        notes.append(f"the key line was not installed into {ak_path} (installing needs --install-key or a yes "
                     f"at the prompt; --yes does not count).")

    perm_issues: list[PermissionIssue] = []
    fix_perms = False
    if install:
        perm_issues = check_permissions(ak_path, uid=uid, manage_parent=not ak_explicit,
                                        home=str(Path.home()) if not ak_explicit else None)
        if not ak_explicit and not os.path.isdir(os.path.dirname(ak_path)):
            notes.append(f"{os.path.dirname(ak_path)} will be created, mode 0700.")
        if ak_explicit and not os.path.isdir(os.path.dirname(ak_path)):
            raise refusal(f"the directory {os.path.dirname(ak_path)} does not exist; with --authorized-keys fdl "
                          f"leaves that directory to you.", hint="create it with the owner and mode your sshd "
                          "expects, then run again")
        unfixable = [i for i in perm_issues if i.blocking and not i.fixable]
        if unfixable:
            lines = "; ".join(f"{i.path} is {i.problem} (fix: {i.command})" for i in unfixable)
            raise refusal(f"sshd would ignore the key line because of permissions this process cannot fix: {lines}.")
        fixable = [i for i in perm_issues if i.fixable]
        if fixable:
            listing = "; ".join(f"{i.path} is {i.mode:04o}, {i.problem}: {i.command}" for i in fixable)
            if req.interactive and prompter is not None:
                fix_perms = prompter.confirm(f"Permissions: {listing}. Fix them?", True)
            elif req.assume_yes:
                fix_perms = True
            elif any(i.blocking for i in fixable):
                raise refusal(f"permissions need fixing before sshd will read the key line ({listing}), and there "
                              f"is no terminal to confirm on.", hint="run those chmod commands, or add --yes to "
                                                                     "let the wizard run them")
            if not fix_perms and any(i.blocking for i in fixable):
                raise refusal(f"sshd would ignore the key line while these permissions stand: {listing}.",
                              hint="run the chmod commands shown, then run again")

    if install and plan.facts.in_container:
        notes.append(f"this looks like a container: the key line goes into {ak_path} here, which only matters if the "
                     f"sshd workers dial reads it. Install it where that sshd lives (or name its key file with "
                     f"--authorized-keys, e.g. a bind-mounted directory).")
    plan.install, plan.fix_perms, plan.perm_issues, plan.old_line_at = install, fix_perms, perm_issues, old_line_at
    return plan


def _decide_jailed(plan: Plan, req: Request) -> Plan:
    """Door a: the key goes to the jailed account's file (a privileged step), never to ak_path.

    A farm key found in ak_path is an unconfined door a from before the jail: whoever holds it can read
    every file this account can. It is removed with consent (--install-key or a yes), else refused.
    """
    cell = jail(plan.label, plan.shape.jail_base)
    at = None
    if plan.existing is not None:
        try:
            at = find_key(Path(plan.ak_path).read_bytes(), plan.existing.identity)
        except OSError:
            at = None
    if at is not None:
        if not req.install_key:
            raise refusal(
                f"{plan.ak_path} line {at} lets the farm key of {plan.label} log in as this account, with an sftp "
                f"that is not confined to the served directory: any worker key holder can read every file this "
                f"account can (~/.ssh included). Door a now logs in as the jailed account {cell.account}; that "
                f"line must go.",
                hint=f"run again with --install-key to remove it (or delete line {at} of {plan.ak_path} yourself), "
                     f"then follow the setup steps; workers need the new worker.yml (user {cell.account}, path "
                     f"{JAIL_DATA})")
        plan.unconfined_at = at
    plan.install = False
    return plan


def _line_is_current(plan: Plan, cred: creds_mod.Credentials) -> bool:
    """True when the key file already holds exactly the line this run would install."""
    try:
        data = Path(plan.ak_path).read_bytes()
    except OSError:
        return False
    at = find_key(data, cred.identity)
    if at is None:
        return False
    line = key_line(plan.shape.door, cred.public_key, label=plan.label, controller_port=plan.shape.controller_port,
                    served=plan.shape.served, rrsync=plan.rrsync)
    return data.split(b"\n")[at - 1].rstrip(b"\r") == line.encode()


# --------------------------------------------------------------------------- apply


def _rel(path: Path | str, cwd: Path) -> str:
    """How a path is spelled in the steps: relative to where the user stands when it is below it."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(cwd.resolve()))
    except ValueError:
        return str(path)


def _write(path: Path, text: str, mode: int) -> None:
    atomic_write(str(path), text.encode("utf-8"), mode)


def _cloud_packages(door: str) -> list[str]:
    return ["openssh-client"] + (["rsync"] if door == DOOR_B else ["sshfs"] if door == DOOR_A else [])


def _overlay(plan: Plan, token: str, cwd: Path) -> dict:
    crate = read_crate(plan.root)
    values = dict(label=plan.label, inherit_from=plan.inherit_from, host=plan.shape.host,
                  controller_port=plan.shape.controller_port, tunnel=plan.shape.door == DOOR_TUNNEL, token=token,
                  crate=crate)
    shown = _rel(plan.overlay, cwd)
    if not plan.overlay.exists():
        _write(plan.overlay, render("overlay.yml.j2", **values), 0o600)
        return {"path": str(plan.overlay), "action": "created",
                "command": crate.name if crate else None,
                "message": f"{shown} created" + (f" with command '{crate.name}' (cluster: true)" if crate else
                                                 " (commands: left as a commented placeholder)")}
    data = plan.overlay.read_bytes()
    snippet = plan.farm_dir / SNIPPET
    masked = render("overlay.yml.j2", **dict(values, token=f"<the contents of {_rel(plan.farm_dir / 'token', cwd)}>"))
    if not has_token(data):
        _write(snippet, render("overlay.yml.j2", **values), 0o600)
        return {"path": str(plan.overlay), "action": "snippet", "snippet": str(snippet), "snippet_text": masked,
                "message": f"{shown} has no token line, so fdl leaves it as you wrote it; paste what you need from "
                           f"{_rel(snippet, cwd)} (the same snippet with the token in it)"}
    if current_token(data) == token:
        changed = _private(plan.overlay)
        return {"path": str(plan.overlay), "action": "unchanged", "mode_changed": changed,
                "message": f"{shown} already holds the farm's token"
                           + (f"; its mode changed from {changed} to 0600 (it holds the token)" if changed else "")}
    try:
        new = rewrite_token(data, token)
    except OverlayEditError as exc:
        _write(snippet, render("overlay.yml.j2", **values), 0o600)
        return {"path": str(plan.overlay), "action": "snippet", "snippet": str(snippet), "snippet_text": masked,
                "message": f"{shown} was left alone ({exc}); set its token from {_rel(snippet, cwd)}"}
    assert new is not None
    mode = stat.S_IMODE(plan.overlay.stat().st_mode)
    atomic_write(str(plan.overlay), new, 0o600)  # it holds the token: never readable by others
    changed = f"{mode:04o}" if mode != 0o600 else None
    return {"path": str(plan.overlay), "action": "token-rewritten", "mode_changed": changed,
            "message": f"{shown}: only its token line was rewritten"
                       + (f"; its mode changed from {changed} to 0600 (it holds the token)" if changed else "")}


def _private(path: Path) -> str | None:
    """Make a file holding the token 0600; the old mode when it changed."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode == 0o600:
        return None
    os.chmod(path, 0o600)
    return f"{mode:04o}"


def apply(plan: Plan, cwd: Path | None = None) -> FarmReport:
    """Write the farm. Call only with a Plan from prepare()."""
    cwd = cwd or Path.cwd()
    shape, label, farm = plan.shape, plan.label, plan.farm_dir
    notes = list(plan.notes)
    farm.mkdir(parents=True, exist_ok=True, mode=0o700)
    before = stat.S_IMODE(os.stat(farm).st_mode)
    if before != 0o700:
        os.chmod(farm, 0o700)
        notes.append(f"changed the mode of {_rel(farm, cwd)} from {before:04o} to 0700 (it holds the farm's key "
                     f"and token)")
    ignore = farm / ".gitignore"
    if not ignore.exists():
        _write(ignore, "# written by fdl join-config: this folder holds the farm's private key and token\n*\n",
               0o644)

    modes_fixed = []
    if plan.existing is not None and not plan.rotate:
        cred = plan.existing
        cred_action = "reused"
        if plan.fix_cred_modes:
            for issue in plan.cred_modes:
                os.chmod(issue.path, 0o600)
                modes_fixed.append({"path": str(issue.path), "from": f"{issue.mode:04o}", "to": "0600"})
                notes.append(f"changed the mode of {_rel(issue.path, cwd)} from {issue.mode:04o} to 0600 before "
                             f"reusing it")
    else:
        cred = creds_mod.mint(farm, label)
        cred_action = "rotated" if plan.existing is not None else "created"
    token = cred.token()

    line = key_line(shape.door, cred.public_key, label=label, controller_port=shape.controller_port,
                    served=shape.served, rrsync=plan.rrsync)
    worker_key = WORKER_DIR.format(label=label) + "/key"
    worker_values = dict(label=label, door=shape.door, door_title=TITLES[shape.door], worker_key=worker_key,
                         served=shape.served, user=shape.user, host=shape.host, door_port=shape.door_port,
                         controller_port=shape.controller_port, token=token, jail_data=JAIL_DATA,
                         jail_base=shape.jail_base if shape.door == DOOR_A else None)
    worker_yml = render("worker.yml.j2", **worker_values)
    files = {
        "farm_dir": str(farm),
        "key": str(cred.key),
        "public_key": str(cred.public),
        "token": str(cred.token_file),
        "worker_yml": str(farm / WORKER_YML),
        "dropin": str(farm / DROPIN),
        "authorized_keys_line": str(farm / KEY_LINE),
        "selftest": str(farm / SELFTEST),
        "gitignore": str(ignore),
        "cloud_init": None,
        "overlay": str(plan.overlay),
    }
    _write(farm / WORKER_YML, worker_yml, 0o600)
    _write(farm / DROPIN, plan.dropin_text, 0o644)
    _write(farm / KEY_LINE, line + "\n", 0o644)
    selftest_values = dict(worker_values, script=_rel(farm / SELFTEST, cwd))
    selftest_values.pop("token")
    _write(farm / SELFTEST, render("door-selftest.sh.j2", **selftest_values), 0o755)
    if plan.cloud_init:
        worker_dir = WORKER_DIR.format(label=label)
        unit = render_unit(managed=CLOUD_UNIT_MANAGED.format(label=label), fdl_join_exec=CLOUD_FDL,
                           fdl_join_user=CLOUD_USER, fdl_join_workdir=worker_dir)
        text = render("cloud-init.yml.j2", label=label, door=shape.door, packages=_cloud_packages(shape.door),
                      worker_dir=worker_dir, private_key=cred.key.read_text().rstrip("\n"),
                      worker_yml=worker_yml.rstrip("\n"), service_user=CLOUD_USER, unit_name=CLOUD_UNIT,
                      unit=unit.rstrip("\n"))
        _write(farm / CLOUD_INIT, text, 0o600)
        files["cloud_init"] = str(farm / CLOUD_INIT)

    overlay = _overlay(plan, token, cwd)
    if overlay["action"] == "snippet":
        files["overlay_snippet"] = overlay["snippet"]
    if plan.inherit_from and overlay["action"] != "created":
        notes.append(f"inherit-from was not added to the existing {_rel(plan.overlay, cwd)} (fdl only edits its "
                     f"token line): add 'inherit-from: {plan.inherit_from}' yourself.")

    ak = _install(plan, cred, line, notes)
    steps, worker_steps = _steps(plan, cred, ak, cwd)
    credentials = {"action": cred_action, "fingerprint": cred.fingerprint, "key": str(cred.key),
                   "public_key": str(cred.public), "token": str(cred.token_file), "modes_fixed": modes_fixed}
    return FarmReport(label=label, door=shape.door, shape=shape, shape_from=plan.shape_from, farm_dir=farm,
                      files=files, credentials=credentials, overlay=overlay, authorized_keys=ak,
                      doctor=plan.findings, steps=steps, worker_steps=worker_steps, notes=notes)


def _install(plan: Plan, cred: creds_mod.Credentials, line: str, notes: list[str]) -> dict:
    if plan.shape.door == DOOR_A:
        return _install_jailed(plan, cred, notes)
    out: dict = {"path": plan.ak_path, "installed": False, "action": "not-installed", "line": None,
                 "permissions": [i.to_dict() for i in plan.perm_issues], "permissions_fixed": False,
                 "listening": None}
    if not plan.install:
        try:
            at = find_key(Path(plan.ak_path).read_bytes(), cred.identity)
        except OSError:
            at = None
        if at is not None:
            current = Path(plan.ak_path).read_bytes().split(b"\n")[at - 1].rstrip(b"\r") == line.encode()
            out.update(installed=True, action="already-present" if current else "outdated", line=at)
            if not current:
                notes.append(f"{plan.ak_path} line {at} carries the farm key with other options than this run "
                             f"composed (the door or its ports changed?): run again with --install-key to update it.")
        return out
    retire: tuple[KeyIdentity, ...] = ()
    if plan.existing is not None and plan.existing.identity != cred.identity:
        retire = (plan.existing.identity,)
    if plan.fix_perms:
        fix_permissions(plan.perm_issues)
        out["permissions_fixed"] = bool(plan.perm_issues)
    file_issue = next((i for i in plan.perm_issues if i.path == plan.ak_path), None)
    mode = 0o600 if plan.fix_perms or file_issue is None else None
    try:
        result = install_line(plan.ak_path, line, cred.identity, retire=retire, mode=mode,
                              create_parent=not plan.ak_explicit)
    except AuthorizedKeysError as exc:
        raise refusal(str(exc)) from None
    except PermissionError as exc:
        raise refusal(f"cannot write {plan.ak_path}: {exc.strerror}. The farm files were written; the key line "
                      f"was not installed.", hint="run as the account that owns the file") from None
    out.update(installed=True, action=result.action, line=result.line_number, removed_old=result.removed)
    try:
        with open(os.path.join(plan.farm_dir, INSTALLED), "a+", encoding="utf-8") as handle:
            handle.seek(0)
            if plan.ak_path not in handle.read().splitlines():
                handle.write(plan.ak_path + "\n")
    except OSError:
        pass
    listening, banner = probe_banner(plan.shape.host, plan.shape.door_port)
    out["listening"] = {"host": plan.shape.host, "port": plan.shape.door_port, "answering": listening,
                        "banner": banner}
    if not listening:
        where = " (on macOS: turn on Remote Login)" if plan.facts.macos else ""
        notes.append(f"nothing listens on {plan.shape.host}:{plan.shape.door_port} yet, where workers will dial: "
                     f"install the drop-in and reload sshd (the steps below){where}.")
    return out


def _install_jailed(plan: Plan, cred: creds_mod.Credentials, notes: list[str]) -> dict:
    cell = jail(plan.label, plan.shape.jail_base)
    out: dict = {"path": cell.authorized_keys, "installed": False, "action": "jailed", "line": None,
                 "permissions": [], "permissions_fixed": False, "listening": None, "removed_unconfined": None}
    if plan.unconfined_at is not None:
        try:
            result = remove_keys(plan.ak_path, (plan.existing.identity,) if plan.existing else ())
        except AuthorizedKeysError as exc:
            raise refusal(str(exc)) from None
        except PermissionError as exc:
            raise refusal(f"cannot write {plan.ak_path}: {exc.strerror}; the unconfined door-a line "
                          f"{plan.unconfined_at} is still there.", hint="remove that line yourself") from None
        out["removed_unconfined"] = {"path": plan.ak_path, "line": plan.unconfined_at, "removed": result.removed}
        notes.append(f"removed the farm key from {plan.ak_path} (line {plan.unconfined_at}): it let door-a workers "
                     f"log in as this account unconfined. Workers now log in as {cell.account}: give them the new "
                     f"worker.yml.")
    notes.append(f"door a's key line goes into {cell.authorized_keys}, the jailed account's own file (the setup "
                 f"steps install it; that needs root).")
    return out


def _jail_steps(plan: Plan, step: Callable[..., None], rel: Callable[[str], str]) -> None:
    """The privileged steps that build door a's jail (the wizard itself writes nothing outside the project)."""
    cell = jail(plan.label, plan.shape.jail_base)
    a = cell.account
    step(f"Create the door's own account {a} (no shell, no usable password; '*' rather than '!', which sshd "
         f"treats as a locked account when PAM is off)",
         f"{{ id -u {a} >/dev/null 2>&1 || sudo useradd --system --user-group --no-create-home --home-dir "
         f"{cell.home} --shell /usr/sbin/nologin {a}; }} && sudo usermod -p '*' {a}")
    step(f"Build the jail: {cell.root} and every directory above it root-owned and not writable by others "
         f"(sshd refuses a chroot otherwise), the key line in {a}'s own file",
         f"sudo install -d -o root -g root -m 0755 {cell.home} {cell.root} {cell.data} && "
         f"sudo install -d -o {a} -g {a} -m 0700 {cell.home}/.ssh && "
         f"sudo install -o {a} -g {a} -m 0600 {rel(KEY_LINE)} {cell.authorized_keys}")
    step(f"Bind the served directory {plan.shape.served} read-only into the jail (if you later replace that "
         f"directory by renaming another into its place, run this again)",
         f"mountpoint -q {cell.data} || {{ sudo mount --bind {plan.shape.served} {cell.data} && "
         f"sudo mount -o remount,bind,ro {cell.data}; }}")
    step("Keep the read-only bind across reboots",
         f"grep -qs ' {cell.data} ' /etc/fstab || echo '{plan.shape.served} {cell.data} none bind,ro 0 0' | "
         f"sudo tee -a /etc/fstab >/dev/null")


def _steps(plan: Plan, cred: creds_mod.Credentials, ak: dict, cwd: Path) -> tuple[list[dict], list[str]]:
    say = Spelling(plan.facts)
    farm = plan.farm_dir
    rel = lambda name: _rel(farm / name, cwd)  # noqa: E731 - a local spelling helper
    steps: list[dict] = []

    def step(title: str, command: str | None = None, done: bool = False) -> None:
        steps.append({"n": len(steps) + 1, "title": title, "command": command, "done": done})

    step("Review what the wizard wrote (nothing below repeats it: every command reads these files)",
         f"ls -l {_rel(farm, cwd)} && cat {rel(DROPIN)} {rel(KEY_LINE)}")
    for finding in plan.findings:
        if finding.status == ERROR and finding.hint and finding.name not in ("listener", "sshd -t"):
            step(f"Fix: {finding.message}", finding.hint)
    if plan.shape.door == DOOR_A:
        _jail_steps(plan, step, rel)
    step("Install the sshd drop-in", f"sudo install -m 0644 {rel(DROPIN)} {plan.dropin_target}")
    step("Check sshd's configuration, then reload it", f"{say.sshd_test()} && {say.reload()}")
    if plan.shape.door == DOOR_A:
        pass  # the key line went into the jailed account's file with the jail
    elif ak["installed"] and ak["action"] != "not-installed":
        step(f"Key line installed in {plan.ak_path} (line {ak['line']})", None, done=True)
    else:
        extra = f" --authorized-keys {plan.ak_path}" if plan.ak_explicit else ""
        step(f"Install the key line into {plan.ak_path} (re-running reuses the farm's key and token)",
             f"fdl join-config {plan.label} --install-key{extra}")
    for finding in plan.findings:
        if finding.name in ("firewall", "selinux") and finding.status != OK and finding.hint \
                and not any(s["command"] == finding.hint for s in steps):
            step(f"Let port {plan.shape.door_port} through: {finding.message}", finding.hint)
    step(f"Self-test the door (door {plan.shape.door}): it logs in with the farm key as a worker would",
         f"sh {rel(SELFTEST)}")

    worker_dir = WORKER_DIR.format(label=plan.label)
    worker = [f"copy {rel(WORKER_YML)} to {worker_dir}/fdl.yml and {rel('key')} to {worker_dir}/key (mode 0600) "
              f"on the worker, then run `fdl join` in {worker_dir}"]
    if plan.cloud_init:
        worker.append(f"or boot workers with {rel(CLOUD_INIT)} as their cloud-init user-data")
    else:
        worker.append("or add --cloud-init to get user-data that does this at boot")
    return steps, worker


def report_json(report: FarmReport) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False)


def ssh_keygen_available() -> bool:
    return shutil.which("ssh-keygen") is not None
