"""Finding the project's config files: cheap, no YAML involved.

Kept apart from the parser so commands that only need to know whether a
project exists (fdl probe outside a project, fdl --help) stay fast.

What is found is believed only when no other account can have written it
(fdl.hostside.trust: git's safe.directory rule): the nearest fdl.yml, its
env overlays and the project's `.fdl/` must be owned by this user or root,
closed to group and others, in a directory of the same kind (or a sticky
one, such as /tmp, for a file of this user's). Anything else is refused,
naming the file, its owner and the override, and the search stops there:
nothing from it is read, and nothing further up is tried instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import FdlError
from ..hostside.trust import entry_refusal, override_hint

SUFFIXES = (".yml", ".yaml", ".json")
FARM_DIR = ".fdl"  # the project's farm files (fdl join-config): .fdl/LABEL/...


def refuse_untrusted(path: Path) -> None:
    """Raise FdlError (exit 1) when `path`, found by looking around, may have been written by another account.

    Not a ConfigError: nothing is wrong with the file's contents, and a worker treats a configuration that does
    not parse as permanent, where this is another party's doing (it mends when they remove the file)."""
    problem = entry_refusal(path)
    if problem is not None:
        raise FdlError(f"{problem}. fdl reads no configuration that another account wrote or could swap (the rule "
                       f"git applies to repositories, safe.directory), and looks no further: nothing from it is "
                       f"read.", hint=override_hint(path.parent))


def _check_farm_dir(root: Path) -> None:
    """The project's `.fdl/`, each entry in it and each entry in those (`.fdl/LABEL/token`): all believed."""
    farm = root / FARM_DIR
    if not os.path.lexists(farm):
        return
    refuse_untrusted(farm)
    if not farm.is_dir():
        return
    for entry in sorted(farm.iterdir()):
        refuse_untrusted(entry)
        if entry.is_dir() and not entry.is_symlink():
            for inner in sorted(entry.iterdir()):
                refuse_untrusted(inner)


def find_base(start: Path) -> Path | None:
    """The nearest fdl.yml/.yaml/.json in start or its ancestors; FdlError when it (or the project's `.fdl/`)
    is not this user's or root's to believe."""
    here = start.resolve()
    for directory in (here, *here.parents):
        for suffix in SUFFIXES:
            candidate = directory / f"fdl{suffix}"
            if candidate.is_file():
                refuse_untrusted(candidate)
                _check_farm_dir(directory)
                return candidate
    return None


def overlay_file(root: Path, name: str) -> Path | None:
    """The env overlay fdl.NAME.yml (or .yaml, .json) next to the base; FdlError when it is not to be believed."""
    for suffix in SUFFIXES:
        candidate = root / f"fdl.{name}{suffix}"
        if candidate.is_file():
            refuse_untrusted(candidate)
            return candidate
    return None


def available_envs(root: Path) -> list[str]:
    names = set()
    for path in root.iterdir():
        parts = path.name.split(".")
        if len(parts) == 3 and parts[0] == "fdl" and f".{parts[2]}" in SUFFIXES and path.is_file():
            names.add(parts[1])
    return sorted(names)
