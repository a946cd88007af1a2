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
2 a permanent failure, decided once before the first dial from this box's
own configuration (a spec or option that does not parse, no GPU when GPUs
are asked for, a binary or toolchain it names and lacks, an unreadable
identity file, no known_hosts entry for its door, a stage its own
permissions or a read-only file system forbid); 1 anything else (the
controller, the network, disks and mounts, the fetched tree, the build).
--persist re-dials everything but 2.
"""


def join(
    ctx: typer.Context,
    address: Annotated[str | None, typer.Argument(
        metavar="[CONTROLLER]", help="Controller address host[:port] (default port 1337); same as --controller.",
        show_default=False)] = None,
    **flags: Any,
) -> int:
    """The options after CONTROLLER are the join settings' flags (`_flag_parameters`), passed as `flags`."""
    from fdl.agent.agent import JoinAgent, print_note
    from fdl.agent.failures import Stopped
    from fdl.agent.permanent import read_options
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
    options = read_options(lambda: g.config(required=False), flags, tail(ctx))
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
