"""`fdl probe`: is this host ready for a training run? (GPU, libtorch, NCCL, shared data)

Thin by design: build ProbeOptions from the flags, collect host reports
(`collect_reports`), render them (fdl.cli.render.probe), exit 0 when no check
failed and 1 otherwise. The checks live in fdl.hostside.checks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fdl.cli.context import Globals, globals_of
from fdl.cli.options import json_option
from fdl.cli.render.probe import echo_human, gate_passed, render_human, render_json, say_strict
from fdl.config.discover import find_base
from fdl.hostside.checks.probe import ProbeOptions, run_probe
from fdl.hostside.checks.report import HostReport
from fdl.hostside.envvars import FDL_ENV, read
from fdl.hostside.paths import DEFAULT_DATA_PATH, FLODL_IN_HOME

if TYPE_CHECKING:
    from fdl.collective.results import CollectiveResult
    from fdl.collective.run import CollectiveOptions
    from fdl.hostside.checks.devices import Devices

    CollectivePlan = tuple[Devices | None, CollectiveOptions]

app = typer.Typer(rich_markup_mode=None, add_completion=False)

CPU_FLAG_DEVICES = "cpu:2"  # what --cpu declares: the CPU ranks a single-host run and the smoke test default to


@app.command()
def probe(
    ctx: typer.Context,
    as_json: Annotated[bool, json_option("Print the report as JSON on stdout (schema in docs/probe.md); notes go "
                                         "to stderr.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Nothing on stdout; problems only, on stderr. "
                                                             "The exit code is the answer.")] = False,
    skip_mount: Annotated[bool, typer.Option("--skip-mount", help="Skip the shared-data check (single-host "
                                                                  "setups without shared storage).")] = False,
    data_path: Annotated[str | None, typer.Option("--data-path", metavar="DIR",
                                                  help=f"Shared dataset root to check (default "
                                                       f"{DEFAULT_DATA_PATH}; under a cluster env, each worker's "
                                                       "data_path).")] = None,
    libtorch_path: Annotated[str | None, typer.Option("--libtorch-path", metavar="DIR",
                                                      help="libtorch to check instead of the one fdl would "
                                                           f"find (LIBTORCH, project libtorch/, {FLODL_IN_HOME}).")
                             ] = None,
    docker: Annotated[str | None, typer.Option("--docker", metavar="SERVICE",
                                               help="NCCL comes from this docker compose service's image: "
                                                    "check the service instead of the host's NCCL.")] = None,
    devices: Annotated[str | None, typer.Option("--devices", metavar="SPEC",
                                                help="What this host offers its ranks: GPU ids (0,1: each must "
                                                     "be present), all, or cpu:N for N CPU ranks (judged as a "
                                                     "CPU host).")] = None,
    cpu: Annotated[bool, typer.Option("--cpu", help="Judge this host as a CPU host (--devices cpu:2): the GPU, "
                                                    "NVML, GPU health and NCCL checks are skipped, and the "
                                                    "verdict rests on libtorch and the data path.")] = False,
    collective: Annotated[bool, typer.Option("--collective", help="Also run an all-reduce smoke test across "
                                                                  "the ranks (PyTorch: nccl on GPUs, gloo on "
                                                                  "CPU ranks) and report its bandwidth.")
                          ] = False,
    collective_timeout: Annotated[float, typer.Option("--collective-timeout", metavar="SECONDS", min=5,
                                                      help="Time limit of the whole smoke test; past it the "
                                                           "test is abandoned.")] = 120.0,
    collective_devices: Annotated[str | None, typer.Option("--collective-devices", metavar="SPEC",
                                                           help="Ranks of the smoke test on this host: GPU ids "
                                                                "(0,1) or cpu:N. Default: a CPU host's ranks, "
                                                                "else one per selected GPU, else cpu:2.")] = None,
    collective_max_size: Annotated[str, typer.Option("--collective-max-size", metavar="SIZE",
                                                     help="Largest all-reduce message (8K to 1G).")] = "64M",
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 when any check warns too, not only when one "
                                                          "fails: every component green, or the gate fails. "
                                                          "Without it warnings inform and do not block.")
                      ] = False,
    textfile: Annotated[str | None, typer.Option("--textfile", metavar="FILE",
                                                 help="Also write the report as Prometheus metrics to FILE, a "
                                                      "*.prom file in node_exporter's textfile collector "
                                                      "directory (atomically, mode 0644). This host only.")
                        ] = None,
) -> int:
    """Audit this host's readiness for a training run: GPU, libtorch, NCCL and shared data.

    Exit 0 when no check found an error (warnings inform), 1 otherwise: usable
    as a CI gate before a long run. With --strict a warning fails the gate too.
    """
    g = globals_of(ctx)
    project_root, workers = project_context(g)
    gpus = None if g.gpus is None or g.gpus.ids is None else list(g.gpus.ids)
    declared = declared_devices(devices, cpu, gpus_given=g.gpus is not None)
    plan = collective_plan(collective_devices, collective_max_size, collective_timeout) if collective else None
    if plan is not None and plan[0] is None and declared is not None and declared.is_cpu:
        plan = (declared, plan[1])  # the smoke test runs the ranks this CPU host offers
    if textfile is not None:
        check_textfile(textfile, workers)
    if workers:  # a cluster env: every worker, over Ansible (imported only on this path)
        from fdl.errors import UsageError

        if plan is not None and collective_devices is not None:
            raise UsageError("--collective-devices sets the ranks of a single-host smoke test; across a cluster "
                             "every worker offers its own local_devices (fdl.cluster.yml). Drop the flag, or run "
                             "`fdl probe --collective --collective-devices ...` on one host.")
        if declared is not None:
            flag = "--cpu" if cpu else f"--devices {devices}"
            raise UsageError(f"{flag} says what this one host offers; across a cluster every worker declares its "
                             f"own local_devices in fdl.cluster.yml (cpu:N for a CPU host). Drop the flag, or run "
                             f"`fdl probe {flag}` without the env to probe this host alone.")
        from fdl.cli._cluster_probe import probe_cluster_command

        return probe_cluster_command(g, as_json=as_json, quiet=quiet, skip_mount=skip_mount, data_path=data_path,
                                     libtorch_path=libtorch_path, docker=docker, gpus=gpus,
                                     collective=plan[1] if plan is not None else None, strict=strict)
    from fdl.hostside.checks.devices import probe_declaration

    local_devices = probe_declaration(declared)
    options = ProbeOptions(data_path=data_path or DEFAULT_DATA_PATH, skip_mount=skip_mount,
                           libtorch_path=libtorch_path, docker=docker, project_root=project_root, gpus=gpus,
                           local_devices=local_devices)
    reports = collect_reports(options)
    tables: list[str] = []
    if plan is not None:
        if not as_json and not quiet:
            typer.echo(f"fdl: note: running the all-reduce smoke test (up to {collective_timeout:.0f} s)...",
                       err=True)
        from fdl.collective.results import format_rows

        result = run_collective(plan, reports[0])
        tables = format_rows(result)
    unwritten = write_metrics(textfile, reports[0]) if textfile is not None else None
    warnings = sum(len(r.warnings) for r in reports)
    passed = gate_passed(all(r.ok for r in reports), warnings, strict)
    if as_json:
        typer.echo(render_json(reports, strict=strict))
    else:
        echo_human(*render_human(reports, quiet=quiet), tables, quiet=quiet)
    say_strict(strict, warnings, passed, all(r.ok for r in reports))
    if unwritten is not None:  # after the report, which stands either way (one JSON document on stdout)
        typer.echo(unwritten, err=True)
        return 1
    if textfile is not None:
        warn_other_textfiles(textfile)
    return 0 if passed else 1


def declared_devices(devices: str | None, cpu: bool, *, gpus_given: bool) -> Devices | None:
    """What --devices or --cpu declare this host offers (None: nothing declared); contradictions exit 2 (--cpu
    with --devices is refused before this, with every contradictory pair: fdl.cli.contradictions.EXCLUSIVE)."""
    from fdl.errors import UsageError
    from fdl.hostside.checks.devices import DEVICE_FORMS, Devices, parse_declared

    if cpu:
        devices = CPU_FLAG_DEVICES
    if devices is None:
        return None
    try:  # the parser the fdl_probe module reads fdl_probe_devices with (fdl.hostside.checks.devices)
        parsed = parse_declared(devices, "--devices") or Devices()
    except ValueError as exc:
        raise UsageError(f"{exc}.", hint=f"Name {DEVICE_FORMS}.") from None
    if parsed.is_cpu and gpus_given:
        raise UsageError(f"{'--cpu' if cpu else '--devices ' + devices} judges this host as a CPU host, and --gpus "
                         f"selects GPUs to judge; give one of them.")
    return parsed


def check_textfile(path: str, workers: int) -> None:
    """Refuse a --textfile the collector would never read, or one asked of a cluster probe (exit 2)."""
    from fdl.errors import UsageError
    from fdl.hostside.checks.textfile import SUFFIX

    if workers:
        raise UsageError("--textfile writes this host's metrics for the node_exporter running here, but under a "
                         "cluster env fdl probes the workers.",
                         hint="run `fdl probe --textfile FILE` on each worker (the fdl_join_worker role installs "
                              "a timer that does; docs/probe.md, \"At fleet scale\"), or leave the env out")
    if not path.endswith(SUFFIX) or Path(path).is_dir():
        raise UsageError(f"--textfile {path!r} is not a *{SUFFIX} file: node_exporter's textfile collector reads "
                         f"only files named *{SUFFIX} in its directory.",
                         hint="name a file such as /var/lib/prometheus/node-exporter/fdl-probe.prom")


def write_metrics(path: str, report: HostReport) -> str | None:
    """Write the report's metrics to `path`; None when written, else the message for stderr."""
    import errno

    from fdl.hostside.checks.textfile import write_textfile

    try:
        write_textfile(path, report.to_dict())
    except OSError as exc:
        directory = os.path.dirname(os.path.abspath(path))
        hint = {
            errno.ENOENT: f"create {directory} (node_exporter's Debian package makes "
                          f"/var/lib/prometheus/node-exporter), or name the directory its "
                          f"--collector.textfile.directory reads",
            errno.EACCES: f"this user cannot create files in {directory}: run the probe as an account of a group "
                          f"that may (the fdl_join_worker role's timer does; docs/probe.md)",
            errno.EPERM: f"{path} belongs to another account, and {directory} is sticky: only its owner may "
                         f"replace it; remove it (as root) and run the probe again",
            errno.EROFS: f"{directory} is on a read-only file system",
        }.get(exc.errno or 0, "check the directory and the disk, then run the probe again")
        return f"fdl: error: could not write the metrics file {path}: {exc.strerror or exc}.\n  hint: {hint}"
    return None


def warn_other_textfiles(path: str) -> None:
    """A warning per other fdl *.prom file in the same directory: node_exporter would export every series twice
    and say so only in its own log."""
    from fdl.hostside.checks.textfile import other_fdl_files

    for other in other_fdl_files(path):
        typer.echo(f"fdl: warning: {other} in the same textfile directory holds fdl's probe metrics too: "
                   f"node_exporter reads every *.prom file there, so it sees each fdl series twice and reports that "
                   f"only in its own log. Keep one fdl metrics file per directory: remove {other}, or write to it "
                   f"with --textfile.", err=True)


def collective_plan(devices: str | None, max_size: str, timeout: float) -> CollectivePlan:
    """(devices or None, CollectiveOptions) from the flags; bad values are usage errors (exit 2)."""
    from fdl.collective.run import CollectiveOptions, parse_size
    from fdl.errors import UsageError
    from fdl.hostside.checks.devices import parse_devices

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


def run_collective(plan: CollectivePlan, report: HostReport) -> CollectiveResult:
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
    env_selected = g.invocation.sigil is not None or g.env_flag is not None or bool(read(FDL_ENV))
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
