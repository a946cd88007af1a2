"""The cluster branch of `fdl probe` (`fdl @cluster probe`): run it, render it, pick the exit code.

Imported by fdl/cli/probe.py only under an env with cluster workers, so a
local `fdl probe` never loads Ansible. The probing itself is
fdl.cluster.probe; this module only turns its report into text or JSON.
"""

from __future__ import annotations

import json

import typer

from fdl.checks.report import ERROR, WARNING
from fdl.cli.context import Globals
from fdl.cli.probe import _mark, render_human


def probe_cluster_command(g: Globals, *, as_json: bool, quiet: bool, skip_mount: bool, data_path: str | None,
                          libtorch_path: str | None, docker: str | None, gpus: list[int] | None,
                          collective=None) -> int:
    """Probe every worker of the selected env; print the report; return the exit code (0 only if all green).

    collective: CollectiveOptions to also run the all-reduce smoke test across the workers (the cluster
    check `collective`, fdl.collective.cluster).
    """
    from fdl.cluster.probe import ClusterProbeOptions, probe_cluster

    config = g.config(required=True)
    options = ClusterProbeOptions(data_path=data_path, skip_mount=skip_mount, libtorch_path=libtorch_path,
                                  docker=docker, local_gpus=gpus)
    report = probe_cluster(config, options, progress=None if not quiet else False)
    tables: list[str] = []
    if collective is not None:
        from fdl.collective.cluster import run_cluster
        from fdl.collective.results import format_rows, to_check

        if not as_json and not quiet:
            typer.echo(f"fdl: note: running the all-reduce smoke test across {len(report.hosts)} hosts (up to "
                       f"{collective.time_limit_s:.0f} s)...", err=True)
        result = run_cluster(config, collective, {h.host: h.to_dict() for h in report.hosts},
                             notes=not quiet and not as_json, progress=None if not quiet else False)
        report.cluster.append(to_check(result))
        tables = format_rows(result)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        out, err = render_cluster(report, quiet=quiet)
        if tables and not quiet:
            out = "\n".join(filter(None, [out, "all-reduce:", *("  " + line for line in tables)]))
        if out:
            typer.echo(out)
        if err:
            typer.echo(err, err=True)
    return 0 if report.ok else 1


def render_cluster(report, *, quiet: bool = False) -> tuple[str, str]:
    """(stdout, stderr): each host as `fdl probe` shows it, then the cross-host checks, then a verdict."""
    out, err = render_human(report.hosts, quiet=quiet)
    lines_out = [out] if out else []
    lines_err = [err] if err else []
    problems = [c for c in report.cluster if c.status in (ERROR, WARNING)]
    if quiet:
        lines_err += [f"cluster: {c.status}: {c.name}: {c.message}" + (f"\n  hint: {c.hint}" if c.hint else "")
                      for c in problems]
        return "\n".join(lines_out), "\n".join(lines_err)
    if problems:
        lines_out.append("cluster: NOT READY" if any(c.status == ERROR for c in problems) else "cluster: warnings")
        for check in report.cluster:
            lines_out.append(f"  {_mark(check.status):<8} {check.name:<15} {check.message}")
            if check.hint and check.status in (ERROR, WARNING):
                lines_out.append(f"  {'':<8} {'':<15} hint: {check.hint}")
    mixed = next((c for c in report.cluster if c.name == "gpu_models" and c.data.get("heterogeneous")), None)
    if mixed is not None and not problems:  # reported, never a failure: a mixed rig should be visible
        lines_out.append(f"cluster: note: {mixed.message}")
    ready = sum(1 for h in report.hosts if h.ok)
    total = len(report.hosts)
    hosts = f"{total} host{'s' if total != 1 else ''}"
    if report.ok and not problems:
        verdict = f"cluster: ready: {hosts}, hosts agree on NCCL, libtorch, data, driver and clocks"
    elif report.ok:
        verdict = f"cluster: ready: {hosts}, with the warnings above"
    else:
        verdict = f"cluster: {ready} of {total} hosts ready" + (
            "; cross-host checks failed" if any(c.status == ERROR for c in problems) else "")
    lines_out.append(verdict)
    return "\n".join(lines_out), "\n".join(lines_err)
