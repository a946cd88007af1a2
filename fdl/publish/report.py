"""How workers reach a published run: the two source spellings, each with the ssh key it pairs with.

`fdl publish` reports them (fdl.cli.render.publish renders the report, human and JSON, from the
PublishResult and these records).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fdl.hostside.farm.doors import DoorError, rrsync_command
from fdl.publish.run import TREE_NAME


@dataclass(frozen=True)
class WorkerSource:
    """One `--source` spelling a worker can pull the served tree with."""

    source: str  # rsync://[user@]host:PATH
    key: str  # "rrsync" (a key forced to rrsync -ro on the served directory) | "plain"
    authorized_keys_options: str | None  # the options line that restricts the key, for "rrsync"
    pairs_with: str  # the key it pairs with, in words


def worker_sources(served: Path, host: str, user: str | None) -> list[WorkerSource]:
    """The two source spellings a worker can use, each with the key it pairs with."""
    login = f"{user}@" if user else ""
    try:
        # The command fdl join-config's door b installs: rrsync -ro -munge behind the guard that refuses the
        # rsync options which would follow a link out of the tree (docs/join-config.md, "The doors").
        command = rrsync_command(str(served))
    except DoorError:  # a served path that cannot sit in a key line unquoted: the plain key only
        command = None
    restricted = f'command="{command}",restrict' if command else None
    plain = WorkerSource(source=f"rsync://{login}{host}:{served / TREE_NAME}", key="plain",
                         authorized_keys_options=None,
                         pairs_with="an ordinary ssh key without a forced command (the absolute path; behind an "
                                    "rrsync key it would be rooted twice and fail)")
    if restricted is None:
        return [plain]
    return [
        WorkerSource(source=f"rsync://{login}{host}:/{TREE_NAME}", key="rrsync", authorized_keys_options=restricted,
                     pairs_with=f"a key restricted to the served directory: {restricted} in authorized_keys "
                                f"(rrsync re-roots every path at {served})"),
        plain,
    ]
