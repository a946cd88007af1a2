"""`fdl config show [ENV] [--json]`: the merged configuration with provenance."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fdl.cli.context import globals_of
from fdl.cli.options import json_option

app = typer.Typer(help="Inspect the resolved configuration.", rich_markup_mode=None, no_args_is_help=True,
                  add_completion=False)


@app.callback()
def config() -> None:
    """Inspect the resolved configuration."""


@app.command("show")
def show(
    ctx: typer.Context,
    env: Annotated[str | None, typer.Argument(help="Env overlay to show (default: the selected env).")] = None,
    as_json: Annotated[bool, json_option()] = False,
    show_secrets: Annotated[bool, typer.Option("--show-secrets", help="Print tokens and key material in clear "
                                               "(masked as <redacted: N chars, set in FILE:LINE> by default).")
                            ] = False,
) -> None:
    """Print the merged fdl.yml (+ overlays) with the file and line of every value; secrets masked."""
    from fdl.config.project import EnvSelection, load_config
    from fdl.config.show import annotated_yaml
    from fdl.config.show import as_json as render_json
    from fdl.errors import ConfigError

    g = globals_of(ctx)
    # A configuration that reads but does not validate is shown all the same, its errors marked in place, so
    # the document they are about is in front of the person fixing them; the exit code is still 1.
    selection = EnvSelection.named(env, "argument") if env is not None else g.env  # a positional env: as --env
    cfg = load_config(None, selection, keep_errors=True)
    if not cfg.errors:
        for warning in cfg.warnings:
            typer.echo(f"fdl: warning: {warning}", err=True)
    chosen = {
        "env": cfg.env.name, "env_source": cfg.env.source,
        "gpus": None if g.gpus is None else (None if g.gpus.ids is None else list(g.gpus.ids)),
        "gpus_spec": g.gpus_spec,
    }
    broken = ConfigError.collected([message for _path, message in cfg.errors], cfg.warnings) if cfg.errors else None
    if as_json:
        extra: dict[str, Any] = {"selection": chosen}
        if broken is not None:  # the failure's envelope (fdl.cli.main), around the document that failed
            from fdl.cli.main import failure_document

            failed = failure_document(broken, broken.exit_code)
            extra.update({key: failed[key] for key in ("ok", "reason", "message", "hint", "exit_code")})
        typer.echo(render_json(cfg, extra, show_secrets=show_secrets))
        if broken is not None:
            raise broken  # the errors on stderr, exit 1; stdout already holds the document
        return
    from fdl.config.source import display_path

    header = [f"env: {cfg.env.name} (from {cfg.env.how})" if cfg.env.name else "env: (none, base only)",
              "files, merged in order: " + ", ".join(display_path(p) for p in cfg.files)]
    if g.gpus is not None:
        header.append(f"--gpus: {g.gpus} (command line; CUDA_VISIBLE_DEVICES for every process started)")
    typer.echo(annotated_yaml(cfg, header, show_secrets=show_secrets), nl=False)
    if broken is not None:
        raise broken
