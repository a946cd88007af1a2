"""`fdl probe` and `fdl @cluster probe` for people and for scripts: a host's report, a cluster's report."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fdl.hostside.checks.probe import CORE_CHECKS
from fdl.hostside.checks.report import ERROR, OK, SKIPPED, WARNING, HostReport
from fdl.hostside.checks.verdict import headline, summary_line

if TYPE_CHECKING:
    from fdl.cluster.probe import ClusterReport


def gate_passed(ok: bool, warnings: int, strict: bool) -> bool:
    """The probe's answer as a gate: no error; under --strict, no warning either."""
    return ok and not (strict and warnings)


def strict_document(doc: dict[str, Any], warnings: int, strict: bool) -> dict[str, Any]:
    """Under --strict the document's top-level `ok` is the gate's answer (it matches the exit code), and
    `strict: true` says so; without it the document is unchanged."""
    if strict:
        doc["ok"] = gate_passed(bool(doc.get("ok")), warnings, strict)
        doc["strict"] = True
    return doc


def say_strict(strict: bool, warnings: int, passed: bool, ok: bool) -> None:
    """On stderr: that --strict failed a report whose only problems are warnings."""
    if strict and ok and not passed:
        import typer

        typer.echo(f"fdl: --strict: {warnings} warning{'s fail' if warnings != 1 else ' fails'} the gate (exit 1); "
                   f"without --strict warnings inform and do not block.", err=True)


def render_json(reports: list[HostReport], *, strict: bool = False) -> str:
    """One host: its report object. (Several hosts will get an aggregate object; docs/probe.md.)"""
    warnings = sum(len(r.warnings) for r in reports)
    if len(reports) == 1:
        return json.dumps(strict_document(reports[0].to_dict(), warnings, strict), indent=2)
    return json.dumps(strict_document({"schema_version": reports[0].schema_version if reports else 1,
                                       "ok": all(r.ok for r in reports), "hosts": [r.to_dict() for r in reports]},
                                      warnings, strict), indent=2)


def render_human(reports: list[HostReport], *, quiet: bool = False) -> tuple[str, str]:
    """(stdout text, stderr text). Green: one summary line per host; otherwise the core checks (gpu, libtorch,
    nccl, data) and every other check that warns or fails, with hints."""
    out: list[str] = []
    err: list[str] = []
    for report in reports:
        problems = report.errors + report.warnings
        if not problems:
            if not quiet:
                out.append(summary_line(report))
            continue
        if quiet:
            err.extend(f"{report.host}: {c.status}: {c.name}: {c.message}" + (f"\n  hint: {c.hint}" if c.hint else "")
                       for c in problems)
            continue
        out.append(headline(report))
        hidden = cpu_skipped = 0
        for check in report.checks:
            if check.status not in (ERROR, WARNING) and check.name not in CORE_CHECKS:
                if check.status == SKIPPED and check.data.get("cpu_host"):
                    cpu_skipped += 1
                else:
                    hidden += check.status == SKIPPED
                continue  # the depth checks (GPU health, stack) show up only when they found something
            out.append(f"  {mark(check.status):<8} {check.name:<9} {check.message}")
            if check.hint and check.status in (ERROR, WARNING):
                out.append(f"  {'':<8} {'':<9} hint: {check.hint}")
        if cpu_skipped:
            out.append(f"  {cpu_skipped} GPU health and stack checks skipped: a CPU host uses no GPU")
        if hidden:
            out.append(f"  {hidden} more check{'s' if hidden != 1 else ''} skipped (`fdl probe --json` shows "
                       f"{'them' if hidden != 1 else 'it'} and why)")
    return "\n".join(out), "\n".join(err)


def echo_human(out: str, err: str, tables: list[str], *, quiet: bool) -> None:
    """Print a rendered report (stdout, stderr), with the all-reduce table under stdout unless quiet."""
    import typer  # the renderers themselves are plain functions over reports

    if tables and not quiet:
        out = "\n".join(filter(None, [out, "all-reduce:", *("  " + line for line in tables)]))
    if out:
        typer.echo(out)
    if err:
        typer.echo(err, err=True)


def mark(status: str) -> str:
    return {OK: "ok", WARNING: "warning", ERROR: "ERROR", SKIPPED: "skipped"}.get(status, status)


# What a cross-host check that came out ok says the hosts agree on (the green verdict names them).
AGREEMENT = (("nccl_match", "NCCL"), ("libtorch_match", "libtorch"), ("data_match", "data"),
             ("driver_match", "driver"), ("clock_skew", "clocks"))


def render_cluster(report: ClusterReport, *, quiet: bool = False) -> tuple[str, str]:
    """(stdout, stderr): each host as `fdl probe` shows it, the cross-host checks in one block, then a verdict.

    The block lists every cross-host check, whatever its status: ok, skipped
    with the reason, or a warning or error with its hint. --quiet keeps only
    the problems, on stderr.
    """
    out, err = render_human(report.hosts, quiet=quiet)
    lines_out = [out] if out else []
    lines_err = [err] if err else []
    problems = [c for c in report.cluster if c.status in (ERROR, WARNING)]
    if quiet:
        lines_err += [f"cluster: {c.status}: {c.name}: {c.message}" + (f"\n  hint: {c.hint}" if c.hint else "")
                      for c in problems]
        return "\n".join(lines_out), "\n".join(lines_err)
    lines_out += cross_host_block(report)
    ready = sum(1 for h in report.hosts if h.ok)
    total = len(report.hosts)
    hosts = f"{total} host{'s' if total != 1 else ''}"
    if report.ok and not problems:
        agreed = [what for name, what in AGREEMENT
                  if any(c.name == name and c.status == OK for c in report.cluster)]
        verdict = f"cluster: ready: {hosts}, " + (
            f"hosts agree on {_and(agreed)}" if agreed else "no cross-host check had two hosts to compare")
    elif report.ok:
        verdict = f"cluster: ready: {hosts}, with the warnings above"
    else:
        verdict = f"cluster: {ready} of {total} hosts ready" + (
            "; cross-host checks failed" if any(c.status == ERROR for c in problems) else "")
    lines_out.append(verdict)
    return "\n".join(lines_out), "\n".join(lines_err)


def cross_host_block(report: ClusterReport) -> list[str]:
    """The cross-host checks, one line each (a hint under a warning or an error)."""
    if not report.cluster:
        return []
    width = max(len(c.name) for c in report.cluster)
    lines = ["cross-host checks:"]
    for check in report.cluster:
        lines.append(f"  {mark(check.status):<8} {check.name:<{width}}  {check.message}")
        if check.hint and check.status in (ERROR, WARNING):
            lines.append(f"  {'':<8} {'':<{width}}  hint: {check.hint}")
    return lines


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
