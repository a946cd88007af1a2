"""`fdl join-config`'s report for people, and its JSON twin, rendered from the wizard's typed records."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fdl.farm.wizard.plan import Plan
    from fdl.farm.wizard.report import AuthorizedKeysReport, FarmReport
    from fdl.hostside.checks.report import CheckResult


def render_json(report: FarmReport) -> str:
    """The JSON twin of the report: the same data as the human text."""
    return json.dumps(report.to_dict(), indent=2, sort_keys=False)


def render_header(plan: Plan) -> str:
    from fdl.hostside.farm.doors import TITLES

    shape = plan.shape
    lines = [f"farm {plan.label}: door {shape.door} ({TITLES[shape.door]})",
             f"  workers dial {shape.controller} and forward to 127.0.0.1:{shape.controller_port}"]
    if shape.served:
        lines.append(f"  served: {shape.served}")
    recovered = plan.shape_from.recovered()
    if recovered:
        lines.append(f"  ({', '.join(recovered)} recovered from the farm's worker yml)")
    return "\n".join(lines)


_STATUS = {"ok": "ok", "warning": "WARN", "error": "ERROR", "skipped": "skip"}


def render_doctor(findings: Sequence[CheckResult]) -> str:
    lines = ["", "host doctor (before anything is written):"]
    width = max((len(f.name) for f in findings), default=6)
    for f in findings:
        status = _STATUS.get(f.status, f.status)
        lines.append(f"  {status:<5}  {f.name:<{width}}  {f.message}")
        if f.hint and f.status != "ok":
            lines.append(f"  {'':<5}  {'':<{width}}  fix: {f.hint}")
    return "\n".join(lines)


def _render_files(report: FarmReport, cwd: Path) -> list[str]:
    from fdl.farm.wizard.report import spell_path

    cred = report.credentials
    lines = ["", f"credentials: {cred.action} (key {cred.fingerprint}; the token is in {spell_path(cred.token, cwd)})",
             f"files in {spell_path(report.farm_dir, cwd)}/:",
             "  key, key.pub, token     the farm's key pair and admission token (0600)",
             "  worker.yml              the worker's fdl.yml join block (it names the key, token and known_hosts "
             "files; no secret)",
             f"  sshd-door.conf          the sshd drop-in (Match LocalPort {report.shape.door_port})",
             f"  authorized_keys.line    the key line for door {report.door}",
             "  join-door.yml           the fdl_join_door role's variables for the privileged step",
             "  door-selftest.sh        the door self-test"]
    if report.files.known_hosts:
        lines.append("  known_hosts             the door's host keys, which workers pin (join.known_hosts)")
    if report.files.cloud_init:
        lines.append("  cloud-init.yml          user-data for workers (holds the key and token)")
    lines.append(f"overlay: {report.overlay.message}")
    if report.overlay.snippet_text:
        lines += ["  " + line for line in report.overlay.snippet_text.rstrip("\n").splitlines()]
    return lines


def _render_key_file(ak: AuthorizedKeysReport) -> list[str]:
    from fdl.farm.wizard.report import KeyAction

    if ak.action == KeyAction.JAILED:
        lines = [f"authorized_keys: door a's key goes into {ak.path}, the jailed account's own file (the "
                 f"privileged step below)"]
        if ak.removed_unconfined:
            gone = ak.removed_unconfined
            lines.append(f"  removed the unconfined door-a line {gone.line} from {gone.path}")
    elif ak.installed:
        lines = [f"authorized_keys: {ak.action} in {ak.path} (line {ak.line})"]
    else:
        lines = [f"authorized_keys: not installed into {ak.path}"]
    for issue in ak.permissions:
        state = "fixed" if ak.permissions_fixed and issue.fixable else "left as found"
        lines.append(f"  permissions: {issue.path} was {issue.mode:04o} ({issue.problem}): {issue.command} [{state}]")
    if ak.listening is not None:
        where = f"{ak.listening.host}:{ak.listening.port}"
        lines.append(f"  {'something answers' if ak.listening.answering else 'nothing listens yet'} on {where}")
    return lines


def render_rest(report: FarmReport, cwd: Path) -> str:
    lines = _render_files(report, cwd) + _render_key_file(report.authorized_keys)
    lines += ["", "setup on this box:"]
    for step in report.steps:
        mark = "done: " if step.done else ""
        lines.append(f"  {step.n}. {mark}{step.title}")
        if step.command:
            lines.append(f"       {step.command}")
    lines += ["", "on each worker:"] + [f"  - {w}" for w in report.worker_steps]
    return "\n".join(lines)
