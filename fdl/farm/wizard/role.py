"""The wizard's changes to this box, applied by the fdl_join_door role: one implementation, two callers.

The wizard decides and asks; Ansible changes the host. Every change `fdl join-config` makes outside the
project is a task of the role `flodl.fdl.fdl_join_door` (playbook `flodl.fdl.join_door`), the same tasks
an Ansible user runs:

- the key line part (fdl_join_door_install_key): the door's line in the invoking account's key file, or
  door a's unjailed farm key taken out of it. The wizard runs it itself, only with the consent decide()
  recorded, through fdl.cluster.runner: ansible-playbook on this box, local connection, as this account;
- the privileged part (fdl_join_door_privileged): the sshd drop-in, checked with sshd -t inside the box's
  whole configuration before it goes live, sshd's reload, and door a's account, jail, read-only bind and
  key line. The wizard never runs it: it writes the role's variables to `.fdl/LABEL/join-door.yml` and the
  report prints one `ansible-playbook ... --become` line for the operator to review and run. Nothing under
  /etc/ssh changes until the operator does.

The farm's own files (key pair, token, worker.yml, the overlay, the review copies of the drop-in and the key
line) are the project's files, not changes to the host: apply.py writes them natively with fdl.hostside.fsio.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from fdl.farm.doctor import Spelling
from fdl.farm.render import DROPIN_MANAGED
from fdl.farm.wizard.plan import Plan
from fdl.farm.wizard.report import spell_path
from fdl.farm.wizard.shape import refusal
from fdl.hostside.farm.authorized_keys import AuthorizedKeysError, parse_public_key
from fdl.hostside.farm.doors import DOOR_TUNNEL
from fdl.hostside.fsio import atomic_write

VARS_FILE = "join-door.yml"
PLAYBOOK = "join_door.yml"
PLAYBOOK_FQCN = "flodl.fdl.join_door"
KEY_MODULE = "flodl.fdl.fdl_authorized_key"
_HEADER = """\
# The fdl_join_door role's variables for farm {label} on this box, written by `fdl join-config {label}`.
# They drive the privileged part of the door (the sshd drop-in, checked with sshd -t inside this box's whole
# configuration before it goes live, sshd's reload{jail}). Review them, then run the line the report prints:
#   {command}
# {own}
"""
_OWN_FILE = ("Your own authorized_keys is not part of it: `fdl join-config {label} --install-key` edits it as you, "
             "never as root.")


def door_vars(plan: Plan, public_key: str, retired: tuple[str, ...]) -> dict[str, Any]:
    """The role's variables that describe this farm's door (both parts read them)."""
    shape = plan.shape
    return {
        "fdl_join_door_label": plan.label,
        "fdl_join_door_door": shape.door,
        "fdl_join_door_port": shape.door_port,
        "fdl_join_door_controller_port": shape.controller_port,
        "fdl_join_door_served": "" if shape.door == DOOR_TUNNEL else (shape.served or ""),
        "fdl_join_door_public_key": public_key.strip(),
        "fdl_join_door_retired_keys": list(retired),
        "fdl_join_door_rrsync": plan.rrsync,
    }


# --------------------------------------------------------------------------- the key line part, run here


def install_key(plan: Plan, public_key: str, retired: tuple[str, ...], *, fix_permissions: bool,
                keep_mode: bool) -> dict[str, Any]:
    """Run the role's key line part on this box as this account; the fdl_authorized_key module's answer
    (action, line_number, removed). A refusal when the role could not do it."""
    variables = {
        **door_vars(plan, public_key, retired),
        "fdl_join_door_install_key": True,
        "fdl_join_door_privileged": False,
        "fdl_join_door_authorized_keys": plan.key_file.path,
        "fdl_join_door_authorized_keys_create_parent": not plan.key_file.explicit,
        "fdl_join_door_authorized_keys_mode": "" if keep_mode else "0600",
        "fdl_join_door_authorized_keys_fix_permissions": fix_permissions,
    }
    return _run(variables, plan.key_file.path)


def _run(variables: dict[str, Any], path: str) -> dict[str, Any]:
    from fdl.cluster.events import OK, RunnerEvent
    from fdl.cluster.inventory import local_inventory
    from fdl.cluster.runner import run_playbook

    answers: list[dict[str, Any]] = []

    def on_event(event: RunnerEvent) -> None:
        data = event.raw.get("event_data") or {}
        if event.kind == "on_ok" and data.get("resolved_action") == KEY_MODULE and event.res is not None:
            answers.append(event.res)

    result = run_playbook(PLAYBOOK, local_inventory(), extravars=variables, on_event=on_event, progress=False,
                          title="join-door")
    host = next(iter(result.hosts.values()))
    if host.status != OK or not answers:
        failed = next((t for t in reversed(host.tasks) if t.status not in (OK, "skipped")), None)
        errno = (failed.res or {}).get("errno") if failed is not None else None
        why = host.message or (failed.task if failed is not None else host.status)
        raise refusal(f"the fdl_join_door role did not change {path}: {why}. The farm files were written; the key "
                      f"file was left as it was.",
                      hint="run as the account that owns the file" if errno == 13 else None)
    return answers[-1]


# --------------------------------------------------------------------------- the privileged part, printed


def _carried_retired(path: Path, current: str) -> list[str]:
    """Keys an earlier run asked the privileged part to retire and that it may not have run for yet."""
    try:
        earlier = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return []
    if not isinstance(earlier, dict) or not isinstance(earlier.get("fdl_join_door_retired_keys"), list):
        return []
    keep = []
    for key in earlier["fdl_join_door_retired_keys"]:
        try:
            if isinstance(key, str) and parse_public_key(key) != parse_public_key(current):
                keep.append(key.strip())
        except AuthorizedKeysError:
            continue
    return keep


def privileged_vars(plan: Plan, public_key: str, rotated_out: str | None) -> dict[str, Any]:
    """Everything the privileged part needs on this box: the door, where sshd lives, how it is reloaded."""
    path = plan.farm_dir / VARS_FILE
    retired = _carried_retired(path, public_key)
    if rotated_out and rotated_out.strip() not in retired:
        retired.append(rotated_out.strip())
    say = Spelling(plan.facts)
    reload = say.reload_command()
    variables: dict[str, Any] = {
        # how Ansible runs here: this box, fdl's own Python (never a discovered interpreter)
        "ansible_python_interpreter": sys.executable,
        **door_vars(plan, public_key, tuple(retired)),
        "fdl_join_door_install_key": False,
        "fdl_join_door_privileged": True,
        "fdl_join_door_jail_base": plan.shape.jail_base,
        "fdl_join_door_sshd_config": plan.sshd_config,
        "fdl_join_door_sshd_config_dir": str(Path(plan.dropin_target).parent),
        "fdl_join_door_sshd_binary": plan.facts.sshd_path or "/usr/sbin/sshd",
        "fdl_join_door_managed": DROPIN_MANAGED,
    }
    if reload is None:
        variables["fdl_join_door_sshd_service"] = say.service
    else:
        variables["fdl_join_door_reload_command"] = reload
    return variables


def write_privileged_vars(plan: Plan, public_key: str, rotated_out: str | None, cwd: Path) -> Path:
    """`.fdl/LABEL/join-door.yml`: the privileged part's variables, commented for review."""
    path = plan.farm_dir / VARS_FILE
    variables = privileged_vars(plan, public_key, rotated_out)
    header = _HEADER.format(label=plan.label, command=privileged_command(plan, cwd),
                            jail=", door a's account, jail, read-only bind and key line" if plan.shape.door == "a"
                            else "", own=_OWN_FILE.format(label=plan.label))
    atomic_write(path, header + yaml.safe_dump(variables, sort_keys=False, width=1000), 0o644)
    return path


def privileged_command(plan: Plan, cwd: Path) -> str:
    """The one line that applies the privileged part: fdl's own ansible-playbook and collection, this box."""
    from fdl.cluster.connection import ansible_bin_dir
    from fdl.resources import collections_path

    playbook = ansible_bin_dir() / "ansible-playbook"
    variables = spell_path(plan.farm_dir / VARS_FILE, cwd)
    return (f"ANSIBLE_COLLECTIONS_PATH={shlex.quote(str(collections_path()))} {shlex.quote(str(playbook))} "
            f"-i localhost, -c local {PLAYBOOK_FQCN} -e @{shlex.quote(variables)} --become")
