"""`fdl status [--addr HOST[:PORT]] [--json] [--watch [--interval S]]`: the live state of a cluster run."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from fdl.cli._controller import Timeout, addr_option, print_json, resolve_target
from fdl.cli.context import Globals

app = typer.Typer(rich_markup_mode=None, add_completion=False)
Addr = addr_option("ask")


@app.command()
def status(
    ctx: typer.Context,
    addr: Addr = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw state.json on stdout.")] = False,
    timeout: Timeout = 5.0,
    watch: Annotated[bool, typer.Option("--watch", "-w",
                                        help="Keep watching: a live view on a terminal, one line per look "
                                             "otherwise (one JSON state per line with --json), until the run "
                                             "ends.")] = False,
    interval: Annotated[float | None, typer.Option("--interval", min=0.1, max=3600, metavar="SECONDS",
                                                   help="With --watch: seconds between looks (default 1).")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="With --watch: when no run is listening yet, wait for one "
                                                      "to appear (Ctrl-C stops) instead of exiting 1.")] = False,
) -> None:
    """Show a run's phase, who joined with what hardware, the window countdowns and the start switch.

    Exit 0 when the state was fetched and printed; 1 when no controller answered (connection refused
    reads as "no run listening": the endpoint lives only as long as its launcher). With --watch: exit 0
    when the run ends and succeeded, or on Ctrl-C; 1 when it failed or its outcome is unknown, no run was there
    to watch (without --wait), or the controller stopped answering for 30 s. The last line says the outcome.
    """
    from fdl.controller.address import ask
    from fdl.controller.client import NoRunListening
    from fdl.controller.render import render_state, start_line
    from fdl.errors import UsageError

    if interval is not None and not watch:
        raise UsageError("--interval only applies with --watch.")
    if wait and not watch:
        raise UsageError("--wait only applies with --watch.")

    g: Globals = ctx.find_object(Globals)
    target = resolve_target(g, addr)
    waiting = False
    while True:
        try:
            address, state = ask(target, lambda client: client.state(), timeout=timeout)
            break
        except NoRunListening as exc:
            if not wait:
                typer.echo(f"fdl: {exc.message}: the controller lives only as long as its launcher, so no run is "
                           f"in progress there.", err=True)
                raise typer.Exit(1) from None
            if not waiting:
                waiting = True
                typer.echo(f"fdl: no run listening yet at {', '.join(target.addresses)}; waiting for one "
                           f"(Ctrl-C stops)", err=True)
            try:
                time.sleep(1.0 if interval is None else interval)
            except KeyboardInterrupt:
                typer.echo("fdl: stopped waiting; no run appeared", err=True)
                raise typer.Exit(1) from None
            target = _rediscover(g, addr, target)
    if address != target.primary:
        typer.echo(f"fdl: note: {target.primary} did not answer; found the run on {address}", err=True)
    from_env = target.source == "cluster.controller"
    fire = start_line(address, env=g.env.name if from_env else None, from_env=from_env)
    if watch:
        _watch(address, fire, interval=1.0 if interval is None else interval, timeout=timeout, as_json=as_json)
        return
    if as_json:
        print_json(state)
        return
    typer.echo(render_state(state, address, fire), nl=False)


def _watch(address: str, fire: str, *, interval: float, timeout: float, as_json: bool) -> None:
    from fdl.controller.client import ControllerClient
    from fdl.controller.watch import Watcher

    with ControllerClient(address, timeout=min(timeout, max(interval, 2.0))) as client:
        watcher = Watcher(client, interval=interval, start_cmd=fire)
        if as_json:
            end = watcher.run_json(sys.stdout)
            typer.echo(f"fdl: {end.message}", err=True)
        elif sys.stdout.isatty():
            end = watcher.run_live(sys.stdout)
        else:
            end = watcher.run_plain(sys.stdout)
    if end.how == "lost":
        raise typer.Exit(1)
    if end.how == "ended":
        from fdl.controller.watch import outcome
        from fdl.launch.live import kept_state

        line, code = outcome(end, kept_state)
        typer.echo(f"fdl: {line}", err=as_json)
        raise typer.Exit(code)


def _rediscover(g: Globals, addr: str | None, target):
    """Ask again where to look (a launcher that started meanwhile records its address); quietly."""
    if addr:
        return target
    from fdl.controller.address import resolve

    try:
        return resolve(None, lambda: g.config(required=False).cluster)
    except Exception:
        return target
