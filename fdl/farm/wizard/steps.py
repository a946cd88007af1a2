"""The setup steps the report lists: what a person runs on the controller box, and on each worker.

Composed from the plan and what apply() did. The wizard changes nothing under /etc/ssh and builds no jail:
the privileged part of the door (door a's account and jail, the drop-in, the reload) is one step, the
`ansible-playbook ... --become` line that runs the fdl_join_door role with the variables the wizard wrote
(role.py), so what the operator reviews and runs is the role an Ansible user runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fdl.farm.wizard.plan import DROPIN, WORKER_YML, Plan
from fdl.farm.wizard.report import AuthorizedKeysReport, KeyAction, Step, spell_path
from fdl.farm.wizard.role import VARS_FILE, privileged_command
from fdl.hostside.checks.report import ERROR, OK
from fdl.hostside.farm.doors import DOOR_A, jail

KEY_LINE, CLOUD_INIT, SELFTEST, KNOWN_HOSTS = "authorized_keys.line", "cloud-init.yml", "door-selftest.sh", \
    "known_hosts"
WORKER_DIR = "/etc/fdl/{label}"  # where the setup steps and cloud-init put a worker's copy


class _Steps:
    """Numbered steps, each command at most once."""

    def __init__(self) -> None:
        self.items: list[Step] = []

    def add(self, title: str, command: str | None = None, done: bool = False) -> None:
        self.items.append(Step(len(self.items) + 1, title, command, done))

    def has(self, command: str) -> bool:
        return any(s.command == command for s in self.items)


def _in_farm(plan: Plan, cwd: Path) -> Callable[[str], str]:
    """How a file of the farm directory is spelled in the steps."""

    def rel(name: str) -> str:
        return spell_path(plan.farm_dir / name, cwd)

    return rel


def _privileged_step(plan: Plan, steps: _Steps, rel: Callable[[str], str], cwd: Path) -> None:
    """The privileged part as one line: the fdl_join_door role, this box, as root."""
    what = "the sshd drop-in (checked with sshd -t inside this box's whole configuration before it goes live), " \
           "then sshd reloaded"
    if plan.shape.door == DOOR_A:
        cell = jail(plan.label, plan.shape.jail_base)
        what = (f"the door's own account {cell.account} (no shell, no usable password), its jail {cell.root} with "
                f"{plan.shape.served} bound read-only at {cell.data} (and in /etc/fstab), its key line in "
                f"{cell.authorized_keys}, " + what)
    steps.add(f"Apply the privileged part with the fdl_join_door role, as root: {what} (the variables are in "
              f"{rel(VARS_FILE)}; add --ask-become-pass if sudo asks for your password)",
              privileged_command(plan, cwd))


def _key_step(plan: Plan, ak: AuthorizedKeysReport, steps: _Steps) -> None:
    if plan.shape.door == DOOR_A:
        return  # the key line went into the jailed account's file with the jail
    path = plan.key_file.path
    if ak.installed and ak.action != KeyAction.NOT_INSTALLED:
        steps.add(f"Key line installed in {path} (line {ak.line})", None, done=True)
    else:
        extra = f" --authorized-keys {path}" if plan.key_file.explicit else ""
        steps.add(f"Install the key line into {path} (re-running reuses the farm's key and token)",
                  f"fdl join-config {plan.label} --install-key{extra}")


def setup_steps(plan: Plan, ak: AuthorizedKeysReport, cwd: Path) -> tuple[Step, ...]:
    """The steps on the controller box, in the order to run them."""
    rel = _in_farm(plan, cwd)
    steps = _Steps()
    steps.add("Review what the wizard wrote (nothing below repeats it: every command reads these files)",
              f"ls -l {spell_path(plan.farm_dir, cwd)} && cat {rel(DROPIN)} {rel(KEY_LINE)} {rel(VARS_FILE)}")
    for finding in plan.findings:
        if finding.status == ERROR and finding.hint and finding.name != "listener":
            steps.add(f"Fix: {finding.message}", finding.hint)
    _privileged_step(plan, steps, rel, cwd)
    _key_step(plan, ak, steps)
    for finding in plan.findings:
        if finding.name in ("firewall", "selinux") and finding.status != OK and finding.hint \
                and not steps.has(finding.hint):
            steps.add(f"Let port {plan.shape.door_port} through: {finding.message}", finding.hint)
    steps.add(f"Self-test the door (door {plan.shape.door}): it logs in with the farm key as a worker would",
              f"sh {rel(SELFTEST)}")
    return tuple(steps.items)


def worker_steps(plan: Plan, cwd: Path) -> tuple[str, ...]:
    """What to do on each worker."""
    rel = _in_farm(plan, cwd)
    worker_dir = WORKER_DIR.format(label=plan.label)
    pinned = f", {rel(KNOWN_HOSTS)} to {worker_dir}/known_hosts" if plan.host_keys else ""
    first = (f"copy {rel(WORKER_YML)} to {worker_dir}/fdl.yml, {rel('key')} to {worker_dir}/key and {rel('token')} "
             f"to {worker_dir}/token (both mode 0600, owned by the account that runs fdl join){pinned} on the "
             f"worker, then run `fdl join` in {worker_dir}")
    if plan.cloud_init:
        return first, f"or boot workers with {rel(CLOUD_INIT)} as their cloud-init user-data"
    return first, "or add --cloud-init to get user-data that does this at boot"
