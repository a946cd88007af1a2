"""`fdl start [--addr HOST[:PORT]] [--token-file FILE] [--json]`: fire a staging run's start switch."""

from __future__ import annotations

from typing import Annotated

import typer

from fdl.cli._controller import Timeout, addr_option, given_token, print_json, resolve_target, token_file_option
from fdl.cli.context import globals_of
from fdl.cli.options import json_option
from fdl.hostside.envvars import FDL_JOIN_TOKEN

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def start(
    ctx: typer.Context,
    addr: Annotated[str | None, addr_option("fire")] = None,
    token_file: Annotated[str | None, token_file_option()] = None,
    token: Annotated[str | None, typer.Option("--token", metavar="HEX",
                                              help="The run's join token on the command line, where every user of "
                                                   f"this box can read it: prefer {FDL_JOIN_TOKEN} or "
                                                   "--token-file.")] = None,
    as_json: Annotated[bool, json_option("Print the controller's answer as JSON on stdout.")] = False,
    timeout: Timeout = 5.0,
) -> None:
    """Fire the start switch of a staging run (start: manual or hybrid): the world forms now.

    Every start proves the run's token (from the controller box too): --token-file, FDL_JOIN_TOKEN, the
    env's cluster.controller.join.token, or, for this user's own launcher run, the run's token file.
    Refusals name their reason (auto mode, quorum not met, window closed, bad token) and are never
    queued. Exit 0 when armed, 1 otherwise (an answer that cannot prove it comes from the run included).
    """
    from fdl.cli.render.start import render_start
    from fdl.controller.address import ask
    from fdl.controller.client import ControllerRefused, NoRunListening
    from fdl.errors import Outcome

    target = resolve_target(globals_of(ctx), addr)
    presented = given_token(token_file, token)
    try:
        address, answer = ask(target, lambda client: client.start(), timeout=timeout, token=presented)
    except NoRunListening as exc:
        raise Outcome(f"{exc.message}: the controller lives only as long as its launcher, so there is no run "
                      f"to start there.") from None
    except ControllerRefused as exc:
        if as_json:
            print_json(exc.payload)
        hint = None
        if exc.reason == "bad_token" and presented is None and target.token_for(exc.address) is None:
            hint = ("No token was found for that address: give the run's token with --token-file FILE or "
                    f"{FDL_JOIN_TOKEN} (the launcher's user finds its own run's token without either).")
        raise Outcome(f"start refused by {exc.address}: {exc.message} [{exc.reason}]", hint=hint) from None
    # An answer that does not prove the run's token (UnverifiedController) is no answer: exit 1, as raised.
    if as_json:
        print_json(answer)
    else:
        typer.echo(render_start(answer, address), nl=False)
