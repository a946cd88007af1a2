"""Where a configuration value was written: key paths, parsed documents and their origins.

The types every reader of fdl.yml shares (fdl.config.source, which reads a file; fdl.config.yamldoc, which
parses its text; the schema, merge and show): the bottom of the config package.
"""

from __future__ import annotations

from typing import Any, NamedTuple

KeyPath = tuple[Any, ...]  # ("cluster", "workers", 0, "host"): YAML keys may be any scalar
Data = dict[Any, Any]  # a parsed document or one of its mappings


class Origin(NamedTuple):
    """Where a value was written: a file (as shown to the user) and a 1-based line."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


Origins = dict[KeyPath, Origin]  # where each key path of a document was written


def format_path(keypath: KeyPath) -> str:
    """("cluster", "workers", 0, "host") -> "cluster.workers[0].host"."""
    out = ""
    for part in keypath:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"
