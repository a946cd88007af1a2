"""`fdl start [--addr HOST[:PORT]] [--token HEX] [--json]`: fire a staging run's start switch."""

from __future__ import annotations

from typing import Annotated

import typer

from fdl.cli._controller import Timeout, addr_option, print_json, resolve_target
from fdl.cli.context import Globals

app = typer.Typer(rich_markup_mode=None, add_completion=False)
Addr = addr_option("fire")


@app.command()
def start(
    ctx: typer.Context,
    addr: Addr = None,
    token: Annotated[str | None, typer.Option("--token", metavar="HEX",
                                              help="The run's join token; needed unless fired from the controller "
                                                   "box (loopback). Default: the active env's "
                                                   "cluster.controller.join.token when the address comes from "
                                                   "that env.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the controller's answer as JSON on stdout.")] = False,
    timeout: Timeout = 5.0,
) -> None:
    """Fire the start switch of a staging run (start: manual or hybrid): the world forms now.

    Refusals name their reason (auto mode, quorum not met, window closed, bad token) and are never
    queued. Exit 0 when armed, 1 otherwise.
    """
    from fdl.controller.address import ask
    from fdl.controller.client import ControllerRefused, NoRunListening, UnverifiedController
    from fdl.controller.render import render_start

    g: Globals = ctx.find_object(Globals)
    target = resolve_target(g, addr)
    presented = token if token is not None else target.token
    try:
        address, answer = ask(target, lambda client: client.start(), timeout=timeout, token=presented)
    except NoRunListening as exc:
        typer.echo(f"fdl: {exc.message}: the controller lives only as long as its launcher, so there is no run "
                   f"to start there.", err=True)
        raise typer.Exit(1) from None
    except UnverifiedController as exc:
        typer.echo(f"fdl: {exc.message}." + (f" {exc.hint}" if exc.hint else ""), err=True)
        raise typer.Exit(2) from None
    except ControllerRefused as exc:
        if as_json:
            print_json(exc.payload)
        typer.echo(f"fdl: start refused by {exc.address}: {exc.message} [{exc.reason}]", err=True)
        raise typer.Exit(1) from None
    if as_json:
        print_json(answer)
        return
    typer.echo(render_start(answer, address), nl=False)
