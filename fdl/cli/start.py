"""`fdl start [--addr HOST[:PORT]] [--token HEX] [--json]`: fire a staging run's start switch."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from fdl.cli.context import Globals

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def start(
    ctx: typer.Context,
    addr: Annotated[str | None, typer.Option("--addr", metavar="HOST[:PORT]",
                                             help="Controller to fire (default port 1337). Default: the active "
                                                  "env's cluster.controller, else 127.0.0.1:1337.")] = None,
    token: Annotated[str | None, typer.Option("--token", metavar="HEX",
                                              help="The run's join token; needed unless fired from the controller "
                                                   "box (loopback). Default: the active env's "
                                                   "cluster.controller.join.token when the address comes from "
                                                   "that env.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the controller's answer as JSON on stdout.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, max=300, metavar="SECONDS",
                                           help="How long to wait for an answer.")] = 5.0,
) -> None:
    """Fire the start switch of a staging run (start: manual or hybrid): the world forms now.

    Refusals name their reason (auto mode, quorum not met, window closed, bad token) and are never
    queued. Exit 0 when armed, 1 otherwise.
    """
    from fdl.controller.address import ask, resolve
    from fdl.controller.client import ControllerRefused, NoRunListening
    from fdl.controller.render import render_start

    g: Globals = ctx.find_object(Globals)
    target = resolve(addr, lambda: g.config(required=False).cluster)
    if target.note:
        typer.echo(f"fdl: note: {target.note}", err=True)
    presented = token if token is not None else target.token
    try:
        address, answer = ask(target, lambda client: client.start(presented), timeout=timeout)
    except NoRunListening as exc:
        typer.echo(f"fdl: {exc.message}: the controller lives only as long as its launcher, so there is no run "
                   f"to start there.", err=True)
        raise typer.Exit(1) from None
    except ControllerRefused as exc:
        if as_json:
            json.dump(exc.payload, sys.stdout, indent=2)
            sys.stdout.write("\n")
        typer.echo(f"fdl: start refused by {exc.address}: {exc.message} [{exc.reason}]", err=True)
        raise typer.Exit(1) from None
    if as_json:
        json.dump(answer, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    typer.echo(render_start(answer, address), nl=False)
