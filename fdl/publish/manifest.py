"""The run manifest `.fdl-run.yml`: what a published tree is, and that it is ready.

`fdl publish` writes it at the root of the served tree once the build gate has
passed; a worker reads it to learn the run's cwd, build recipe, binary and
arguments. Its presence is the commit point of a publish: the publisher
removes it before touching the tree and writes it (atomically) last, so a
tree with a manifest is always a complete tree that passed its gate (or, with
`built: false`, one whose publisher said out loud that it skipped the gate).

Fields (all always written):

    cwd              project directory inside the tree ("." = the tree root)
    build            build recipe, a shell line
    bin              the built artifact, relative to cwd
    args             the binary's own arguments (a list of strings)
    origin           the source spec the publisher resolved
    rustc            `rustc -V` on the publisher (advisory), or null
    published_epoch  unix seconds at publish
    run              this publish's nonce (hex); every worker of one cohort holds the same
    built            false when the gate was skipped with --no-build
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from fdl.errors import FdlError
from fdl.hostside.fsio import TEMP_SUFFIX, atomic_write, fsync_dir

MANIFEST_NAME = ".fdl-run.yml"
DEFAULT_BUILD = "cargo build --release"
FIELDS = ("cwd", "build", "bin", "args", "origin", "rustc", "published_epoch", "run", "built")
MAX_MANIFEST_BYTES = 256 * 1024
# The temp files an interrupted manifest write can leave: fdl.hostside.fsio's, and those of fdl before it.
TEMP_PATTERNS = (f".{MANIFEST_NAME}.*{TEMP_SUFFIX}", f"{MANIFEST_NAME}.*.tmp")
_RUN_RE = re.compile(r"[0-9a-f]{16,128}")
_HEADER = (
    "# Run manifest written by `fdl publish`. Do not edit: the next publish replaces it,\n"
    "# and its presence is what tells a worker that this tree is a complete, gated run.\n"
)


class ManifestError(FdlError):
    """A run manifest exists but cannot be read or is not valid (a re-publish mends it)."""


class ManifestMissing(FdlError):
    """No run manifest: nothing is published there yet, or a publish is under way (transient)."""


@dataclass(frozen=True)
class Manifest:
    """A published run, as `.fdl-run.yml` records it."""

    bin: str
    run: str
    published_epoch: int
    built: bool
    cwd: str = "."
    build: str = DEFAULT_BUILD
    args: tuple[str, ...] = field(default_factory=tuple)
    origin: str | None = None
    rustc: str | None = None

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["args"] = list(self.args)
        return {key: data[key] for key in FIELDS}


def new_run_id() -> str:
    """A fresh run nonce (128 bits of OS entropy, hex)."""
    return secrets.token_hex(16)


def check_tree_path(value: str, what: str, *, base: str = ".") -> str:
    """Validate a path that must stay inside the tree; returns it normalised.

    `base` is where a relative value starts (bin is relative to cwd). Absolute
    paths and paths that climb out of the tree are refused, with a ValueError
    saying why.
    """
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty relative path")
    if "\x00" in value or any(ord(ch) < 32 for ch in value):
        raise ValueError(f"{what} contains control characters")
    if value.startswith("/") or value.startswith("~"):
        raise ValueError(f"{what} '{value}' must be relative to the tree, not an absolute path")
    joined = posixpath.normpath(posixpath.join(base, value))
    if joined == ".." or joined.startswith("../"):
        raise ValueError(f"{what} '{value}' climbs out of the published tree")
    return posixpath.normpath(value)


def manifest_path(tree: Path) -> Path:
    return Path(tree) / MANIFEST_NAME


def render(manifest: Manifest) -> str:
    body = yaml.safe_dump(manifest.to_dict(), sort_keys=False, default_flow_style=False, allow_unicode=True,
                          width=1_000_000)
    return _HEADER + body


def write_manifest(tree: Path, manifest: Manifest) -> Path:
    """Write the manifest atomically (fdl.hostside.fsio: temp file, fsync, rename, fsync of the directory)."""
    path = manifest_path(tree)
    atomic_write(path, render(manifest), mode=0o644)
    return path


def remove_manifest(tree: Path) -> bool:
    """Take the run out of service: remove the manifest (durably). True when one was there.

    Leftover temp files of an interrupted write go too, so nothing that looks
    like a manifest survives.
    """
    tree = Path(tree)
    removed = False
    try:
        os.unlink(manifest_path(tree))
        removed = True
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise FdlError(f"cannot remove the run manifest {manifest_path(tree)}: {exc.strerror}. Nothing was "
                       f"published.") from None
    try:
        for entry in os.scandir(tree):
            if any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in TEMP_PATTERNS):
                os.unlink(entry.path)
    except FileNotFoundError:
        pass
    fsync_dir(tree)
    return removed


def read_manifest(tree: Path, *, required: bool = False) -> Manifest | None:
    """Read and validate the manifest at the root of a tree.

    None when there is none (nothing published there, or a publish under way);
    with required=True that case raises ManifestMissing (exit 1: a worker
    waits for the next dial). A manifest that exists but is not valid raises
    ManifestError (exit 1).
    """
    path = manifest_path(tree)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        if required:
            raise ManifestMissing(
                f"no run is published in {tree} yet ({MANIFEST_NAME} is missing): either nothing was published "
                f"there, or a publish is under way or its build failed.",
                hint="Wait for the next dial, or run `fdl publish` on the controller.",
            ) from None
        return None
    except OSError as exc:
        raise ManifestError(f"cannot read the run manifest {path}: {exc.strerror}.") from None
    return parse_manifest(raw, str(path))


def parse_manifest(raw: bytes, where: str) -> Manifest:
    """Validate manifest bytes (as read from `where`)."""
    def bad(why: str) -> ManifestError:
        return ManifestError(f"{where} is not a valid run manifest: {why}.",
                             hint="Publish the run again (fdl publish); never edit the manifest by hand.")

    if len(raw) > MAX_MANIFEST_BYTES:
        raise bad(f"it is larger than {MAX_MANIFEST_BYTES // 1024} KiB")
    try:
        text = raw.decode("utf-8")
        data = yaml.safe_load(text)
    except UnicodeDecodeError:
        raise bad("it is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise bad(f"YAML error{f' at line {mark.line + 1}' if mark else ''}") from None
    if not isinstance(data, dict):
        raise bad("expected a mapping of fields")
    for key in ("bin", "run", "published_epoch", "built"):
        if data.get(key) is None:
            raise bad(f"'{key}' is missing")

    def text_field(key: str) -> str:
        value = data.get(key)
        if not isinstance(value, str) or not value.strip():
            raise bad(f"'{key}' must be non-empty text")
        return value

    def optional_text(key: str) -> str | None:
        return None if data.get(key) is None else text_field(key)

    cwd = optional_text("cwd") or "."
    binary = text_field("bin")
    try:
        cwd = check_tree_path(cwd, "cwd")
        check_tree_path(binary, "bin", base=cwd)
    except ValueError as exc:
        raise bad(str(exc)) from None
    build = optional_text("build") or DEFAULT_BUILD
    run = text_field("run")
    if not _RUN_RE.fullmatch(run):
        raise bad("'run' must be a hex nonce")
    epoch = data.get("published_epoch")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise bad("'published_epoch' must be unix seconds (a whole number)")
    built = data.get("built")
    if not isinstance(built, bool):
        raise bad("'built' must be true or false")
    args = data.get("args")
    if args is None:
        args = []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise bad("'args' must be a list of text arguments")
    return Manifest(bin=binary, run=run, published_epoch=epoch, built=built, cwd=cwd, build=build,
                    args=tuple(args), origin=optional_text("origin"), rustc=optional_text("rustc"))
