"""The setup steps the report lists: what a person runs on the controller box, and on each worker.

Pure: composed from the plan and what apply() did. The wizard itself writes nothing outside the project;
every privileged change (the jail, the drop-in, the reload) is a step with its exact command.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fdl.checks.report import ERROR, OK
from fdl.farm.doctor import Spelling
from fdl.farm.doors import DOOR_A, jail
from fdl.farm.wizard.plan import DROPIN, WORKER_YML, Plan
from fdl.farm.wizard.report import AuthorizedKeysReport, KeyAction, Step, spell_path

KEY_LINE, CLOUD_INIT, SELFTEST = "authorized_keys.line", "cloud-init.yml", "door-selftest.sh"
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


def _jail_steps(plan: Plan, steps: _Steps, rel: Callable[[str], str]) -> None:
    """The privileged steps that build door a's jail."""
    cell = jail(plan.label, plan.shape.jail_base)
    a, served = cell.account, plan.shape.served
    steps.add(f"Create the door's own account {a} (no shell, no usable password; '*' rather than '!', which sshd "
              f"treats as a locked account when PAM is off)",
              f"{{ id -u {a} >/dev/null 2>&1 || sudo useradd --system --user-group --no-create-home --home-dir "
              f"{cell.home} --shell /usr/sbin/nologin {a}; }} && sudo usermod -p '*' {a}")
    steps.add(f"Build the jail: {cell.root} and every directory above it root-owned and not writable by others "
              f"(sshd refuses a chroot otherwise), the key line in {a}'s own file",
              f"sudo install -d -o root -g root -m 0755 {cell.home} {cell.root} {cell.data} && "
              f"sudo install -d -o {a} -g {a} -m 0700 {cell.home}/.ssh && "
              f"sudo install -o {a} -g {a} -m 0600 {rel(KEY_LINE)} {cell.authorized_keys}")
    steps.add(f"Bind the served directory {served} read-only into the jail (if you later replace that "
              f"directory by renaming another into its place, run this again)",
              f"mountpoint -q {cell.data} || {{ sudo mount --bind {served} {cell.data} && "
              f"sudo mount -o remount,bind,ro {cell.data}; }}")
    steps.add("Keep the read-only bind across reboots",
              f"grep -qs ' {cell.data} ' /etc/fstab || echo '{served} {cell.data} none bind,ro 0 0' | "
              f"sudo tee -a /etc/fstab >/dev/null")


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
    say = Spelling(plan.facts)
    rel = _in_farm(plan, cwd)
    steps = _Steps()
    steps.add("Review what the wizard wrote (nothing below repeats it: every command reads these files)",
              f"ls -l {spell_path(plan.farm_dir, cwd)} && cat {rel(DROPIN)} {rel(KEY_LINE)}")
    for finding in plan.findings:
        if finding.status == ERROR and finding.hint and finding.name not in ("listener", "sshd -t"):
            steps.add(f"Fix: {finding.message}", finding.hint)
    if plan.shape.door == DOOR_A:
        _jail_steps(plan, steps, rel)
    steps.add("Install the sshd drop-in", f"sudo install -m 0644 {rel(DROPIN)} {plan.dropin_target}")
    steps.add("Check sshd's configuration, then reload it", f"{say.sshd_test()} && {say.reload()}")
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
    first = (f"copy {rel(WORKER_YML)} to {worker_dir}/fdl.yml and {rel('key')} to {worker_dir}/key (mode 0600) "
             f"on the worker, then run `fdl join` in {worker_dir}")
    if plan.cloud_init:
        return first, f"or boot workers with {rel(CLOUD_INIT)} as their cloud-init user-data"
    return first, "or add --cloud-init to get user-data that does this at boot"
