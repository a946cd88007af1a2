"""Decide: the questions about the farm's key file, answered once the person has read the doctor's findings.

Consent to install the key line (only --install-key or a yes at the prompt gives it; --yes does not), to
replace a rotated-out key, to fix permissions sshd would refuse; and door a's removal of an unconfined key
line. Writes nothing; may refuse. (Credentials found readable by others are refused when they are found,
by fdl.farm.credentials.vet: no consent makes them trustworthy.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fdl.farm.wizard.plan import Plan
from fdl.farm.wizard.shape import Prompter, Request, refusal
from fdl.hostside.farm.authorized_keys import PermissionIssue, check_permissions
from fdl.hostside.farm.doors import DOOR_A, JAIL_DATA, jail


@dataclass(frozen=True)
class Decisions:
    """What decide() chose; apply() carries it out."""

    install: bool = False  # install (or replace) the door's key line in plan.key_file
    fix_perms: bool = False
    perm_issues: tuple[PermissionIssue, ...] = ()
    unconfined_at: int | None = None  # door a: the key file's line where the farm key logs in unjailed
    notes: tuple[str, ...] = ()


def _decide_unconfined(plan: Plan, req: Request) -> int | None:
    """Door a: the key goes to the jailed account's file (a privileged step), never to the key file.

    A farm key found in the key file is an unconfined door a from before the jail: whoever holds it can read
    every file this account can. It is removed with consent (--install-key), else refused.
    """
    at = plan.key_file.find(plan.existing.identity) if plan.existing is not None else None
    if at is not None and not req.install_key:
        cell = jail(plan.label, plan.shape.jail_base)
        path = plan.key_file.path
        raise refusal(
            f"{path} line {at} lets the farm key of {plan.label} log in as this account, with an sftp "
            f"that is not confined to the served directory: any worker key holder can read every file this "
            f"account can (~/.ssh included). Door a now logs in as the jailed account {cell.account}; that "
            f"line must go.",
            hint=f"run again with --install-key to remove it (or delete line {at} of {path} yourself), "
                 f"then follow the setup steps; workers need the new worker.yml (user {cell.account}, path "
                 f"{JAIL_DATA})")
    return at


def _line_is_current(plan: Plan) -> bool:
    """True when the key file already holds exactly the line this run would install (reusing the key)."""
    if plan.existing is None or plan.rotate:
        return False
    return plan.key_file.holds(plan.existing.identity, plan.key_line(plan.existing.public_key))[1]


def _decide_install(plan: Plan, req: Request, prompter: Prompter | None,
                    notes: list[str]) -> bool:
    """Whether to install the key line (the notes say where a rotated-out key stays)."""
    path = plan.key_file.path
    old_at = plan.key_file.find(plan.existing.identity) if plan.rotate and plan.existing is not None else None
    person = req.asks(prompter)
    if req.install_key is not None:
        if old_at is not None and req.install_key is False:
            notes.append(f"--no-install-key: the old farm key stays in {path} (line {old_at}) and keeps letting "
                         f"workers that hold it in until you remove that line.")
        return req.install_key
    if _line_is_current(plan):
        return False  # the exact line is already in place: nothing to ask
    if old_at is not None:
        if person is None:
            raise refusal(
                f"rotating the farm's credentials leaves the old key installed in {path} (line {old_at}), "
                f"where it would keep letting old workers in. Replacing that line needs your consent, and --yes "
                f"does not give it.", hint="add --install-key, or remove the line yourself first")
        install = person.confirm(f"Replace the old farm key line in {path} (line {old_at}) with the new key?", True)
        if not install:
            notes.append(f"the old farm key stays in {path} (line {old_at}): workers holding it are still "
                         f"let in until you remove that line.")
        return install
    if person is not None:
        return person.confirm(f"Install the door's key line into {path}? (only fdl's own line is touched)",
                              False)
    notes.append(f"the key line was not installed into {path} (installing needs --install-key or a yes "
                 f"at the prompt; --yes does not count).")
    return False


def _key_file_owner(plan: Plan) -> int:
    """The account sshd judges the key file for: this one, or the owner of an explicitly named file."""
    if plan.key_file.explicit:
        for candidate in (plan.key_file.path, os.path.dirname(plan.key_file.path)):
            try:
                return os.stat(candidate).st_uid
            except OSError:
                continue  # not there yet: judge by its directory, else by this account
    return os.getuid()


def _decide_permissions(plan: Plan, req: Request, prompter: Prompter | None,
                        notes: list[str]) -> tuple[tuple[PermissionIssue, ...], bool]:
    """(what sshd would object to along the key file's path, fix it?)."""
    path, explicit = plan.key_file.path, plan.key_file.explicit
    parent = os.path.dirname(path)
    issues = check_permissions(path, uid=_key_file_owner(plan), manage_parent=not explicit,
                               home=str(Path.home()) if not explicit else None)
    if not os.path.isdir(parent):
        if explicit:
            raise refusal(f"the directory {parent} does not exist; with --authorized-keys fdl leaves that directory "
                          f"to you.", hint="create it with the owner and mode your sshd expects, then run again")
        notes.append(f"{parent} will be created, mode 0700.")
    unfixable = [i for i in issues if i.blocking and not i.fixable]
    if unfixable:
        lines = "; ".join(f"{i.path} is {i.problem} (fix: {i.command})" for i in unfixable)
        raise refusal(f"sshd would ignore the key line because of permissions this process cannot fix: {lines}.")
    fixable = [i for i in issues if i.fixable]
    if not fixable:
        return tuple(issues), False
    listing = "; ".join(f"{i.path} is {i.mode:04o}, {i.problem}: {i.command}" for i in fixable)
    blocking = any(i.blocking for i in fixable)
    person = req.asks(prompter)
    if person is not None:
        fix = person.confirm(f"Permissions: {listing}. Fix them?", True)
    elif req.assume_yes:
        fix = True
    elif blocking:
        raise refusal(f"permissions need fixing before sshd will read the key line ({listing}), and there is no "
                      f"terminal to confirm on.", hint="run those chmod commands, or add --yes to let the wizard "
                                                       "run them")
    else:
        fix = False
    if not fix and blocking:
        raise refusal(f"sshd would ignore the key line while these permissions stand: {listing}.",
                      hint="run the chmod commands shown, then run again")
    return tuple(issues), fix


def decide(plan: Plan, req: Request, prompter: Prompter | None = None) -> Decisions:
    """Take the key file's decisions (consent, permissions); writes nothing, may refuse."""
    if plan.shape.door == DOOR_A:
        return Decisions(unconfined_at=_decide_unconfined(plan, req))
    notes: list[str] = []
    install = _decide_install(plan, req, prompter, notes)
    issues: tuple[PermissionIssue, ...] = ()
    fix_perms = False
    if install:
        issues, fix_perms = _decide_permissions(plan, req, prompter, notes)
        if plan.facts.in_container:
            notes.append(f"this looks like a container: the key line goes into {plan.key_file.path} here, which "
                         f"only matters if the sshd workers dial reads it. Install it where that sshd lives (or name "
                         f"its key file with --authorized-keys, e.g. a bind-mounted directory).")
    return Decisions(install=install, fix_perms=fix_perms, perm_issues=issues, notes=tuple(notes))
