"""The cluster branch of `fdl probe` (`fdl @cluster probe`): run it, render it, pick the exit code.

Imported by fdl/cli/probe.py only under an env with cluster workers, so a
local `fdl probe` never loads Ansible. The probing itself is
fdl.cluster.probe, its rendering fdl.cli.render.probe.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

from fdl.cli.context import Globals
from fdl.cli.render.probe import echo_human, gate_passed, render_cluster, say_strict, strict_document
from fdl.hostside.checks.report import WARNING

if TYPE_CHECKING:
    from fdl.collective.run import CollectiveOptions


def probe_cluster_command(g: Globals, *, as_json: bool, quiet: bool, skip_mount: bool, data_path: str | None,
                          libtorch_path: str | None, docker: str | None, gpus: list[int] | None,
                          collective: CollectiveOptions | None = None, strict: bool = False) -> int:
    """Probe every worker of the selected env; print the report; return the exit code (0 only if all green).

    collective: CollectiveOptions to also run the all-reduce smoke test across the workers, in the same
    playbook run (the cluster check `collective`). strict: a warning (a host's or a cross-host one) fails too.
    """
    from fdl.cluster.probe import ClusterProbeOptions, probe_cluster

    config = g.config(required=True)
    options = ClusterProbeOptions(data_path=data_path, skip_mount=skip_mount, libtorch_path=libtorch_path,
                                  docker=docker, local_gpus=gpus)
    if collective is not None and not as_json and not quiet:
        typer.echo(f"fdl: note: probing every worker, then running the all-reduce smoke test across them (up "
                   f"to {collective.time_limit_s:.0f} s)...", err=True)
    report = probe_cluster(config, options, collective=collective, progress=None if not quiet else False)
    tables: list[str] = []
    if report.collective is not None:
        from fdl.collective.results import format_rows

        tables = format_rows(report.collective)
    warnings = sum(len(h.warnings) for h in report.hosts) + sum(c.status == WARNING for c in report.cluster)
    passed = gate_passed(report.ok, warnings, strict)
    if as_json:
        typer.echo(json.dumps(strict_document(report.to_dict(), warnings, strict), indent=2))
    else:
        echo_human(*render_cluster(report, quiet=quiet), tables, quiet=quiet)
    say_strict(strict, warnings, passed, report.ok)
    return 0 if passed else 1
