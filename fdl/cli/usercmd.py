"""Project commands from fdl.yml `commands:`: `fdl NAME -- ARGS`."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from fdl.cli.context import globals_of
from fdl.config.schema import CommandSpec
from fdl.hostside.envvars import FDL_PORT


def make_command(spec: CommandSpec) -> Any:
    """A command that runs spec with the arguments given after it."""
    help_text = spec.description or (f"Runs: {spec.run}" if spec.run else f"Cluster run of {spec.bin}")
    app = typer.Typer(rich_markup_mode=None, add_completion=False)

    settings = {"ignore_unknown_options": True, "allow_interspersed_args": False,
                "help_option_names": ["-h", "--help"]}
    more = "\n\nArguments after -- are passed on, shell-quoted."

    def body(ctx: typer.Context, args: list[str] | None, no_prebuild: bool, port: int | None = None) -> int:
        from fdl.runcmd import run_project_command

        g = globals_of(ctx)
        config = g.config(required=True)
        if not spec.cluster and config.is_discovery_window:
            print(
                f"fdl: warning: '{spec.name}' is not a cluster command (no cluster: true), so under env "
                f"'{config.env.name}' it trains on this box only: no join window opens and no walk-ins are "
                f"admitted. Mark it cluster: true in fdl.yml to run it as a launcher.",
                file=sys.stderr,
            )
        return run_project_command(spec, list(args or []), config, g, no_prebuild=no_prebuild, port=port)

    if spec.cluster:
        @app.command(name=spec.name, help=help_text + "\n\nA launcher run: see docs/launcher.md." + more,
                     context_settings=settings)
        def launch(ctx: typer.Context,
                   args: Annotated[list[str] | None, typer.Argument(help="Arguments for every rank.")] = None,
                   no_prebuild: Annotated[bool, typer.Option(
                       "--no-prebuild", help="Skip the pre-flight per-host build; run the binaries already "
                                             "built.")] = False,
                   port: Annotated[int | None, typer.Option(
                       "--port", min=1, max=65535, metavar="N",
                       help=f"The controller's port for this run (default: {FDL_PORT}, else "
                            "cluster.controller.port, else 1337).")] = None) -> int:
            return body(ctx, args, no_prebuild, port)
    else:
        @app.command(name=spec.name, help=help_text + more, context_settings=settings)
        def run(ctx: typer.Context,
                args: Annotated[list[str] | None, typer.Argument(help="Arguments for the command.")] = None) -> int:
            return body(ctx, args, False)

    return typer.main.get_command(app)
