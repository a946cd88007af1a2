"""Apply: the wizard's writes, each a small function, in the order apply() runs them.

The farm's files are rendered by Ansible first, before anything of the farm is replaced: the roles' render
entry points and fdl's project templates, in one local playbook run (fdl.farm.render), into a private
directory, with the credentials the farm will have (new ones are made beside it and not yet in place). Every
rendered file is read back and checked (fdl.farm.readback); a render that lost or changed a key stops the
wizard there, exit 1, with nothing written. Then the credentials go into place and the files are written,
each to a temp file, fsynced and renamed (fdl.hostside.fsio.atomic_write); files that hold the key or the
token are 0600. Outside the project only the key file is changed, only its farm lines, with the consent
decide() recorded, and not by this code: the fdl_join_door role does it (role.py), the same task an Ansible
user runs. The privileged part (drop-in, reload, door a's jail) is left to the operator's one
`ansible-playbook ... --become` line.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from fdl.config.tokens import tracked_by_git
from fdl.farm import credentials as creds_mod
from fdl.farm.doctor import probe_banner
from fdl.farm.overlay import OverlayEditError, has_token, point_at_token_file, read_crate, token_files
from fdl.farm.render import Rendered
from fdl.farm.wizard import role
from fdl.farm.wizard.decide import Decisions
from fdl.farm.wizard.files import Pending, check_rendered, overlay_token_file, render_farm
from fdl.farm.wizard.plan import DROPIN, FARM_ROOT, WORKER_YML, Plan
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
from fdl.farm.wizard.steps import CLOUD_INIT, KEY_LINE, KNOWN_HOSTS, SELFTEST, setup_steps, worker_steps
from fdl.hostside.farm.doors import DOOR_A, jail
from fdl.hostside.fsio import atomic_write

SNIPPET, INSTALLED = "overlay-snippet.yml", "installed-at"
_IGNORE_ALL = "# written by fdl join-config: {what}\n*\n"


# --------------------------------------------------------------------------- the farm directory


def _secure_farm_dir(farm: Path, cwd: Path, notes: list[str]) -> Path:
    """The farm directory, 0700, with a .gitignore that keeps all of it out of git (and one for .fdl/ as a
    whole: every farm's token lives below it); returns the farm's."""
    farm.mkdir(parents=True, exist_ok=True, mode=0o700)
    before = stat.S_IMODE(os.stat(farm).st_mode)
    if before != 0o700:
        os.chmod(farm, 0o700)
        notes.append(f"changed the mode of {spell_path(farm, cwd)} from {before:04o} to 0700 (it holds the farm's "
                     f"key and token)")
    top = farm.parent / ".gitignore"
    if farm.parent.name == FARM_ROOT and not top.exists():
        atomic_write(top, _IGNORE_ALL.format(what="every farm's private key and token live below this folder"),
                     0o644)
    ignore = farm / ".gitignore"
    if not ignore.exists():
        atomic_write(ignore, _IGNORE_ALL.format(what="this folder holds the farm's private key and token"), 0o644)
    return ignore


def _pending_credentials(plan: Plan) -> Pending:
    if plan.existing is not None and not plan.rotate:
        return Pending(plan.existing.key, plan.existing.public_key, plan.existing.token(), None)
    staged = creds_mod.stage(plan.farm_dir, plan.label)
    return Pending(staged.key, staged.public_key, staged.token, staged)


def _settle_credentials(plan: Plan, pending: Pending) -> tuple[creds_mod.Credentials, CredentialsReport]:
    """Put new credentials in place (recorded as this user's own first), or keep the vetted ones."""
    if pending.staged is None:
        assert plan.existing is not None
        cred, action = plan.existing, CredentialAction.REUSED
    else:
        cred = pending.staged.commit()
        action = CredentialAction.ROTATED if plan.existing is not None else CredentialAction.CREATED
    return cred, CredentialsReport(action, cred.fingerprint, str(cred.key), str(cred.public), str(cred.token_file))


# --------------------------------------------------------------------------- the farm's files


def _write_farm_files(plan: Plan, done: Rendered, line: str) -> str | None:
    """worker.yml, known_hosts, the drop-in, the key line, the self-test and cloud-init (0600: key and token);
    cloud-init.yml's path when written."""
    farm = plan.farm_dir
    assert done.worker_yml is not None and done.dropin is not None and done.selftest is not None
    atomic_write(farm / WORKER_YML, done.worker_yml, 0o600)
    if done.known_hosts is not None and plan.host_keys:
        atomic_write(farm / KNOWN_HOSTS, done.known_hosts, 0o644)
    atomic_write(farm / DROPIN, done.dropin, 0o644)
    atomic_write(farm / KEY_LINE, line + "\n", 0o644)
    atomic_write(farm / SELFTEST, done.selftest, 0o755)
    if not plan.cloud_init or done.cloud_init is None:
        return None
    atomic_write(farm / CLOUD_INIT, done.cloud_init, 0o600)
    return str(farm / CLOUD_INIT)


# --------------------------------------------------------------------------- the overlay


def _overlay_snippet(plan: Plan, done: Rendered, cwd: Path, message: str) -> OverlayReport:
    """Leave the overlay as it is: write the snippet to paste beside the farm (it holds no secret)."""
    assert done.overlay is not None
    snippet = plan.farm_dir / SNIPPET
    atomic_write(snippet, done.overlay, 0o644)
    return OverlayReport(str(plan.overlay), OverlayAction.SNIPPET, message, snippet=str(snippet),
                         snippet_text=done.overlay)


def _write_overlay(plan: Plan, done: Rendered, cwd: Path, notes: list[str]) -> OverlayReport:
    """Create fdl.LABEL.yml; move an old overlay's literal token onto the token file; or leave it alone (and
    write a snippet beside it when it names no token at all)."""
    crate = read_crate(plan.root)
    path, shown = str(plan.overlay), spell_path(plan.overlay, cwd)
    token_file = overlay_token_file(plan)
    if not plan.overlay.exists():
        assert done.overlay is not None
        atomic_write(plan.overlay, done.overlay, 0o644)
        return OverlayReport(path, OverlayAction.CREATED, f"{shown} created" + (
            f" with command '{crate.name}' (cluster: true)" if crate else
            " (commands: left as a commented placeholder)"), command=crate.name if crate else None)
    data = plan.overlay.read_bytes()
    snippet = spell_path(plan.farm_dir / SNIPPET, cwd)
    if not has_token(data):
        return _overlay_snippet(plan, done, cwd, f"{shown} names no token, so fdl leaves it as you wrote it; "
                                                 f"paste what you need from {snippet}")
    try:
        new = point_at_token_file(data, token_file)
    except OverlayEditError as exc:
        return _overlay_snippet(plan, done, cwd, f"{shown} was left alone ({exc}); set token_file: "
                                                 f"{token_file} from {snippet}")
    if new is None:
        named = token_files(data.decode("utf-8", "replace"))
        ours = all(os.path.normpath(plan.overlay.parent / n) == os.path.normpath(plan.farm_dir / "token")
                   for n in named)
        if ours:
            return OverlayReport(path, OverlayAction.UNCHANGED, f"{shown} already names the farm's token file")
        return OverlayReport(path, OverlayAction.UNCHANGED, f"{shown} names another token file "
                             f"({', '.join(named)}), so fdl leaves it as you wrote it: the farm's token is in "
                             f"{token_file}")
    was_tracked = tracked_by_git(plan.overlay)
    mode = stat.S_IMODE(plan.overlay.stat().st_mode)
    atomic_write(plan.overlay, new, mode)
    if was_tracked or mode & 0o044:
        notes.append(f"{shown} held the token itself and {'git tracks it' if was_tracked else 'others could read it'}"
                     f": the old token may be known outside this box. Rotate it: fdl join-config {plan.label} "
                     f"--regen.")
    return OverlayReport(path, OverlayAction.TOKEN_REWRITTEN, f"{shown}: its token: line now names the farm's "
                         f"token file (token_file: {token_file}); the overlay holds no secret any more")


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
    pending = _pending_credentials(plan)
    directory = Path(tempfile.mkdtemp(prefix=".render-", dir=farm))  # 0700
    try:
        done = render_farm(plan, pending, cwd, directory)
        check_rendered(plan, pending, done)
        cred, credentials = _settle_credentials(plan, pending)
        line = plan.key_line(cred.public_key)
        cloud_init = _write_farm_files(plan, done, line)
        overlay = _write_overlay(plan, done, cwd, notes)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if pending.staged is not None:
            pending.staged.discard()
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
                  overlay_snippet=overlay.snippet,
                  known_hosts=str(farm / KNOWN_HOSTS) if plan.host_keys else None)
    return FarmReport(label=label, shape=plan.shape, shape_from=plan.shape_from, farm_dir=farm, files=files,
                      credentials=credentials, overlay=overlay, authorized_keys=ak, doctor=plan.findings,
                      steps=setup_steps(plan, ak, cwd), worker_steps=worker_steps(plan, cwd), notes=tuple(notes))
