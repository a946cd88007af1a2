"""`fdl nccl build`: libnccl.so.2 from source, matching the fleet, for this host's GPU archs."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from fdl.cli.context import globals_of
from fdl.cli.options import json_option
from fdl.hostside.paths import FLODL_IN_HOME
from fdl.nccl.plan import DEFAULT_JOBS

app = typer.Typer(help="Build NVIDIA's NCCL from source for heterogeneous rigs.", rich_markup_mode=None,
                  no_args_is_help=True, add_completion=False)


@app.callback()
def nccl() -> None:
    """Build NVIDIA's NCCL from source for heterogeneous rigs."""


@app.command("build")
def build(
    ctx: typer.Context,
    tag: Annotated[str | None, typer.Option("--tag", metavar="vX.Y.Z",
                                            help="NCCL release to build (default: the newest the "
                                                 "cluster's hosts run, built for the host with the older one; "
                                                 "without a cluster, the project's libtorch's).")] = None,
    archs: Annotated[str | None, typer.Option("--archs", metavar="'6.1;12.0'",
                                              help="Compute capabilities to build for (default: the build host's "
                                                   "GPUs).")] = None,
    jobs: Annotated[int | None, typer.Option("--jobs", metavar="N",
                                             help=f"Parallel compile jobs (default {DEFAULT_JOBS}: each "
                                                  "nvcc job takes gigabytes of memory).")] = None,
    host: Annotated[str | None, typer.Option("--host", metavar="NAME",
                                             help="Build on this cluster worker instead of here.")] = None,
    root: Annotated[str | None, typer.Option("--root", metavar="DIR",
                                             help="Root of libtorch/ on the build host (default: the project "
                                                  f"directory; {FLODL_IN_HOME} on a worker).")] = None,
    base_image: Annotated[str | None, typer.Option("--base-image", metavar="IMAGE",
                                                   help="CUDA devel image that compiles NCCL.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the build plan and change nothing.")] = False,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Build libnccl.so.2 in a Docker context and say how to preload it.

    Output: libtorch/nccl/builds/v<version>-<archs>/lib/libnccl.so.2. Takes 5-15 minutes.
    """
    from fdl.cli.render import nccl as render
    from fdl.nccl.build import run_build, this_host_name
    from fdl.nccl.plan import DEFAULT_BASE_IMAGE
    from fdl.nccl.planner import make_plan, named_worker, needs_fleet

    g = globals_of(ctx)
    cfg = g.config(required=host is not None)
    named_worker(cfg.cluster, host)  # a --host that names no worker is refused before anything is probed
    fleet = None
    if needs_fleet(cfg.cluster, tag=tag, host=host, archs=archs):  # what the hosts run: the cluster probe's reports
        from fdl.nccl.fleet import collect

        if not as_json:
            typer.echo("fdl: note: probing the cluster's hosts for their NCCL versions and GPUs (--tag and "
                       "--archs skip this)...", err=True)
        fleet = collect(cfg, progress=False if as_json else None)
    plan = make_plan(project_root=cfg.root, cluster=cfg.cluster, tag=tag, archs=archs,
                     jobs=DEFAULT_JOBS if jobs is None else jobs, host=host,
                     root=root, base_image=base_image or DEFAULT_BASE_IMAGE, fleet=fleet)
    for note in plan.notes:
        typer.echo(f"fdl: note: {note}", err=True)
    if dry_run:
        typer.echo(json.dumps(plan.to_dict(), indent=2) if as_json else render.plan_text(plan))
        return

    from fdl.cluster.inventory import build_inventory, local_inventory

    if plan.remote and cfg.cluster is not None:  # the planner checked that plan.host is a cluster worker
        inventory = build_inventory(cfg.cluster, cfg.root)
        snippet_host = plan.host
    else:
        inventory = local_inventory(plan.host)
        snippet_host = this_host_name(cfg.cluster)
    typer.echo(render.start_text(plan), err=True)
    result = run_build(plan, inventory, snippet_host=snippet_host, live=sys.stderr.isatty())
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        typer.echo(render.result_text(result))
