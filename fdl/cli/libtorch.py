"""`fdl libtorch list|download|activate|info`: the libtorch variants on this box."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import typer

from fdl.cli.context import globals_of
from fdl.cli.options import json_option

app = typer.Typer(help="List, download and activate libtorch variants.", rich_markup_mode=None,
                  no_args_is_help=True)


@app.callback()
def libtorch() -> None:
    """List, download and activate libtorch variants (~/.flodl/libtorch and the project's libtorch/)."""


def _project_root(ctx: typer.Context) -> str:
    from fdl.cli.probe import project_context

    return project_context(globals_of(ctx))[0]


def _describe(data: dict[str, Any]) -> str:
    bits = [data.get("version") or "(version unrecorded)", data.get("variant") or "(variant unrecorded)"]
    if data.get("cuda"):
        bits.append(f"CUDA {data['cuda']}")
    archs = data.get("archs")
    if archs:
        bits.append("archs " + " ".join(archs))
    elif archs is None and data.get("kind") in ("cuda", "rocm"):
        bits.append("archs unrecorded")
    return ", ".join(bits)


@app.command("list")
def list_(
    ctx: typer.Context,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """The installed variants (project libtorch/, ~/.flodl/libtorch, this environment's PyTorch)."""
    from fdl import libtorch as lt

    root = _project_root(ctx)
    variants = lt.list_variants(root)
    resolved = lt.resolve(root)
    in_use = resolved.libtorch.path if resolved.libtorch else None
    if as_json:
        typer.echo(json.dumps({"variants": [dict(v.to_data(), in_use=v.info.path == in_use) for v in variants],
                               "in_use": resolved.to_data()["libtorch"]}, indent=2))
        return
    if not variants:
        typer.echo("No libtorch variant is installed (looked in the project's libtorch/, ~/.flodl/libtorch and "
                   "this Python environment).")
        typer.echo("Get one: fdl libtorch download auto   (or --cpu)")
        return
    for v in variants:
        mark = "*" if v.info.path == in_use else " "
        where = v.root or v.info.path
        active = " [active]" if v.active else ""
        typer.echo(f"{mark} {v.label:<24} {v.scope:<8} {_describe(v.info.to_data())}{active}  ({where})")
    typer.echo("* = what fdl probe resolves now (fdl libtorch info says why)")


@app.command("info")
def info(
    ctx: typer.Context,
    libtorch_path: Annotated[str | None, typer.Option("--libtorch-path", metavar="DIR",
                                                      help="Resolve as if fdl probe had this option.")] = None,
    as_json: Annotated[bool, json_option()] = False,
) -> int:
    """What fdl probe would resolve, and the order it looked in (exit 1 when it resolves nothing)."""
    from fdl import libtorch as lt

    resolution = lt.resolve(_project_root(ctx), explicit=libtorch_path)
    if as_json:
        typer.echo(json.dumps(resolution.to_data(), indent=2))
    else:
        typer.echo("Resolution order (first match wins):")
        for i, step in enumerate(resolution.order, 1):
            typer.echo(f"  {i}. {step}")
        if resolution.libtorch is not None:
            data = resolution.libtorch.to_data()
            typer.echo(f"Resolved: {data['path']} (from {data['source']}): {_describe(data)}")
        else:
            typer.echo(f"Resolved: nothing. {resolution.error}")
            typer.echo(f"  hint: {resolution.hint}")
    return 1 if resolution.libtorch is None else 0


@app.command("download")
def download(
    ctx: typer.Context,
    variant: Annotated[str | None, typer.Argument(metavar="VARIANT",
                                                  help="cpu, cu126, cu128, rocm7.0, rocm7.1, or auto (picked "
                                                       "for this box's GPUs).")] = None,
    cpu: Annotated[bool, typer.Option("--cpu", help="Shorthand for the cpu variant.")] = False,
    mirror: Annotated[str | None, typer.Option("--mirror", metavar="URL",
                                               help="Base URL serving libtorch-VARIANT.zip and its .sha256 "
                                                    "(default: FDL_LIBTORCH_MIRROR, then join.libtorch_mirror).")]
    = None,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Download a variant into ~/.flodl/libtorch, checksum-verified, installed atomically."""
    from fdl import libtorch as lt

    if cpu and variant not in (None, "cpu"):
        raise typer.BadParameter(f"--cpu and {variant} name different variants; give one.")
    name = "cpu" if cpu else variant
    if name is None:
        raise typer.BadParameter("name a variant (cpu, cu126, cu128, rocm7.0, rocm7.1, auto) or pass --cpu.")
    g = globals_of(ctx)
    join = getattr(g.config(required=False), "join", None)
    chosen = lt.choose_variant(name)
    if name == "auto":
        typer.echo(f"fdl: auto picked {chosen} for this box", err=True)
    url = lt.mirror_url(mirror, os.environ, getattr(join, "libtorch_mirror", None))
    bar = _ProgressBar(chosen) if sys.stderr.isatty() and not as_json else None
    installed, activated = lt.download(chosen, mirror=url, note=lambda text: typer.echo(f"fdl: {text}", err=True),
                                       progress=bar)
    if bar is not None:
        bar.finish()
    if as_json:
        typer.echo(json.dumps({"variant": installed.variant, "label": installed.label, "path": str(installed.path),
                               "downloaded": installed.acquired, "activated": activated}, indent=2))
        return
    typer.echo(f"libtorch {installed.label} is installed in {installed.path}.")
    if activated:
        typer.echo("It is now the active variant (nothing was active before).")
    else:
        typer.echo(f"To use it: fdl libtorch activate {installed.variant}")


@app.command("activate")
def activate(
    ctx: typer.Context,
    variant: Annotated[str, typer.Argument(metavar="VARIANT",
                                           help="An installed variant: precompiled/cu128, builds/NAME, or a "
                                                "download name such as cpu.")],
) -> None:
    """Make an installed variant the active one (writes the .active marker probe and publish read)."""
    from fdl import libtorch as lt

    chosen = lt.activate(variant, _project_root(ctx))
    typer.echo(f"Active libtorch in {chosen.root}: {chosen.label} ({_describe(chosen.info.to_data())}).")


class _ProgressBar:
    """A one-line download bar on stderr (terminals only)."""

    def __init__(self, label: str):
        self.label = label
        self.shown = False

    def __call__(self, done: int, total: int | None) -> None:
        mib = done / (1 << 20)
        if total:
            width = 30
            filled = int(width * done / total)
            text = f"\r{self.label}: [{'#' * filled}{'.' * (width - filled)}] {mib:.1f}/{total / (1 << 20):.1f} MiB"
        else:
            text = f"\r{self.label}: {mib:.1f} MiB"
        sys.stderr.write(text)
        sys.stderr.flush()
        self.shown = True

    def finish(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
