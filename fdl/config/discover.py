"""Finding the project's config files: cheap, no YAML involved.

Kept apart from the parser so commands that only need to know whether a
project exists (fdl probe outside a project, fdl --help) stay fast.
"""

from __future__ import annotations

from pathlib import Path

SUFFIXES = (".yml", ".yaml", ".json")


def find_base(start: Path) -> Path | None:
    """The nearest fdl.yml/.yaml/.json in start or its ancestors."""
    here = start.resolve()
    for directory in (here, *here.parents):
        for suffix in SUFFIXES:
            candidate = directory / f"fdl{suffix}"
            if candidate.is_file():
                return candidate
    return None


def overlay_file(root: Path, name: str) -> Path | None:
    for suffix in SUFFIXES:
        candidate = root / f"fdl.{name}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def available_envs(root: Path) -> list[str]:
    names = set()
    for path in root.iterdir():
        parts = path.name.split(".")
        if len(parts) == 3 and parts[0] == "fdl" and f".{parts[2]}" in SUFFIXES and path.is_file():
            names.add(parts[1])
    return sorted(names)
