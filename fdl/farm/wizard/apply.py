"""Apply: the wizard's writes, each a small function, in the order apply() runs them.

The farm's own files (the farm directory, credentials, worker.yml, the review copies of the drop-in and the
key line, the self-test, cloud-init, the overlay, the privileged part's variables) are the project's: each
is written to a temp file, fsynced and renamed into place (fdl.hostside.fsio.atomic_write); files that hold the key
or the token are 0600. Outside the project only the key file is changed, only its farm lines, with the
consent decide() recorded, and not by this code: the fdl_join_door role does it (role.py), the same task an
Ansible user runs. The privileged part (drop-in, reload, door a's jail) is left to the operator's one
`ansible-playbook ... --become` line.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from fdl.farm import credentials as creds_mod
from fdl.farm.doctor import probe_banner
from fdl.farm.overlay import OverlayEditError, current_token, has_token, read_crate, rewrite_token
from fdl.farm.render import render, render_unit
from fdl.farm.wizard import role
from fdl.farm.wizard.decide import Decisions
from fdl.farm.wizard.plan import DROPIN, WORKER_YML, Plan
from fdl.farm.wizard.report import (
    AuthorizedKeysReport,
    CredentialAction,
    CredentialsReport,
    FarmReport,
    Files,
    KeyAction,
    Listening,
    OverlayAction,
    OverlayReport,
    Unconfined,
    spell_path,
)
from fdl.farm.wizard.steps import CLOUD_INIT, KEY_LINE, SELFTEST, WORKER_DIR, setup_steps, worker_steps
from fdl.hostside.farm.doors import DOOR_A, DOOR_B, DOOR_TUNNEL, JAIL_DATA, TITLES, jail
from fdl.hostside.fsio import atomic_write

SNIPPET, INSTALLED = "overlay-snippet.yml", "installed-at"
# cloud-init's unit: templates/fdl-join.service.j2 under the name the fdl_join_worker role gives it, running the
# fdl the image put on PATH, as the account the role creates.
CLOUD_UNIT = "flodl-join.service"
CLOUD_USER = "flodl"
CLOUD_FDL = "/usr/bin/env fdl"
CLOUD_UNIT_MANAGED = "Written by fdl join-config {label} --cloud-init (templates/fdl-join.service.j2)."


# --------------------------------------------------------------------------- the farm directory


def _secure_farm_dir(farm: Path, cwd: Path, notes: list[str]) -> Path:
    """The farm directory, 0700, with a .gitignore that keeps all of it out of git; returns that file."""
    farm.mkdir(parents=True, exist_ok=True, mode=0o700)
    before = stat.S_IMODE(os.stat(farm).st_mode)
    if before != 0o700:
        os.chmod(farm, 0o700)
        notes.append(f"changed the mode of {spell_path(farm, cwd)} from {before:04o} to 0700 (it holds the farm's "
                     f"key and token)")
    ignore = farm / ".gitignore"
    if not ignore.exists():
        atomic_write(ignore, "# written by fdl join-config: this folder holds the farm's private key and token\n*\n",
                     0o644)
    return ignore


def _settle_credentials(plan: Plan) -> tuple[creds_mod.Credentials, CredentialsReport]:
    """Reuse the farm's credentials (prepare() vetted them: this user minted them here), or mint new ones."""
    if plan.existing is not None and not plan.rotate:
        cred, action = plan.existing, CredentialAction.REUSED
    else:
        cred = creds_mod.mint(plan.farm_dir, plan.label)
        action = CredentialAction.ROTATED if plan.existing is not None else CredentialAction.CREATED
    return cred, CredentialsReport(action, cred.fingerprint, str(cred.key), str(cred.public), str(cred.token_file))


def _worker_values(plan: Plan, token: str) -> dict[str, Any]:
    """What the worker yml and the self-test are rendered from."""
    shape, label = plan.shape, plan.label
    return dict(label=label, door=shape.door, door_title=TITLES[shape.door],
                worker_key=WORKER_DIR.format(label=label) + "/key", served=shape.served, user=shape.user,
                host=shape.host, door_port=shape.door_port, controller_port=shape.controller_port, token=token,
                jail_data=JAIL_DATA, jail_base=shape.jail_base if shape.door == DOOR_A else None)


def _write_farm_files(plan: Plan, values: dict[str, Any], line: str, cwd: Path) -> str:
    """worker.yml (0600: it holds the token), the drop-in, the key line and the self-test; the worker yml's text."""
    farm = plan.farm_dir
    worker_yml = render("worker.yml.j2", **values)
    atomic_write(farm / WORKER_YML, worker_yml, 0o600)
    atomic_write(farm / DROPIN, plan.dropin_text, 0o644)
    atomic_write(farm / KEY_LINE, line + "\n", 0o644)
    selftest = {k: v for k, v in values.items() if k != "token"}
    atomic_write(farm / SELFTEST, render("door-selftest.sh.j2", **selftest, script=spell_path(farm / SELFTEST, cwd)),
                 0o755)
    return worker_yml


def _cloud_packages(door: str) -> list[str]:
    return ["openssh-client"] + (["rsync"] if door == DOOR_B else ["sshfs"] if door == DOOR_A else [])


def _write_cloud_init(plan: Plan, cred: creds_mod.Credentials, worker_yml: str) -> str:
    """User-data that makes a fresh worker a member of the farm (0600: it holds the key and the token)."""
    label = plan.label
    worker_dir = WORKER_DIR.format(label=label)
    unit = render_unit(managed=CLOUD_UNIT_MANAGED.format(label=label), fdl_join_exec=CLOUD_FDL,
                       fdl_join_user=CLOUD_USER, fdl_join_workdir=worker_dir)
    text = render("cloud-init.yml.j2", label=label, door=plan.shape.door, packages=_cloud_packages(plan.shape.door),
                  worker_dir=worker_dir, private_key=cred.key.read_text().rstrip("\n"),
                  worker_yml=worker_yml.rstrip("\n"), service_user=CLOUD_USER, unit_name=CLOUD_UNIT,
                  unit=unit.rstrip("\n"))
    path = plan.farm_dir / CLOUD_INIT
    atomic_write(path, text, 0o600)
    return str(path)


# --------------------------------------------------------------------------- the overlay


def _private(path: Path) -> str | None:
    """Make a file holding the token 0600; the old mode when it changed."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode == 0o600:
        return None
    os.chmod(path, 0o600)
    return f"{mode:04o}"


def _mode_note(changed: str | None) -> str:
    return f"; its mode changed from {changed} to 0600 (it holds the token)" if changed else ""


def _overlay_snippet(plan: Plan, values: dict[str, Any], cwd: Path, message: str) -> OverlayReport:
    """Leave the overlay as it is: write the snippet to paste beside the farm (0600), print it token left out."""
    snippet = plan.farm_dir / SNIPPET
    atomic_write(snippet, render("overlay.yml.j2", **values), 0o600)
    hidden = f"<the contents of {spell_path(plan.farm_dir / 'token', cwd)}>"
    return OverlayReport(str(plan.overlay), OverlayAction.SNIPPET, message, snippet=str(snippet),
                         snippet_text=render("overlay.yml.j2", **dict(values, token=hidden)))


def _write_overlay(plan: Plan, token: str, cwd: Path) -> OverlayReport:
    """Create fdl.LABEL.yml, or rewrite only its token line, or leave it alone and write a snippet beside it."""
    crate = read_crate(plan.root)
    values = dict(label=plan.label, inherit_from=plan.inherit_from, host=plan.shape.host,
                  controller_port=plan.shape.controller_port, tunnel=plan.shape.door == DOOR_TUNNEL, token=token,
                  crate=crate)
    path, shown = str(plan.overlay), spell_path(plan.overlay, cwd)
    if not plan.overlay.exists():
        atomic_write(plan.overlay, render("overlay.yml.j2", **values), 0o600)
        return OverlayReport(path, OverlayAction.CREATED, f"{shown} created" + (
            f" with command '{crate.name}' (cluster: true)" if crate else
            " (commands: left as a commented placeholder)"), command=crate.name if crate else None)
    data = plan.overlay.read_bytes()
    snippet = spell_path(plan.farm_dir / SNIPPET, cwd)
    if not has_token(data):
        return _overlay_snippet(plan, values, cwd, f"{shown} has no token line, so fdl leaves it as you wrote it; "
                                                   f"paste what you need from {snippet} (the same snippet with the "
                                                   f"token in it)")
    if current_token(data) == token:
        changed = _private(plan.overlay)
        return OverlayReport(path, OverlayAction.UNCHANGED, f"{shown} already holds the farm's token"
                             + _mode_note(changed), mode_changed=changed)
    try:
        new = rewrite_token(data, token)
    except OverlayEditError as exc:
        return _overlay_snippet(plan, values, cwd, f"{shown} was left alone ({exc}); set its token from {snippet}")
    assert new is not None, "has_token() found a token line to rewrite"
    mode = stat.S_IMODE(plan.overlay.stat().st_mode)
    atomic_write(plan.overlay, new, 0o600)  # it holds the token: never readable by others
    changed = f"{mode:04o}" if mode != 0o600 else None
    return OverlayReport(path, OverlayAction.TOKEN_REWRITTEN, f"{shown}: only its token line was rewritten"
                         + _mode_note(changed), mode_changed=changed)


# --------------------------------------------------------------------------- the key file


def _key_already_there(plan: Plan, cred: creds_mod.Credentials, line: str, notes: list[str]) -> AuthorizedKeysReport:
    """Not asked to install: say whether the farm key is there, and whether its line is this run's."""
    path = plan.key_file.path
    at, current = plan.key_file.holds(cred.identity, line)
    if at is None:
        return AuthorizedKeysReport(path, KeyAction.NOT_INSTALLED, installed=False)
    if not current:
        notes.append(f"{path} line {at} carries the farm key with other options than this run composed (the door "
                     f"or its ports changed?): run again with --install-key to update it.")
    return AuthorizedKeysReport(path, KeyAction.ALREADY_PRESENT if current else KeyAction.OUTDATED,
                                installed=True, line=at)


def _record_installed(plan: Plan, notes: list[str]) -> None:
    """Remember in the farm directory which key files carry the farm's line (for the one who cleans up)."""
    record = plan.farm_dir / INSTALLED
    try:
        with open(record, "a+", encoding="utf-8") as handle:
            handle.seek(0)
            if plan.key_file.path not in handle.read().splitlines():
                handle.write(plan.key_file.path + "\n")
    except OSError as exc:
        notes.append(f"the key line is installed, but {record} could not record where ({exc.strerror}): "
                     f"remember {plan.key_file.path} yourself if you retire this farm.")


def _listening(plan: Plan, notes: list[str]) -> Listening:
    host, port = plan.shape.host, plan.shape.door_port
    answering, banner = probe_banner(host, port)
    if not answering:
        where = " (on macOS: turn on Remote Login)" if plan.facts.macos else ""
        notes.append(f"nothing listens on {host}:{port} yet, where workers will dial: install the drop-in and "
                     f"reload sshd (the steps below){where}.")
    return Listening(host, port, answering, banner)


def _rotated_out(plan: Plan, cred: creds_mod.Credentials) -> tuple[str, ...]:
    """The public key this run rotated out, if any: the role takes its lines out too."""
    if plan.existing is not None and plan.existing.identity != cred.identity:
        return (plan.existing.public_key,)
    return ()


def _install_key(plan: Plan, decisions: Decisions, cred: creds_mod.Credentials, line: str,
                 notes: list[str]) -> AuthorizedKeysReport:
    """Put the door's line into the key file (doors b and tunnel-only), retiring a rotated-out key: the
    fdl_join_door role's key line part, run here as this account."""
    if not decisions.install:
        return _key_already_there(plan, cred, line, notes)
    path, issues = plan.key_file.path, decisions.perm_issues
    file_issue = any(i.path == path for i in issues)
    answer = role.install_key(plan, cred.public_key, _rotated_out(plan, cred), fix_permissions=decisions.fix_perms,
                              keep_mode=file_issue and not decisions.fix_perms)
    _record_installed(plan, notes)
    return AuthorizedKeysReport(path, KeyAction(answer["action"]), installed=True,
                                line=int(answer.get("line_number") or 0) or None, permissions=issues,
                                permissions_fixed=decisions.fix_perms and bool(issues),
                                listening=_listening(plan, notes), removed_old=int(answer.get("removed") or 0))


def _install_jailed(plan: Plan, decisions: Decisions, cred: creds_mod.Credentials,
                    notes: list[str]) -> AuthorizedKeysReport:
    """Door a: take an unconfined farm key out of the key file (the role's key line part, with consent); the
    jailed account's own file is the privileged part's."""
    cell = jail(plan.label, plan.shape.jail_base)
    removed = None
    at = decisions.unconfined_at
    if at is not None and plan.existing is not None:
        path = plan.key_file.path
        answer = role.install_key(plan, cred.public_key, _rotated_out(plan, cred), fix_permissions=False,
                                  keep_mode=True)
        removed = Unconfined(path, at, int(answer.get("removed") or 0))
        notes.append(f"removed the farm key from {path} (line {at}): it let door-a workers log in as this account "
                     f"unconfined. Workers now log in as {cell.account}: give them the new worker.yml.")
    notes.append(f"door a's key line goes into {cell.authorized_keys}, the jailed account's own file (the "
                 f"privileged step installs it; that needs root).")
    return AuthorizedKeysReport(cell.authorized_keys, KeyAction.JAILED, installed=False, removed_unconfined=removed)


# --------------------------------------------------------------------------- all of it


def apply(plan: Plan, decisions: Decisions, cwd: Path | None = None) -> FarmReport:
    """Write the farm. Call only with a Plan from prepare() and the Decisions decide() took on it."""
    cwd = cwd or Path.cwd()
    farm, label = plan.farm_dir, plan.label
    notes = [*plan.notes, *decisions.notes]
    ignore = _secure_farm_dir(farm, cwd, notes)
    cred, credentials = _settle_credentials(plan)
    token = cred.token()
    line = plan.key_line(cred.public_key)
    worker_yml = _write_farm_files(plan, _worker_values(plan, token), line, cwd)
    cloud_init = _write_cloud_init(plan, cred, worker_yml) if plan.cloud_init else None
    overlay = _write_overlay(plan, token, cwd)
    if plan.inherit_from and overlay.action != OverlayAction.CREATED:
        notes.append(f"inherit-from was not added to the existing {spell_path(plan.overlay, cwd)} (fdl only edits "
                     f"its token line): add 'inherit-from: {plan.inherit_from}' yourself.")
    rotated = _rotated_out(plan, cred)
    door_vars = role.write_privileged_vars(plan, cred.public_key, rotated[0] if rotated else None, cwd)
    if plan.shape.door == DOOR_A:
        ak = _install_jailed(plan, decisions, cred, notes)
    else:
        ak = _install_key(plan, decisions, cred, line, notes)
    files = Files(farm_dir=str(farm), key=str(cred.key), public_key=str(cred.public), token=str(cred.token_file),
                  worker_yml=str(farm / WORKER_YML), dropin=str(farm / DROPIN),
                  authorized_keys_line=str(farm / KEY_LINE), selftest=str(farm / SELFTEST), gitignore=str(ignore),
                  overlay=str(plan.overlay), join_door_vars=str(door_vars), cloud_init=cloud_init,
                  overlay_snippet=overlay.snippet)
    return FarmReport(label=label, shape=plan.shape, shape_from=plan.shape_from, farm_dir=farm, files=files,
                      credentials=credentials, overlay=overlay, authorized_keys=ak, doctor=plan.findings,
                      steps=setup_steps(plan, ak, cwd), worker_steps=worker_steps(plan, cwd), notes=tuple(notes))
