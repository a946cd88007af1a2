"""Read one configuration file into plain Python values plus provenance.

Every value remembers the file and line it came from (`Origin`), keyed by its
key path: ``("cluster", "workers", 0, "host")``. The reader is defensive on
purpose, because a config file is user input: it bounds the file size and
rejects non-UTF-8 bytes here; fdl.config.yamldoc parses the text with the
rest of the bounds (depth, alias expansion, duplicate keys, tags).

A file that parsed is remembered in fdl's cache directory with its exact text
(`config/<crc>.marshal`), so the next command that reads the same unchanged file
skips PyYAML altogether: its import alone is about a tenth of a short command
such as `fdl probe --json` in a project (see _cached_parse).
"""

from __future__ import annotations

import os
import stat
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from ..envvars import FDL_CONFIG_CACHE, read
from ..errors import ConfigError
from ..paths import cache_dir

MAX_BYTES = 4 * 1024 * 1024  # no hand-written config comes near this
CACHE_FORMAT = 1  # bump when the parse of a text may change (the parser's rules, the cached shape)
KeyPath = tuple[Any, ...]  # ("cluster", "workers", 0, "host"): YAML keys may be any scalar
Data = dict[Any, Any]  # a parsed document or one of its mappings


class Origin(NamedTuple):
    """Where a value was written: a file (as shown to the user) and a 1-based line."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


Origins = dict[KeyPath, Origin]  # where each key path of a document was written


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


def format_path(keypath: KeyPath) -> str:
    """("cluster", "workers", 0, "host") -> "cluster.workers[0].host"."""
    out = ""
    for part in keypath:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


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
    data, origins = _cached_parse(path, text, shown)
    return Layer(path=path, data=data, origins=origins)


def _cached_parse(path: Path, text: str, shown: str) -> tuple[Data, Origins]:
    """parse_text(text), or what it returned for this very text, file and spelling before.

    PyYAML's import is most of what reading an unchanged fdl.yml costs: its regular expressions
    are compiled at import. Skipping it saved 13-48 ms of `fdl probe --json`'s CPU time in a project
    (interleaved medians of 21-25 runs, loaded 2-core machine); with the collector pause of
    fdl.cli.context, bench/probe.py --baseline measured 9.7x -> 8.0x a bare interpreter.

    An entry is used only when its text, file, spelling, fdl version and parser sources all match,
    so an edit, a move or an upgrade parses again; an entry that cannot be read or written (a
    read-only home, a damaged file) costs only the parse. Entries are in marshal's format, the one
    Python trusts for its own __pycache__ (json's import alone would cost `fdl config show` more than
    the cache saves it). Documents with values that are not plain (dates, bytes, keys that are not
    strings) or with a secret (a join token, key material:
    what `fdl config show` masks) are not cached.
    """
    import marshal

    from .. import __version__

    json_file = path.suffix == ".json"
    where = (str(path.resolve()), shown, json_file)
    stamp = (CACHE_FORMAT, __version__, *_parser_stamp(), *where)
    entry_path = _cache_file(where)
    try:
        entry = marshal.loads(_own_bytes(entry_path))
        if isinstance(entry, dict) and entry["stamp"] == stamp and entry["text"] == text \
                and isinstance(entry["data"], dict):
            return entry["data"], {keypath: Origin(shown, line) for keypath, line in entry["origins"]}
    except (OSError, EOFError, ValueError, KeyError, TypeError):
        pass
    from .yamldoc import parse_text

    data, origins = parse_text(text, shown, json_file=json_file)
    if _cacheable(data, origins, shown):
        entry = {"stamp": stamp, "text": text, "data": data,
                 "origins": [(keypath, origin.line) for keypath, origin in origins.items()]}
        try:
            from ..fsio import atomic_write

            entry_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            atomic_write(entry_path, marshal.dumps(entry), mode=0o600)
        except (OSError, ValueError):
            pass
    return data, origins


def _own_bytes(entry_path: Path) -> bytes:
    """The entry's bytes, when it and its directory belong to this user and nobody else may write them.

    marshal is safe only for data its reader wrote: an entry someone else could have written (a cache
    directory pointed at a shared place, a group-writable file) is ignored (OSError: parse instead)."""
    me = os.geteuid()
    for place in (entry_path.parent, entry_path):
        info = os.lstat(place)
        if info.st_uid != me or info.st_mode & 0o022 or not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
            raise PermissionError(f"{place} is not this user's own")
    with open(entry_path, "rb") as handle:
        return handle.read()


@lru_cache(maxsize=1)
def _parser_stamp() -> tuple[Any, ...]:
    """Size and mtime of the parser's sources (fdl.config.yamldoc, PyYAML): a changed parser parses again."""
    import importlib.util

    spec = importlib.util.find_spec("yaml")
    stamp: list[Any] = []
    for source in (Path(__file__).with_name("yamldoc.py"), spec.origin if spec is not None else None):
        try:
            info = os.stat(source) if source is not None else None
        except OSError:
            info = None
        stamp.append((info.st_size, info.st_mtime_ns) if info is not None else None)
    return tuple(stamp)


def _cache_file(where: tuple[Any, ...]) -> Path:
    """Where the entry of one (file, spelling) lives: one each, replaced when its text or the parser changes.

    The directory is $FDL_CONFIG_CACHE when set (the test suite points it at a directory of its own), else
    config/ in fdl's cache directory ($XDG_CACHE_HOME/fdl, else ~/.cache/fdl)."""
    import zlib

    directory = read(FDL_CONFIG_CACHE) or str(cache_dir() / "config")
    return Path(directory) / f"{zlib.crc32(repr(where).encode()):08x}.marshal"


def _cacheable(data: Data, origins: Origins, shown: str) -> bool:
    """The document is plain (text-keyed mappings, lists, text, numbers, booleans, null), so the cache gives
    it back exactly, and it holds no secret: a value `fdl config show` masks (a token, key material) is never
    copied into the cache."""
    from .masking import find_masks

    def plain(value: Any) -> bool:
        if isinstance(value, dict):
            return all(type(key) is str and plain(sub) for key, sub in value.items())
        if isinstance(value, list):
            return all(plain(sub) for sub in value)
        return value is None or type(value) in (str, int, float, bool)

    return plain(data) and not find_masks(data) and all(
        origin.file == shown and all(type(part) in (str, int) for part in keypath)
        for keypath, origin in origins.items())
