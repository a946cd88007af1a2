"""Read one configuration file into plain Python values plus provenance.

Every value remembers the file and line it came from (`Origin`), keyed by its
key path: ``("cluster", "workers", 0, "host")``. The reader is defensive on
purpose, because a config file is user input: it bounds the file size and
rejects non-UTF-8 bytes here; fdl.config.yamldoc parses the text with the
rest of the bounds (depth, alias expansion, duplicate keys, tags).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .keypath import Data, Origins

MAX_BYTES = 4 * 1024 * 1024  # no hand-written config comes near this


class Layer:
    """One parsed document: its data and the origin of every key path in it."""

    __slots__ = ("data", "origins", "path")

    def __init__(self, path: Path, data: Data, origins: Origins | None = None):
        self.path = path
        self.data = data
        self.origins = {} if origins is None else origins


def display_path(path: Path) -> str:
    """The shortest honest spelling of a path for messages: relative when under cwd."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def read_layer(path: Path) -> Layer:
    """Parse one fdl config file (YAML or JSON) into a `Layer`, or raise ConfigError."""
    shown = display_path(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise ConfigError(
                f"{shown} is {size / 1024 / 1024:.1f} MiB; fdl reads configuration files of up to "
                f"{MAX_BYTES // 1024 // 1024} MiB. Check that this is the file you meant (a data file "
                f"or log named like a config?) and keep fdl.yml to the settings themselves."
            )
        raw = path.read_bytes()
    except ConfigError:
        raise
    except OSError as exc:
        raise ConfigError(f"{shown} cannot be read: {exc.strerror or exc}. Check that it exists and "
                          f"that you may read it.") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{shown}:{line}: the file is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start}). Save it as UTF-8; configuration files must be text."
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    from .yamldoc import parse_text  # here: PyYAML's import is slow, and a cached file needs none of it

    data, origins = parse_text(text, shown, json_file=path.suffix == ".json")
    return Layer(path=path, data=data, origins=origins)
