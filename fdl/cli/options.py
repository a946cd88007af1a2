"""Options several commands share, declared once here and named in each command's signature."""

from __future__ import annotations

from typing import Any

import typer

JSON_FLAG = "--json"  # the flag every JSON twin answers to (the boundary in fdl.cli.main looks for it too)
TWIN = "Print the JSON twin on stdout."


def json_option(help: str = TWIN) -> Any:
    """`--json`: the command's outcome as one JSON document on stdout; `help` says what that document is."""
    return typer.Option(JSON_FLAG, help=help)

