"""`fdl status [--addr HOST[:PORT]] [--json]`: the live state of a cluster run."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from fdl.cli.context import Globals

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def status(
    ctx: typer.Context,
    addr: Annotated[str | None, typer.Option("--addr", metavar="HOST[:PORT]",
                                             help="Controller to ask (default port 1337). Default: the active "
                                                  "env's cluster.controller, else 127.0.0.1:1337.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw state.json on stdout.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, max=300, metavar="SECONDS",
                                           help="How long to wait for an answer.")] = 5.0,
) -> None:
    """Show a run's phase, who joined with what hardware, the window countdowns and the start switch.

    Exit 0 when the state was fetched and printed; 1 when no controller answered (connection refused
    reads as "no run listening": the endpoint lives only as long as its launcher).
    """
    from fdl.controller.address import ask, resolve
    from fdl.controller.client import NoRunListening
    from fdl.controller.render import render_state

    g: Globals = ctx.find_object(Globals)
    target = resolve(addr, lambda: g.config(required=False).cluster)
    if target.note:
        typer.echo(f"fdl: note: {target.note}", err=True)
    try:
        address, state = ask(target, lambda client: client.state(), timeout=timeout)
    except NoRunListening as exc:
        typer.echo(f"fdl: {exc.message}: the controller lives only as long as its launcher, so no run is in "
                   f"progress there.", err=True)
        raise typer.Exit(1) from None
    if address != target.primary:
        typer.echo(f"fdl: note: {target.primary} did not answer; found the run on {address}", err=True)
    if as_json:
        json.dump(state, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    typer.echo(render_state(state, address), nl=False)
