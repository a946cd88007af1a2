"""What the commands that talk to a run's controller (`fdl status`, `fdl start`) share: options, address, JSON."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer

from fdl.cli.context import Globals
from fdl.hostside.envvars import FDL_JOIN_TOKEN, read

if TYPE_CHECKING:
    from fdl.controller.address import Target

Timeout = Annotated[float, typer.Option("--timeout", min=0.1, max=300, metavar="SECONDS",
                                        help="How long to wait for an answer.")]


def addr_option(verb: str) -> Any:
    """The --addr option; `verb` says what the command does to the controller ("ask", "fire")."""
    return typer.Option("--addr", metavar="HOST[:PORT]",
                        help=f"Controller to {verb} (default port 1337). Default: the active env's "
                             f"cluster.controller, else 127.0.0.1:1337.")


def token_file_option() -> Any:
    """The --token-file option (the token's safe spelling: a file, not the command line)."""
    return typer.Option("--token-file", metavar="FILE",
                        help="A file holding the run's join token (e.g. the run's own 0600 token file). Default: "
                             f"{FDL_JOIN_TOKEN}, else the token found for the address (the env's "
                             "cluster.controller.join.token, or this user's live launcher run's token file).")


def given_token(token_file: str | None, token: str | None = None) -> str | None:
    """The token the user gave: --token-file, else --token, else FDL_JOIN_TOKEN; None when none was given."""
    from fdl.controller.address import read_token_file

    if token_file is not None:
        return read_token_file(token_file)
    if token:
        return token
    return read(FDL_JOIN_TOKEN).strip() or None


def resolve_target(g: Globals, addr: str | None) -> Target:
    """The controller to dial (--addr, else the active env's, else loopback); its note goes to stderr."""
    from fdl.controller.address import resolve

    target = resolve(addr, lambda: g.config(required=False).cluster)
    if target.note:
        typer.echo(f"fdl: note: {target.note}", err=True)
    return target


def print_json(value: Any, out: TextIO | None = None) -> None:
    """The JSON twin of a report (or a refusal): indented, on stdout."""
    out = sys.stdout if out is None else out
    json.dump(value, out, indent=2)
    out.write("\n")
