"""`fdl join [CONTROLLER] [OPTIONS] [-- ARGS...]`: join a cluster run's window as a self-deployed worker."""

from __future__ import annotations

import os
import signal
import sys
from typing import Annotated, Any

import typer

from fdl.cli.context import Globals
from fdl.cli.tail import TailCommand, tail
from fdl.errors import ConfigError, ExitCode

app = typer.Typer(rich_markup_mode=None, add_completion=False)

HELP = """Join a cluster run's window as a self-deployed worker.

Prepares this box (GPU check, dataset root, writable stage, libtorch, the
training binary, its model signature), dials the controller's join channel,
offers this box's devices and, once the world forms, runs this host's ranks
with the environment the controller assigned. Every option defaults from the
join: block of fdl.yml; options win. Arguments after a standalone -- go to
the training binary verbatim (they must match the run).

Exit code: one-shot, the ranks' own code (0: this host finished cleanly);
1 a transient failure (controller unreachable, refused by an open window,
mount or fetch failed, source did not compile); 2 a permanent one (no GPU,
a spec that does not parse, missing binary or toolchain, unwritable stage,
bad token). --persist re-dials everything but 2.
"""


@app.command(name="join", cls=TailCommand, help=HELP,
             context_settings={"help_option_names": ["-h", "--help"]})
def join(
    ctx: typer.Context,
    address: Annotated[str | None, typer.Argument(
        metavar="[CONTROLLER]", help="Controller address host[:port] (default port 1337); same as --controller.",
        show_default=False)] = None,
    controller: Annotated[str | None, typer.Option(
        "--controller", metavar="HOST[:PORT]",
        help="Controller address. With --ssh, as seen FROM the ssh host (default 127.0.0.1:1337).")] = None,
    ssh: Annotated[str | None, typer.Option(
        "--ssh", metavar="[USER@]HOST[:PORT]",
        help="Reach the controller through this sshd: an ssh -L forward of its port, torn down on exit.")] = None,
    identity: Annotated[str | None, typer.Option(
        "--identity", metavar="KEY", help="Private key for the tunnel (ssh -i); also used by sshfs and rsync.")] = None,
    token: Annotated[str | None, typer.Option(
        "--token", metavar="HEX", envvar="FDL_JOIN_TOKEN", show_envvar=True,
        help="The run's pre-shared token (controller.join.token). Prefer FDL_JOIN_TOKEN: argv is public.")] = None,
    bin_: Annotated[str | None, typer.Option(
        "--bin", metavar="PATH", help="Training binary on this box (exclusive with --source).")] = None,
    source: Annotated[str | None, typer.Option(
        "--source", metavar="SPEC",
        help="Fetch and build here: file:///abs, rsync://[user@]host[:port]:/abs or git+https://host/o/r#ref.")] = None,
    source_cwd: Annotated[str | None, typer.Option(
        "--source-cwd", metavar="DIR", help="Project directory inside the fetched tree (default: its root).")] = None,
    source_build: Annotated[str | None, typer.Option(
        "--source-build", metavar="RECIPE",
        help="Build recipe, a shell line (default: cargo build --release); gets LIBTORCH_PATH, FDL_GPU_FEATURE, "
             "LD_LIBRARY_PATH.")] = None,
    source_bin: Annotated[str | None, typer.Option(
        "--source-bin", metavar="PATH", help="Built artifact relative to the project dir, e.g. "
                                             "target/release/train.")] = None,
    libtorch: Annotated[str | None, typer.Option(
        "--libtorch", metavar="VARIANT",
        help="Acquire libtorch into ~/.flodl/libtorch first: auto, cpu, cu126, cu128, rocm7.0, rocm7.1 "
             "(default: whatever is active here).")] = None,
    host: Annotated[str | None, typer.Option(
        "--host", metavar="NAME", help="Name in the roster (default: this machine's hostname).")] = None,
    devices: Annotated[str | None, typer.Option(
        "--devices", metavar="IDS", help="GPU ids to offer, e.g. 0,1 (default: all); cpu:N for N CPU ranks.")] = None,
    persist: Annotated[bool | None, typer.Option(
        "--persist/--no-persist", help="Keep re-dialing across runs with backoff; stop only on exit 2.",
        show_default=False)] = None,
    data_path: Annotated[str | None, typer.Option(
        "--data-path", metavar="DIR", help="Dataset root on this box, shipped to the ranks (default "
                                           "/flodl/data when --data-source is set).")] = None,
    data_source: Annotated[str | None, typer.Option(
        "--data-source", metavar="sshfs://USER@HOST:/PATH",
        help="Mount the dataset root read-only from there when it is not already in place.")] = None,
    gpu_ram_share: Annotated[float | None, typer.Option(
        "--gpu-ram-share", metavar="FRACTION",
        help="APU boxes: the share of host RAM the integrated GPU may use, e.g. 0.5; shipped to the ranks.")] = None,
    no_sig_probe: Annotated[bool | None, typer.Option(
        "--no-sig-probe/--sig-probe", help="Skip the pre-dial model-signature probe.", show_default=False)] = None,
) -> None:
    from fdl.agent.agent import JoinAgent, Stopped, print_note
    from fdl.agent.options import resolve_options
    from fdl.signals import die_of, stop_on

    g: Globals = ctx.find_object(Globals)
    if address is not None and controller is not None and address != controller:
        from fdl.errors import UsageError

        raise UsageError(f"two controller addresses given ({address} and --controller {controller}); give one.")
    if devices is None and g.gpus is not None and g.gpus.ids is not None:
        devices = ",".join(map(str, g.gpus.ids))
    try:
        defaults = g.config(required=False).join
    except ConfigError as exc:  # a worker's config that does not parse will not parse on the next dial either
        exc.exit_code = ExitCode.PERMANENT
        raise
    flags: dict[str, Any] = {
        "controller": address or controller, "ssh": ssh, "identity": identity, "token": token, "bin": bin_,
        "source": source, "source_cwd": source_cwd, "source_build": source_build, "source_bin": source_bin,
        "libtorch": libtorch, "host": host, "devices": devices, "persist": persist, "data_path": data_path,
        "data_source": data_source, "gpu_ram_share": gpu_ram_share, "no_sig_probe": no_sig_probe,
    }
    options = resolve_options(defaults, flags, tail(ctx))
    note = print_note()
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
        raise typer.Exit(128 + stopped.signum) from None  # only reached when the signal is blocked
    raise typer.Exit(code)
