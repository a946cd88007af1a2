"""`fdl start [--addr HOST[:PORT]] [--token HEX] [--json]`: fire a staging run's start switch."""

from __future__ import annotations

from typing import Annotated

import typer

from fdl.cli._controller import Timeout, addr_option, print_json, resolve_target
from fdl.cli.context import globals_of
from fdl.cli.options import json_option

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def start(
    ctx: typer.Context,
    addr: Annotated[str | None, addr_option("fire")] = None,
    token: Annotated[str | None, typer.Option("--token", metavar="HEX",
                                              help="The run's join token; needed unless fired from the controller "
                                                   "box (loopback). Default: the active env's "
                                                   "cluster.controller.join.token when the address comes from "
                                                   "that env.")] = None,
    as_json: Annotated[bool, json_option("Print the controller's answer as JSON on stdout.")] = False,
    timeout: Timeout = 5.0,
) -> None:
    """Fire the start switch of a staging run (start: manual or hybrid): the world forms now.

    Refusals name their reason (auto mode, quorum not met, window closed, bad token) and are never
    queued. Exit 0 when armed, 1 otherwise (2 when the answer cannot prove it comes from the run).
    """
    from fdl.cli.render.start import render_start
    from fdl.controller.address import ask
    from fdl.controller.client import ControllerRefused, NoRunListening
    from fdl.errors import Outcome

    target = resolve_target(globals_of(ctx), addr)
    presented = token if token is not None else target.token
    try:
        address, answer = ask(target, lambda client: client.start(), timeout=timeout, token=presented)
    except NoRunListening as exc:
        raise Outcome(f"{exc.message}: the controller lives only as long as its launcher, so there is no run "
                      f"to start there.") from None
    except ControllerRefused as exc:
        if as_json:
            print_json(exc.payload)
        raise Outcome(f"start refused by {exc.address}: {exc.message} [{exc.reason}]") from None
    # An answer that does not prove the run's token (UnverifiedController) is permanent (exit 2), as raised.
    if as_json:
        print_json(answer)
    else:
        typer.echo(render_start(answer, address), nl=False)
