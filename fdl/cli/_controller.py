"""What the commands that talk to a run's controller (`fdl status`, `fdl start`) share: options, address, JSON."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from fdl.cli.context import Globals

Timeout = Annotated[float, typer.Option("--timeout", min=0.1, max=300, metavar="SECONDS",
                                        help="How long to wait for an answer.")]


def addr_option(verb: str):
    """The --addr option type; `verb` says what the command does to the controller ("ask", "fire")."""
    return Annotated[str | None, typer.Option("--addr", metavar="HOST[:PORT]",
                                              help=f"Controller to {verb} (default port 1337). Default: the "
                                                   f"active env's cluster.controller, else 127.0.0.1:1337.")]


def resolve_target(g: Globals, addr: str | None):
    """The controller to dial (--addr, else the active env's, else loopback); its note goes to stderr."""
    from fdl.controller.address import resolve

    target = resolve(addr, lambda: g.config(required=False).cluster)
    if target.note:
        typer.echo(f"fdl: note: {target.note}", err=True)
    return target


def print_json(value) -> None:
    json.dump(value, sys.stdout, indent=2)
    sys.stdout.write("\n")
