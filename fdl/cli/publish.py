"""`fdl publish [SOURCE] --bin PATH [flags] [-- ARGS]`: put a gated run where a fleet can pull it."""

from __future__ import annotations

import getpass
import json
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

from fdl.cli.context import globals_of
from fdl.cli.options import json_option
from fdl.cli.tail import TailCommand, tail
from fdl.hostside.paths import SERVED_IN_HOME

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command(
    cls=TailCommand,
    help=(
        "Publish a training run: fetch SOURCE into the served tree (<--to>/tree), build it once as a gate, and "
        "write the run manifest (.fdl-run.yml) that workers read. Everything after a standalone -- is the run's "
        "own arguments (an empty -- means: no arguments, overriding the publish: block).\n\n"
        "SOURCE is file:///abs/path, rsync://[user@]host[:port]:/abs/path or "
        "git+https://host/owner/repo#<tag|branch|sha>. Flags default from the publish: block of fdl.yml "
        "(flags win field by field). Exit code: 0 published, 1 otherwise."
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)
def publish(
    ctx: typer.Context,
    source: Annotated[str | None, typer.Argument(help="Where the run comes from: file:///abs/dir, "
                                                      "git+https://host/repo#ref or rsync://[user@]host:/dir "
                                                      "(default: publish.source in fdl.yml).",
                                                 show_default=False)] = None,
    bin_: Annotated[str | None, typer.Option("--bin", help="Built artifact relative to the project dir "
                                                           "(required here or in the publish: block).",
                                             metavar="PATH")] = None,
    cwd: Annotated[str | None, typer.Option("--cwd", help="Project directory inside the tree (default: its root).",
                                            metavar="DIR")] = None,
    build: Annotated[str | None, typer.Option("--build", help="Build recipe, a shell line "
                                                              "(default: cargo build --release).",
                                              metavar="SHELL")] = None,
    to: Annotated[str | None, typer.Option("--to", help=f"Served directory (default {SERVED_IN_HOME}); an rrsync -ro "
                                                        "key is scoped to exactly this.", metavar="DIR")] = None,
    identity: Annotated[str | None, typer.Option("--identity", help="ssh key for an rsync:// (or git+ssh://) "
                                                                    "source the controller pulls.",
                                                 metavar="KEY")] = None,
    no_build: Annotated[bool, typer.Option("--no-build", help="Skip the build gate (recorded as built: false "
                                                              "in the manifest).")] = False,
    gate: Annotated[list[str] | None, typer.Option("--gate", help="Extra check-build against another libtorch "
                                                                  "variant, e.g. precompiled/rocm70 "
                                                                  "(repeatable).", metavar="VARIANT")] = None,
    as_json: Annotated[bool, json_option("Print the report as JSON on stdout (notes on stderr).")] = False,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Fail at once when another publish holds the served "
                                                            "directory, instead of waiting for it.")] = False,
) -> None:
    from fdl.cli.render.publish import publish_json, render_publish
    from fdl.publish.report import worker_sources
    from fdl.publish.run import PublishFlags, resolve_request
    from fdl.publish.run import publish as do_publish

    g = globals_of(ctx)
    run_args = tail(ctx)
    flags = PublishFlags(source=source, bin=bin_, cwd=cwd, build=build, to=to, identity=identity,
                         gates=tuple(gate or ()), args=None if run_args is None else tuple(run_args),
                         no_build=no_build, no_wait=no_wait)

    def note(text: str) -> None:
        print(f"fdl publish: {text}", file=sys.stderr, flush=True)

    config = g.config(required=False)
    origins = config.origins

    def where(key: str) -> str:
        origin = origins.get(("publish", key))
        return f"publish: block ({origin})" if origin is not None else "publish: block"

    # Every refusal and failure of publish is exit 1 (docs/publish.md): its library raises only such errors,
    # and the boundary (fdl.cli.main) prints them, with their JSON twin under --json.
    request = resolve_request(flags, config.publish, cwd=Path.cwd(), block_root=config.root, block_where=where)
    result = do_publish(request, project_root=config.root, note=note)
    sources = worker_sources(result.request.served, socket.gethostname(), _user())
    if not result.manifest.built:
        note("WARNING: published with --no-build: NOTHING HAS COMPILED THIS TREE (manifest built: false)")
    if as_json:
        print(json.dumps(publish_json(result, sources), indent=2))
    else:
        sys.stdout.write(render_publish(result, sources))


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None
