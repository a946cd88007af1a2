"""`fdl probe`: is this host ready for a training run? (GPU, libtorch, NCCL, shared data)

Thin by design: build ProbeOptions from the flags, collect host reports
(`collect_reports`), render them (`render_human` / `render_json`), exit 0 when
no check failed and 1 otherwise. The checks live in fdl.checks.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from fdl.checks.data import DEFAULT_DATA_PATH
from fdl.checks.probe import CORE_CHECKS, ProbeOptions, run_probe
from fdl.checks.report import ERROR, OK, SKIPPED, WARNING, HostReport
from fdl.cli.context import Globals, globals_of
from fdl.config.discover import find_base

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def probe(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout (schema in "
                                                          "docs/probe.md); notes go to stderr.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Nothing on stdout; problems only, on stderr. "
                                                             "The exit code is the answer.")] = False,
    skip_mount: Annotated[bool, typer.Option("--skip-mount", help="Skip the shared-data check (single-host "
                                                                  "setups without shared storage).")] = False,
    data_path: Annotated[str | None, typer.Option("--data-path", metavar="DIR",
                                                  help="Shared dataset root to check (default /flodl/data; under "
                                                       "a cluster env, each worker's data_path).")] = None,
    libtorch_path: Annotated[str | None, typer.Option("--libtorch-path", metavar="DIR",
                                                      help="libtorch to check instead of the one fdl would "
                                                           "find (LIBTORCH, project libtorch/, ~/.flodl).")
                             ] = None,
    docker: Annotated[str | None, typer.Option("--docker", metavar="SERVICE",
                                               help="NCCL comes from this docker compose service's image: "
                                                    "check the service instead of the host's NCCL.")] = None,
    collective: Annotated[bool, typer.Option("--collective", help="Also run an all-reduce smoke test across "
                                                                  "the ranks (PyTorch: nccl on GPUs, gloo on "
                                                                  "CPU ranks) and report its bandwidth.")
                          ] = False,
    collective_timeout: Annotated[float, typer.Option("--collective-timeout", metavar="SECONDS", min=5,
                                                      help="Time limit of the whole smoke test; past it the "
                                                           "test is abandoned.")] = 120.0,
    collective_devices: Annotated[str | None, typer.Option("--collective-devices", metavar="SPEC",
                                                           help="Ranks of the smoke test on this host: GPU ids "
                                                                "(0,1) or cpu:N. Default: one per selected GPU, "
                                                                "else cpu:2.")] = None,
    collective_max_size: Annotated[str, typer.Option("--collective-max-size", metavar="SIZE",
                                                     help="Largest all-reduce message (8K to 1G).")] = "64M",
) -> None:
    """Audit this host's readiness for a training run: GPU, libtorch, NCCL and shared data.

    Exit 0 when no check found an error (warnings inform), 1 otherwise: usable
    as a CI gate before a long run.
    """
    g = globals_of(ctx)
    project_root, workers = project_context(g)
    gpus = None if g.gpus is None or g.gpus.ids is None else list(g.gpus.ids)
    plan = collective_plan(collective_devices, collective_max_size, collective_timeout) if collective else None
    if workers:  # a cluster env: every worker, over Ansible (imported only on this path)
        if plan is not None and plan[0] is not None:
            from fdl.errors import UsageError

            raise UsageError("--collective-devices sets the ranks of a single-host smoke test; across a cluster "
                             "every worker offers its own local_devices (fdl.cluster.yml). Drop the flag, or run "
                             "`fdl probe --collective --collective-devices ...` on one host.")
        from fdl.cli._cluster_probe import probe_cluster_command

        raise typer.Exit(probe_cluster_command(g, as_json=as_json, quiet=quiet, skip_mount=skip_mount,
                                               data_path=data_path, libtorch_path=libtorch_path, docker=docker,
                                               gpus=gpus, collective=plan[1] if plan is not None else None))
    options = ProbeOptions(data_path=data_path or DEFAULT_DATA_PATH, skip_mount=skip_mount,
                           libtorch_path=libtorch_path, docker=docker, project_root=project_root, gpus=gpus)
    reports = collect_reports(options)
    tables: list[str] = []
    if plan is not None:
        if not as_json and not quiet:
            typer.echo(f"fdl: note: running the all-reduce smoke test (up to {collective_timeout:.0f} s)...",
                       err=True)
        from fdl.collective.results import format_rows

        result = run_collective(plan, reports[0])
        tables = format_rows(result)
    if as_json:
        typer.echo(render_json(reports))
    else:
        echo_human(*render_human(reports, quiet=quiet), tables, quiet=quiet)
    raise typer.Exit(0 if all(r.ok for r in reports) else 1)


def collective_plan(devices: str | None, max_size: str, timeout: float):
    """(devices or None, CollectiveOptions) from the flags; bad values are usage errors (exit 2)."""
    from fdl.collective.run import CollectiveOptions, parse_size
    from fdl.config.schema import parse_devices
    from fdl.errors import UsageError

    parsed = None
    if devices is not None:
        try:
            parsed = parse_devices(devices)
        except ValueError as exc:
            raise UsageError(f"--collective-devices {devices!r}: {exc}.") from None
    try:
        size = parse_size(max_size)
    except ValueError as exc:
        raise UsageError(f"--collective-max-size {max_size!r}: {exc}.") from None
    return parsed, CollectiveOptions(time_limit_s=timeout, max_bytes=size)


def run_collective(plan, report: HostReport):
    """Run the local smoke test on the planned devices (default: the selected GPUs, else cpu:2) and add its
    `collective` check to this host's report."""
    from fdl.collective.results import to_check
    from fdl.collective.run import DEFAULT_CPU_RANKS, run_local, selected_gpus

    devices, options = plan
    if devices is None:
        gpus, cpu_ranks = selected_gpus(report.to_dict()), DEFAULT_CPU_RANKS
    elif devices.is_cpu:
        gpus, cpu_ranks = None, devices.count
    else:
        gpus, cpu_ranks = list(devices.ids) if devices.ids is not None else selected_gpus(report.to_dict()), 0
    result = run_local(gpus or None, cpu_ranks or DEFAULT_CPU_RANKS, options, host=report.host)
    report.checks.append(to_check(result))
    return result


def project_context(g: Globals) -> tuple[str, int]:
    """(project root, number of cluster workers in the selected env). Config is read only when there is one."""
    env_selected = g.invocation.sigil is not None or g.env_flag is not None or bool(os.environ.get("FDL_ENV"))
    base = find_base(Path.cwd())
    if base is None and not env_selected:
        return str(Path.cwd()), 0
    config = g.config(required=False)
    cluster = getattr(config, "cluster", None)
    workers = len(cluster.workers) if cluster is not None else 0
    return str(base.parent if base is not None else Path.cwd()), workers


def collect_reports(options: ProbeOptions) -> list[HostReport]:
    """The reports to render: this host's. (Cluster fan-out adds one report per worker here.)"""
    return [run_probe(options)]


# ---- rendering ----

def render_json(reports: list[HostReport]) -> str:
    """One host: its report object. (Several hosts will get an aggregate object; docs/probe.md.)"""
    if len(reports) == 1:
        return json.dumps(reports[0].to_dict(), indent=2)
    return json.dumps({"schema_version": reports[0].schema_version if reports else 1,
                       "ok": all(r.ok for r in reports), "hosts": [r.to_dict() for r in reports]}, indent=2)


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
        hidden = 0
        for check in report.checks:
            if check.status not in (ERROR, WARNING) and check.name not in CORE_CHECKS:
                hidden += check.status == SKIPPED
                continue  # the depth checks (GPU health, stack) show up only when they found something
            out.append(f"  {_mark(check.status):<8} {check.name:<9} {check.message}")
            if check.hint and check.status in (ERROR, WARNING):
                out.append(f"  {'':<8} {'':<9} hint: {check.hint}")
        if hidden:
            out.append(f"  {hidden} more check{'s' if hidden != 1 else ''} skipped (`fdl probe --json` shows "
                       f"{'them' if hidden != 1 else 'it'} and why)")
    return "\n".join(out), "\n".join(err)


def echo_human(out: str, err: str, tables: list[str], *, quiet: bool) -> None:
    """Print a rendered report (stdout, stderr), with the all-reduce table under stdout unless quiet."""
    if tables and not quiet:
        out = "\n".join(filter(None, [out, "all-reduce:", *("  " + line for line in tables)]))
    if out:
        typer.echo(out)
    if err:
        typer.echo(err, err=True)


def headline(report: HostReport) -> str:
    errors, warnings = len(report.errors), len(report.warnings)
    counts = ", ".join(filter(None, [f"{errors} error{'s' if errors != 1 else ''}" if errors else "",
                                     f"{warnings} warning{'s' if warnings != 1 else ''}" if warnings else ""]))
    return f"{report.host}: {'NOT READY' if errors else 'ready'} ({counts})"


def _mark(status: str) -> str:
    return {OK: "ok", WARNING: "warning", ERROR: "ERROR", SKIPPED: "skipped"}.get(status, status)


def summary_line(report: HostReport) -> str:
    """The green path: one line of the facts that matter (warnings, if any, are listed by render_human)."""
    parts = []
    for check in report.checks:
        data = check.data
        if check.name not in CORE_CHECKS:
            continue  # green depth checks stay out of the one-line summary
        if check.status == SKIPPED:
            parts.append(f"{check.name} skipped")
        elif check.name == "gpu":
            devices = [d for d in data.get("devices", []) if d.get("selected")]
            sms = sorted({d["sm"] for d in devices})
            parts.append(f"{len(devices)} GPU{'s' if len(devices) != 1 else ''} ({', '.join(sms)})")
        elif check.name == "libtorch":
            parts.append(" ".join(filter(None, ["libtorch", data.get("version"), data.get("variant")])))
        elif check.name == "nccl":
            parts.append(f"NCCL from docker service {data['docker_service']}" if data.get("docker_service")
                         else f"NCCL {data.get('version')}")
        elif check.name == "data":
            parts.append(f"data {data.get('path')}")
        else:
            parts.append(f"{check.name} ok")
    hidden = sum(1 for c in report.checks if c.status == SKIPPED and c.name not in CORE_CHECKS)
    more = f" ({hidden} more check{'s' if hidden != 1 else ''} skipped: `fdl probe --json` says why)" if hidden else ""
    return f"{report.host}: ready: " + ", ".join(parts) + more


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
