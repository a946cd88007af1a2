"""`fdl libtorch list|download|activate|remove|info`: the libtorch variants on this box."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import typer

from fdl.cli.context import globals_of
from fdl.cli.options import json_option
from fdl.hostside.envvars import FDL_LIBTORCH_MIRROR
from fdl.hostside.paths import LIBTORCH_IN_HOME

app = typer.Typer(help="List, download, activate and remove libtorch variants.", rich_markup_mode=None,
                  add_completion=False, no_args_is_help=True)


@app.callback()
def libtorch() -> None:
    """List, download, activate and remove libtorch variants (~/.flodl/libtorch and the project's libtorch/)."""


def _project_root(ctx: typer.Context) -> str:
    from fdl.cli.probe import project_context

    return project_context(globals_of(ctx))[0]


def _describe(data: dict[str, Any]) -> str:
    """One line: version, variant, CUDA version, arch list."""
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
    from fdl.libtorch import manage

    root = _project_root(ctx)
    variants = manage.list_variants(root, os.environ)
    resolved = manage.resolve(root, os.environ)
    dangling = manage.dangling_active(root, os.environ)
    in_use = resolved.libtorch.path if resolved.libtorch else None
    if as_json:
        typer.echo(json.dumps({"variants": [dict(v.to_data(), in_use=v.libtorch.path == in_use) for v in variants],
                               "in_use": resolved.to_data()["libtorch"],
                               "dangling_active": [{"root": r, "variant": v} for r, v in dangling]}, indent=2))
        return
    for where, label in dangling:
        typer.echo(f"fdl: warning: {where}/.active names {label}, which is not installed there: "
                   f"`fdl libtorch remove {label}` clears it, `fdl libtorch activate VARIANT` picks another.",
                   err=True)
    if not variants:
        typer.echo(f"No libtorch variant is installed (looked in the project's libtorch/, {LIBTORCH_IN_HOME} and "
                   "this Python environment).")
        typer.echo("Get one: fdl libtorch download auto   (or --cpu)")
        return
    for v in variants:
        mark = "*" if v.libtorch.path == in_use else " "
        where = v.root or v.libtorch.path
        active = " [active]" if v.active else ""
        data = v.to_data()
        typer.echo(f"{mark} {data['label']:<24} {data['scope']:<8} {_describe(data)}{active}  ({where})")
    typer.echo("* = what fdl probe resolves now (fdl libtorch info says why)")


@app.command("info")
def info(
    ctx: typer.Context,
    libtorch_path: Annotated[str | None, typer.Option("--libtorch-path", metavar="DIR",
                                                      help="Resolve as if fdl probe had this option.")] = None,
    as_json: Annotated[bool, json_option()] = False,
) -> int:
    """What fdl probe would resolve, the order it looked in, and the SHA-256 fdl recorded for it."""
    from fdl.libtorch import manage

    resolution = manage.resolve(_project_root(ctx), os.environ, explicit=libtorch_path)
    if as_json:
        typer.echo(json.dumps(resolution.to_data(), indent=2))
    else:
        typer.echo("Resolution order (first match wins):")
        for i, step in enumerate(resolution.order, 1):
            typer.echo(f"  {i}. {step}")
        if resolution.libtorch is not None:
            data = resolution.libtorch.to_data()
            typer.echo(f"Resolved: {data['path']} (from {data['source']}): {_describe(data)}")
            if data["sha256"]:
                typer.echo(f"Downloaded by fdl: archive sha256 {data['sha256']} (pin it in fdl.yml: libtorch: "
                           f"sha256: {{{data['variant'] or 'VARIANT'}: {data['sha256']}}})")
            else:
                typer.echo("Not downloaded by fdl: no archive SHA-256 is recorded for it.")
        else:
            typer.echo(f"Resolved: nothing. {resolution.error}")
            typer.echo(f"  hint: {resolution.hint}")
    return 1 if resolution.libtorch is None else 0


@app.command("download")
def download(
    ctx: typer.Context,
    variant: Annotated[str | None, typer.Argument(metavar="VARIANT",
                                                  help="cpu, cu126, cu130, rocm7.2 (what PyTorch publishes for "
                                                       "the pinned release), cu128, rocm7.0, rocm7.1 (from a "
                                                       "mirror), or auto (picked for this box's GPUs).")] = None,
    cpu: Annotated[bool, typer.Option("--cpu", help="Shorthand for the cpu variant.")] = False,
    mirror: Annotated[str | None, typer.Option("--mirror", metavar="URL",
                                               help="Download from this mirror instead of PyTorch's own location "
                                                    f"(default: {FDL_LIBTORCH_MIRROR}, then libtorch.mirror, then "
                                                    "join.libtorch_mirror in fdl.yml).")] = None,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Download a variant into ~/.flodl/libtorch: verified (HTTPS, CRCs, build-version, pins), installed in one
    step, or not at all."""
    from fdl.hostside.libtorch.variants import CHOICES
    from fdl.libtorch import manage
    from fdl.libtorch.source import choose_source

    if cpu and variant not in (None, "cpu"):
        raise typer.BadParameter(f"--cpu and {variant} name different variants; give one.")
    name = "cpu" if cpu else variant
    if name is None:
        raise typer.BadParameter(f"name a variant ({', '.join(CHOICES)}) or pass --cpu.")
    config = globals_of(ctx).config(required=False)
    block, join = config.libtorch, config.join
    source = choose_source(mirror, os.environ, block.mirror if block else None,
                           join.libtorch_mirror if join else None, block.sha256 if block else ())
    chosen = manage.choose_variant(name)
    if name == "auto":
        typer.echo(f"fdl: auto picked {chosen} for this box", err=True)
    bar = _ProgressBar(chosen) if sys.stderr.isatty() and not as_json else None
    try:
        installed, activated, active = manage.download(chosen, source=source, environ=os.environ, progress=bar,
                                                       note=lambda text: typer.echo(f"fdl: {text}", err=True))
    finally:
        if bar is not None:
            bar.finish()
    lt = installed.libtorch
    if as_json:
        typer.echo(json.dumps({"variant": installed.variant, "label": lt.label, "path": lt.path,
                               "downloaded": installed.acquired, "activated": activated, "active": active,
                               "sha256": lt.sha256, "source": source.base}, indent=2))
        return
    typer.echo(f"libtorch {lt.label} is installed in {lt.path}.")
    if lt.sha256:
        typer.echo(f"Archive sha256: {lt.sha256}")
    if activated:
        typer.echo("It is now the active variant (nothing was active before).")
    elif active:
        typer.echo("It is the active variant.")
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
    from fdl.libtorch import manage

    chosen = manage.activate(variant, _project_root(ctx), os.environ)
    data = chosen.to_data()
    typer.echo(f"Active libtorch in {chosen.root}: {data['label']} ({_describe(data)}).")


@app.command("remove")
def remove(
    ctx: typer.Context,
    variant: Annotated[str, typer.Argument(metavar="VARIANT",
                                           help="An installed variant: precompiled/cu128, builds/NAME, or a "
                                                "download name such as cpu.")],
    force: Annotated[bool, typer.Option("--force", help="Remove it even when it is the active variant (its "
                                                        ".active goes with it).")] = False,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Remove an installed variant in one step; clears a .active that names a variant no longer there."""
    from fdl.libtorch import manage

    done = manage.remove(variant, _project_root(ctx), os.environ, force=force)
    if as_json:
        typer.echo(json.dumps(done.to_data(), indent=2))
        return
    where = f"{done.root}/{done.label}"
    if done.removed:
        typer.echo(f"Removed libtorch {done.label} ({where}).")
    else:
        typer.echo(f"libtorch {done.label} was not installed in {done.root}, but its .active named it: cleared.")
    if done.active_cleared:
        if len(done.remaining) == 1:
            typer.echo(f"No variant is marked active in {done.root} now; its only variant, {done.remaining[0]}, "
                       f"is what fdl probe resolves there.")
        elif done.remaining:
            typer.echo(f"No variant is active in {done.root} now: fdl libtorch activate {done.remaining[0]} "
                       f"(installed: {', '.join(done.remaining)})")
        else:
            typer.echo(f"No variant is left in {done.root}.")


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
