"""Every command of `fdl`, as the real entry point builds them: walked from the root group in a fresh interpreter.

Used by the tests that must cover every command (each --json twin through a failure, every help page), so a
command added later is covered without anyone listing it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import fdl_env

# fdl.cli.main imports typer, whose import warns under this click (warnings are errors here): walk it apart.
WALK = """
import json
import click
import typer
from fdl.cli.context import Invocation
from fdl.cli.main import app

def walk(command, path, parent):
    ctx = click.Context(command, info_name=path[-1] if path else "fdl", parent=parent,
                        obj=None if parent else Invocation())
    params = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        params.append({"name": param.name, "kind": param.param_type_name, "opts": list(param.opts),
                       "secondary": list(getattr(param, "secondary_opts", [])),
                       "takes_value": param.param_type_name == "option" and not (param.is_flag or param.count),
                       "shown": record[0] if record else None})
    rows = [{"path": path, "group": isinstance(command, click.Group), "params": params}]
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            rows += walk(command.get_command(ctx, name), [*path, name], ctx)
    return rows

print(json.dumps(walk(typer.main.get_command(app), [], None)))
"""


def command_tree(cwd: Path) -> list[dict[str, Any]]:
    """[{path: [words], group: bool, params: [{name, kind, opts, secondary, takes_value, shown}]}] for fdl and every
    command under it,
    project commands of the fdl.yml in cwd included."""
    done = subprocess.run([sys.executable, "-c", WALK], cwd=cwd, env=fdl_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def has_option(row: dict[str, Any], flag: str) -> bool:
    return any(flag in param["opts"] for param in row["params"] if param["kind"] == "option")
