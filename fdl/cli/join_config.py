"""`fdl join-config LABEL`: the once-per-farm wizard (keys, token, overlay, sshd door, setup steps)."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from fdl.cli.context import Globals
from fdl.cli.options import json_option
from fdl.hostside.paths import DEFAULT_DATA_PATH, SERVED_IN_HOME

app = typer.Typer(rich_markup_mode=None, add_completion=False)


class Door(StrEnum):
    a = "a"
    b = "b"
    tunnel_only = "tunnel-only"


class TtyPrompter:
    """Questions on stderr (stdout carries the report), answers from stdin."""

    def choose(self, question: str, choices: tuple[str, ...], default: str) -> str:
        import click

        return click.prompt(question, default=default, type=click.Choice(list(choices)), err=True)

    def text(self, question: str, default: str) -> str:
        return typer.prompt(question, default=default, err=True)

    def confirm(self, question: str, default: bool) -> bool:
        return typer.confirm(question, default=default, err=True)


@app.command(context_settings={"help_option_names": ["-h", "--help"]})
def join_config(
    ctx: typer.Context,
    label: Annotated[str | None, typer.Argument(
        help="The farm's name: it becomes the env overlay fdl.LABEL.yml (default: the env selected with @LABEL).",
        show_default=False)] = None,
    door: Annotated[Door | None, typer.Option(
        "--door", help="a: read-only sftp for mounting data; b: read-only rsync of the published run (rrsync); "
                       "tunnel-only: the forward to the controller port and nothing else. Default on a re-run: "
                       "the farm's own.", show_default=False)] = None,
    controller: Annotated[str | None, typer.Option(
        "--controller", metavar="[USER@]HOST[:PORT]",
        help="The controller box as workers reach its sshd door (default port 2222). Default on a re-run: "
             "the farm's own.", show_default=False)] = None,
    port: Annotated[int | None, typer.Option(
        "--port", help="The training port workers forward to (the controller's join channel; default 1337).",
        show_default=False)] = None,
    served: Annotated[str | None, typer.Option(
        "--served", metavar="DIR",
        help=f"Door a: the directory served read-only over sftp (default {DEFAULT_DATA_PATH}). Door b: the served "
             f"directory of fdl publish --to, which rrsync scopes the key to (default {SERVED_IN_HOME}).",
        show_default=False)] = None,
    inherit_from: Annotated[str | None, typer.Option(
        "--inherit-from", metavar="ENV", help="Start the new overlay from another env overlay (farms sharing a base).",
        show_default=False)] = None,
    regen: Annotated[bool, typer.Option(
        "--regen", help="Rotate the farm's key and token together (a new farm instantiation): workers holding the "
                        "old ones stop being admitted.")] = False,
    install_key: Annotated[bool | None, typer.Option(
        "--install-key/--no-install-key",
        help="Install the door's key line into ~/.ssh/authorized_keys (or --authorized-keys). Only this or a yes "
             "at the prompt consents; --yes does not.", show_default=False)] = None,
    authorized_keys: Annotated[str | None, typer.Option(
        "--authorized-keys", metavar="PATH",
        help="Install into this key file instead (an sshd in a container, AuthorizedKeysFile elsewhere). Its "
             "directory is left exactly as found; paths under /etc/ssh are refused.", show_default=False)] = None,
    cloud_init: Annotated[bool, typer.Option(
        "--cloud-init", help="Also write cloud-init user-data that turns a fresh worker into a member of this "
                             "farm.")] = False,
    sshd_config: Annotated[str, typer.Option(
        "--sshd-config", metavar="PATH",
        help="The sshd configuration the doctor reads (read only; the drop-in goes to its sshd_config.d/).")]
        = "/etc/ssh/sshd_config",
    jail_dir: Annotated[str | None, typer.Option(
        "--jail-dir", metavar="DIR",
        help="Door a: where the jailed account's home and chroot go, DIR/LABEL (default /var/lib/fdl-doors). "
             "Every directory up to the chroot must be root-owned and not writable by others.",
        show_default=False)] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Accept the default of every ordinary question.")] = False,
    as_json: Annotated[bool, json_option("Print the report as JSON on stdout (secrets as file paths, never their "
                                         "contents); notes go to stderr. Asks nothing.")] = False,
) -> None:
    """Set up a farm on this controller box: key, token, overlay, sshd door and the steps to open it.

    Exit 0 with the report; 1 on a refusal (contradictory flags, a decision needed without a terminal,
    a permission that cannot be fixed).
    """
    from fdl.cli.render.join_config import render_doctor, render_header, render_json, render_rest
    from fdl.farm.wizard.apply import apply
    from fdl.farm.wizard.decide import decide
    from fdl.farm.wizard.plan import prepare
    from fdl.farm.wizard.shape import Request

    g = ctx.find_object(Globals)
    env = g.env if g is not None else None
    interactive = sys.stdin.isatty() and not as_json
    request = Request(
        label=label, env_label=env.name if env else None, env_source=env.source if env else None,
        door=door.value if door else None, controller=controller, port=port, served=served,
        inherit_from=inherit_from, regen=regen, install_key=install_key, authorized_keys=authorized_keys,
        cloud_init=cloud_init, sshd_config=sshd_config, jail_base=jail_dir, assume_yes=yes, interactive=interactive,
        cwd=Path.cwd(),
    )
    prompter = TtyPrompter() if interactive else None
    plan = prepare(request, prompter)
    if not as_json:
        typer.echo(render_header(plan))
        typer.echo(render_doctor(plan.findings))
    decisions = decide(plan, request, prompter)
    report = apply(plan, decisions, request.cwd)
    for note in report.notes:
        typer.echo(f"fdl: note: {note}", err=True)
    if as_json:
        typer.echo(render_json(report))
    else:
        typer.echo(render_rest(report, request.cwd))
