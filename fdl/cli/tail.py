"""Commands whose first standalone `--` ends fdl's own options (`fdl publish ... -- ARGS`).

Click drops a bare `--` and would hand the words after it to positional
parameters, so "an empty tail" (explicitly no arguments) and "no tail" would
look the same. The split happens here, before click parses, and is kept in
ctx.meta: None when there was no `--`, a (possibly empty) list when there was.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand

TAIL_KEY = "fdl.tail"


class TailCommand(TyperCommand):
    """A command that keeps everything after the first standalone `--` verbatim."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta[TAIL_KEY] = list(args[cut + 1:])
            args = args[:cut]
        else:
            ctx.meta[TAIL_KEY] = None
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "[-- ARGS...]"]


def tail(ctx: Any) -> list[str] | None:
    """The words after `--`: None when there was no `--`, [] for an explicitly empty tail."""
    words: list[str] | None = ctx.meta.get(TAIL_KEY)
    return words
