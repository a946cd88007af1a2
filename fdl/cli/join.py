"""`fdl join [CONTROLLER] [OPTIONS] [-- ARGS...]`: join a cluster run's window as a self-deployed worker."""

from __future__ import annotations

import inspect
import os
import signal
import sys
from typing import Annotated, Any

import typer

from fdl.cli.context import globals_of
from fdl.cli.tail import TailCommand, tail
from fdl.config.join_fields import SETTINGS, flag_of, flag_type
from fdl.errors import ConfigError, PermanentError
from fdl.hostside.checks.devices import Devices

app = typer.Typer(rich_markup_mode=None, add_completion=False)

HELP = """Join a cluster run's window as a self-deployed worker.

Prepares this box (GPU check, dataset root, writable stage, libtorch, the
training binary, its model signature), dials the controller's join channel,
offers this box's devices and, once the world forms, runs this host's ranks
with the environment the controller assigned. Every option defaults from the
join: block of fdl.yml; options win. Arguments after a standalone -- go to
the training binary verbatim (they must match the run).

Exit code: one-shot, the ranks' own code (0: this host finished cleanly);
1 a transient failure (controller unreachable, refused, an answer that does
not prove the run's token, an ssh door that refused or dropped the session,
mount or fetch failed, source did not compile); 2 a permanent one, decided
from this box alone (no GPU, a spec that does not parse, missing binary or
toolchain, unwritable stage, the door's host key not accepted by this box's
known_hosts, an unreadable identity file). --persist re-dials everything but 2.
"""


def join(
    ctx: typer.Context,
    address: Annotated[str | None, typer.Argument(
        metavar="[CONTROLLER]", help="Controller address host[:port] (default port 1337); same as --controller.",
        show_default=False)] = None,
    **flags: Any,
) -> int:
    """The options after CONTROLLER are the join settings' flags (`_flag_parameters`), passed as `flags`."""
    from fdl.agent.agent import JoinAgent, Stopped, print_note
    from fdl.agent.options import resolve_options
    from fdl.agent.secrecy import seal
    from fdl.signals import die_of, stop_on

    g = globals_of(ctx)
    controller = flags["controller"]
    if address is not None and controller is not None and address != controller:
        from fdl.errors import UsageError

        raise UsageError(f"two controller addresses given ({address} and --controller {controller}); give one.")
    flags["controller"] = address or controller
    if flags["devices"] is None and g.gpus is not None and g.gpus.ids is not None:
        flags["devices"] = Devices(ids=g.gpus.ids)
    try:
        config = g.config(required=False)
    except ConfigError as exc:  # a worker's config that does not parse will not parse on the next dial either
        raise PermanentError(exc.message, hint=exc.hint) from None
    options = resolve_options(config.join, flags, tail(ctx), libtorch_block=config.libtorch)
    note = print_note()
    for remains in seal():  # the token is read: out of the environment, and the agent closed to its account
        note(f"warning: {remains}; ranks run as this account (docs/controller.md, \"What a rank can read\")")
    agent = JoinAgent(options, note=note, environ=dict(os.environ))
    try:
        with stop_on(Stopped):  # SIGTERM/SIGINT/SIGHUP stop the agent cleanly once; a second one kills
            code = agent.run()
    except Stopped as stopped:
        # The teardown is done (ranks stopped, exit reported, tunnel closed). Die of the same signal, so
        # whoever started us sees what happened: a shell reads 128+N, and systemd counts a SIGTERM death
        # as a clean stop (an exit code of 143 would be a failure).
        print(f"fdl: join: stopped by {signal.Signals(stopped.signum).name}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        die_of(stopped.signum)
        return 128 + stopped.signum  # only reached when the signal is blocked
    return code


def _flag_parameters() -> list[inspect.Parameter]:
    """One keyword parameter per join setting that is a flag, typed and documented by its declaration."""
    out = []
    for name, setting in SETTINGS:
        if not setting.cli:
            continue
        decls = flag_of(name) + (f"/{setting.off}" if setting.off else "")
        option = typer.Option(decls, metavar=setting.metavar, help=setting.help, envvar=setting.envvar,
                              show_envvar=setting.envvar is not None, show_default=False)
        out.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                     annotation=Annotated[flag_type(setting) | None, option]))
    return out


def _declare_flags(command: Any) -> Any:
    """Give `command` the join settings' flags: typer reads a function's signature and annotations."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values()
           if p.kind is not inspect.Parameter.VAR_KEYWORD]
    flags = _flag_parameters()
    command.__signature__ = inspect.Signature([*own, *flags])
    command.__annotations__ = {p.name: p.annotation for p in (*own, *flags)}
    return command


app.command(name="join", cls=TailCommand, help=HELP,
            context_settings={"help_option_names": ["-h", "--help"]})(_declare_flags(join))
