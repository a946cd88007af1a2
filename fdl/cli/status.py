"""`fdl status [--addr HOST[:PORT]] [--json] [--watch [--interval S]]`: the live state of a cluster run."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from fdl.cli._controller import Timeout, addr_option, given_token, print_json, resolve_target, token_file_option
from fdl.cli.context import Globals, globals_of
from fdl.cli.options import json_option
from fdl.hostside.envvars import FDL_JOIN_TOKEN

if TYPE_CHECKING:
    from fdl.controller.address import Target

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def status(
    ctx: typer.Context,
    addr: Annotated[str | None, addr_option("ask")] = None,
    as_json: Annotated[bool, json_option("Print the raw state.json on stdout.")] = False,
    timeout: Timeout = 5.0,
    watch: Annotated[bool, typer.Option("--watch", "-w",
                                        help="Keep watching: a live view on a terminal, one line per look "
                                             "otherwise (one JSON state per line with --json), until the run "
                                             "ends.")] = False,
    interval: Annotated[float | None, typer.Option("--interval", min=0.1, max=3600, metavar="SECONDS",
                                                   help="With --watch: seconds between looks (default 1).")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="With --watch: when no run is listening yet, wait for one "
                                                      "to appear (Ctrl-C stops) instead of exiting 1.")] = False,
    token_file: Annotated[str | None, token_file_option()] = None,
) -> int:
    """Show a run's phase, who joined with what hardware, the window countdowns and the start switch.

    Exit 0 when the state was fetched and printed; 1 when no controller answered (connection refused
    reads as "no run listening": the endpoint lives only as long as its launcher), or, with the run's token
    (--token-file, FDL_JOIN_TOKEN, the env or this user's own launcher run), when the answer does not prove
    it. Without a token the state is printed marked unverified. With --watch: exit 0
    when the run ends and succeeded, as a state that proved the run's token said (signed requests, with
    the token from --token-file, FDL_JOIN_TOKEN, the env or this user's own launcher run), or on Ctrl-C;
    1 when it failed, its outcome is unknown or unverified (no token), no run was there to watch (without
    --wait), or the controller stopped answering for 30 s. The last line says the outcome.
    """
    from fdl.cli.render.status import render_state, start_line
    from fdl.controller.address import ask
    from fdl.controller.client import NoRunListening
    from fdl.errors import Outcome, UsageError

    if interval is not None and not watch:
        raise UsageError("--interval only applies with --watch.")
    if wait and not watch:
        raise UsageError("--wait only applies with --watch.")

    g = globals_of(ctx)
    presented = given_token(token_file)
    target = resolve_target(g, addr)
    waiting = False
    while True:
        try:
            # With a token (given, or found for the address) a plain look is signed and only a proved answer
            # counts; --watch only finds the address here, and proves every look it takes afterwards.
            address, (state, verified) = ask(
                target, lambda client: (client.state(prove=not watch), client.proves and not watch),
                timeout=timeout, token=presented)
            break
        except NoRunListening as exc:
            if not wait:
                raise Outcome(f"{exc.message}: the controller lives only as long as its launcher, so no run is "
                              f"in progress there.") from None
            if not waiting:
                waiting = True
                typer.echo(f"fdl: no run listening yet at {', '.join(target.addresses)}; waiting for one "
                           f"(Ctrl-C stops)", err=True)
            try:
                time.sleep(1.0 if interval is None else interval)
            except KeyboardInterrupt:
                raise Outcome("stopped waiting; no run appeared") from None
            target = _rediscover(g, addr, target)
    if address != target.primary:
        typer.echo(f"fdl: note: {target.primary} did not answer; found the run on {address}", err=True)
    from_env = target.source == "cluster.controller"
    token = presented or target.token_for(address)
    fire = start_line(address, env=g.env.name if from_env else None, from_env=from_env, token_file=token_file,
                      token_found=presented is not None or target.token_for(address) is not None)
    if watch:
        return _watch(address, fire, interval=1.0 if interval is None else interval, timeout=timeout,
                      as_json=as_json, token=token)
    if not verified:
        typer.echo(f"fdl: note: unverified: no token for {address} ({FDL_JOIN_TOKEN}, --token-file, the env's "
                   f"join.token or this user's own run), so this state proves nothing: anything that answers there "
                   f"could have sent it", err=True)
    if as_json:
        print_json(state)
    else:
        typer.echo(render_state(state, address, fire, verified=verified), nl=False)
    return 0


def _watch(address: str, fire: str, *, interval: float, timeout: float, as_json: bool, token: str | None) -> int:
    """Follow the run to its end; the exit code says how it ended (0 succeeded, proven, or Ctrl-C; 1 otherwise)."""
    from fdl.cli.render.status import watch_json, watch_live, watch_plain
    from fdl.controller.client import ControllerClient
    from fdl.controller.watch import Watcher

    if token is None:
        typer.echo(f"fdl: note: no token for {address} (--token-file, {FDL_JOIN_TOKEN}): the states shown are "
                   f"unverified, so the watch cannot end in a verdict of success", err=True)
    with ControllerClient(address, timeout=min(timeout, max(interval, 2.0)), token=token) as client:
        watcher = Watcher(client, interval=interval)
        if as_json:
            end = watch_json(watcher, sys.stdout)
            typer.echo(f"fdl: {end.message}", err=True)
        elif sys.stdout.isatty():
            end = watch_live(watcher, sys.stdout, start_cmd=fire)
        else:
            end = watch_plain(watcher, sys.stdout, start_cmd=fire)
    if end.how == "lost":
        return 1
    if end.how == "ended":
        from fdl.controller.live import kept_state
        from fdl.controller.watch import outcome

        line, code = outcome(end, kept_state)
        typer.echo(f"fdl: {line}", err=as_json)
        return code
    return 0


def _rediscover(g: Globals, addr: str | None, target: Target) -> Target:
    """Ask again where to look (a launcher that started meanwhile records its address); quietly."""
    if addr:
        return target
    from fdl.controller.address import resolve

    try:
        return resolve(None, lambda: g.config(required=False).cluster)
    except Exception:
        return target
