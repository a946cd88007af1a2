"""`fdl publish`: resolve a source into a staged release, gate it, flip the served tree to it.

The order is the whole design:

1. everything that can be checked without touching the tree is checked first
   (the spec parses, bin and cwd stay inside the tree, the tools exist, the
   libtorch variants and their vendor headers are there), so a typo costs
   nothing;
2. the served directory's lock is taken (two publishes never interleave);
3. the staging release (`<served>/releases/a` or `b`, whichever `<served>/tree`
   does not point at) loses its old manifest;
4. it is updated incrementally (rsync --delete, or git fetch + checkout); a
   manifest the source carries is removed, links out of the tree refuse the
   publish (a file:// directory and a git commit are checked before they land,
   so the slot stays as it was; links found later are removed with the
   refusal), the warm build cache moves in;
5. the gate builds it (and each --gate check-builds it), and the whole tree,
   build output included, is checked for links out of it once more;
6. the manifest is written into it atomically, with a fresh run nonce;
7. `<served>/tree` is flipped to it: one rename of a symlink.

A failure or a crash anywhere before 7 leaves `tree` on the previous run,
whole; after 7 it is on the new one, whole.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shlex
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fdl.config.schema import PublishDefaults
from fdl.errors import FdlError
from fdl.hostside.fsio import atomic_write, fsync_dir
from fdl.hostside.libtorch.variants import Libtorch
from fdl.hostside.paths import FLODL_IN_HOME, SERVED_IN_HOME
from fdl.hostside.paths import home as home_dir
from fdl.hostside.paths import served as default_served
from fdl.hostside.trust import open_bits, owner_name, served_refusal, trusted_uids
from fdl.libtorch.gate import resolve_active, resolve_variant
from fdl.publish import fetch as fetch_mod
from fdl.publish.gate import GateResult, check_gate_headers, primary_gate, rustc_version, variant_gate
from fdl.publish.manifest import (
    DEFAULT_BUILD,
    MANIFEST_NAME,
    Manifest,
    check_tree_path,
    new_run_id,
    read_manifest,
    remove_manifest,
    write_manifest,
)
from fdl.publish.spec import FileSource, GitSource, RsyncSource, SourceSpec, parse_source_spec

TREE_NAME = "tree"
RELEASES_NAME = "releases"
SLOTS = ("a", "b")
LOCK_NAME = ".publish.lock"
Note = Callable[[str], None]


class PublishError(FdlError):
    """A publish was refused or failed; nothing new was published."""


@dataclass(frozen=True)
class PublishFlags:
    """What the command line said; None (or empty) where it said nothing."""

    source: str | None = None
    bin: str | None = None
    cwd: str | None = None
    build: str | None = None
    to: str | None = None
    identity: str | None = None
    gates: tuple[str, ...] = ()
    args: tuple[str, ...] | None = None  # None: no `--` on the line; () : an empty `--` tail
    no_build: bool = False
    no_wait: bool = False


@dataclass(frozen=True)
class PublishRequest:
    """A fully resolved publish."""

    source: SourceSpec
    bin: str
    cwd: str
    build: str
    args: tuple[str, ...]
    served: Path
    identity: str | None
    gates: tuple[str, ...]
    no_build: bool
    wait: bool = True
    origins: dict[str, str] = field(default_factory=dict)  # field -> "flag" | "fdl.yml:LINE" | "default"

    @property
    def tree(self) -> Path:
        return self.served / TREE_NAME


@dataclass
class PublishResult:
    request: PublishRequest
    manifest: Manifest
    libtorch: Libtorch | None
    gates: list[GateResult]
    commit: str | None
    notes: list[str]
    release: Path | None = None  # the slot `tree` now points at


# --------------------------------------------------------------------------- resolving flags and the block


def _path(value: str, base: Path) -> Path:
    path = Path(os.path.expanduser(value))
    return path if path.is_absolute() else base / path


def resolve_request(flags: PublishFlags, block: PublishDefaults | None, *, cwd: Path,
                    block_root: Path | None = None, block_where: Callable[[str], str] | None = None
                    ) -> PublishRequest:
    """Merge the command line over the standing `publish:` block, field by field, and validate the result.

    A `--` tail replaces the block's args outright, even when it is empty.
    `--no-build` has no block field. Relative paths from the block are taken
    from the project root, those from flags from the current directory.
    """
    block = block or PublishDefaults()
    block_root = block_root or cwd
    where = block_where or (lambda key: "fdl.yml")
    origins: dict[str, str] = {}

    def pick(name: str, flag_value: Any, block_value: Any, default: Any = None) -> Any:
        if flag_value is not None:
            origins[name] = "flag"
            return flag_value
        if block_value is not None:
            origins[name] = where(name)
            return block_value
        origins[name] = "default"
        return default

    source_text = pick("source", flags.source, block.source)
    if source_text is None:
        raise PublishError("fdl publish needs a source: a spec like file:///home/op/my-train or "
                           "git+https://host/owner/repo#v3, or a publish: block in fdl.yml with source:.",
                           hint="fdl publish file:///abs/path --bin target/release/NAME [-- ARGS]")
    source = parse_source_spec(source_text)
    binary = pick("bin", flags.bin, block.bin)
    if binary is None:
        raise PublishError(
            "fdl publish needs --bin (or bin: in the publish: block): the built artifact relative to the "
            "project directory, what every worker runs. It is not guessed: a workspace member builds into the "
            "workspace's target/, so no rule fits every project.",
            hint="e.g. --bin target/release/my-train")
    project_dir = pick("cwd", flags.cwd, block.cwd, ".")
    build = pick("build", flags.build, block.build, DEFAULT_BUILD)
    if not build.strip():
        raise PublishError("the build recipe is empty; give a shell line (default: cargo build --release), or "
                           "skip the gate with --no-build.")
    try:
        project_dir = check_tree_path(project_dir, "cwd")
        binary_norm = check_tree_path(binary, "bin", base=project_dir)
    except ValueError as exc:
        raise PublishError(f"{exc}.", hint="cwd is a directory inside the published tree and bin is relative "
                                           "to it.") from None
    if flags.args is not None:
        args, origins["args"] = tuple(flags.args), "flag"
    elif block.args is not None:
        args, origins["args"] = tuple(block.args), where("args")
    else:
        args, origins["args"] = (), "default"
    if flags.to is not None:
        served, origins["to"] = _path(flags.to, cwd), "flag"
    elif block.to is not None:
        served, origins["to"] = _path(block.to, block_root), where("to")
    else:
        served, origins["to"] = default_served(), "default"
    identity = None
    if flags.identity is not None:
        identity, origins["identity"] = str(_path(flags.identity, cwd)), "flag"
    elif block.identity is not None:
        identity, origins["identity"] = str(_path(block.identity, block_root)), where("identity")
    if flags.gates:
        gates, origins["gate"] = tuple(flags.gates), "flag"
    elif block.gate:
        gates, origins["gate"] = tuple(block.gate), where("gate")
    else:
        gates = ()
    return PublishRequest(source=source, bin=binary_norm, cwd=project_dir, build=build, args=args,
                          served=Path(os.path.abspath(served)), identity=identity,
                          gates=tuple(dict.fromkeys(gates)), no_build=flags.no_build, wait=not flags.no_wait,
                          origins=origins)


# --------------------------------------------------------------------------- checks before touching anything


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.relative_to(parent)
    except ValueError:
        return False
    return True


def preflight(request: PublishRequest, project_root: Path | None, note: Note) -> tuple[Libtorch | None,
                                                                                      list[Libtorch]]:
    """Every check that needs no change to the served tree. Returns the gate's libtorch and the --gate variants."""
    source = request.source
    fetch_mod.check_tools(source)
    served = Path(os.path.realpath(request.served))
    if request.served.exists() and not request.served.is_dir():
        raise PublishError(f"the served directory {request.served} exists and is not a directory.")
    check_served(request.served)
    if isinstance(source, FileSource):
        src = Path(os.path.realpath(source.path))
        if not src.is_dir():
            raise PublishError(f"source {source.spec}: {source.path} is not a directory on this box.",
                               hint="file:// names a directory here; a remote tree is rsync://host:/path.")
        if not os.access(src, os.R_OK | os.X_OK):
            raise PublishError(f"source {source.spec}: {source.path} is not readable by this user.")
        if _inside(src, served) or _inside(served, src):
            raise PublishError(
                f"source {source.path} and the served directory {request.served} overlap; a publish would copy "
                f"the served tree into itself.",
                hint=f"Serve from a directory outside the source tree (--to DIR, default {SERVED_IN_HOME}).")
    if request.identity is not None:
        if not isinstance(source, RsyncSource) and not (isinstance(source, GitSource)
                                                          and source.url.startswith("ssh://")):
            note(f"--identity is used for rsync:// and git+ssh:// sources only; {source.kind} source: ignored")
        elif not os.path.isfile(request.identity):
            raise PublishError(f"--identity {request.identity}: no such key file.")
    if request.no_build:
        if request.gates:
            note("--no-build also skips the --gate check-builds (" + ", ".join(request.gates) + ")")
        return None, []
    try:
        first_word = shlex.split(request.build)[0] if request.build.strip() else ""
    except ValueError:
        first_word = ""
    if first_word == "cargo" and shutil.which("cargo") is None:
        raise PublishError(
            f"the build recipe `{request.build}` needs cargo, which is not on PATH.",
            hint="Install a Rust toolchain (https://rustup.rs), give a recipe that does not need cargo with "
                 "--build, or skip the gate with --no-build.")
    libtorch = resolve_active(project_root)
    variants = []
    for label in request.gates:
        variant = resolve_variant(label, project_root)
        check_gate_headers(variant)
        variants.append(variant)
    return libtorch, variants


# --------------------------------------------------------------------------- who can write the served directory


def check_served(served: Path) -> None:
    """Refuse a served directory another account could write: every worker builds and runs what it holds, so
    whoever can swap `tree` (or a release) after the build gate runs code as every worker's account.

    The directory and its parents up to this user's home (or the first directory root owns) must be this user's
    or root's and closed to group and others (a sticky parent such as /tmp aside: nobody renames what you own
    there); inside it, `releases/`, its slots and the `tree` link must be this user's or root's, and the
    directories closed too (fdl.hostside.trust.served_refusal)."""
    problem = served_refusal(served, home_dir())
    if problem is None:
        uids = trusted_uids()
        for inside in (served / RELEASES_NAME, *(served / RELEASES_NAME / slot for slot in SLOTS),
                       served / TREE_NAME):
            try:
                info = os.lstat(inside)
            except OSError:
                continue
            if info.st_uid not in uids:
                problem = f"{inside} is owned by {owner_name(info.st_uid)}, which is neither you nor root"
            elif not os.path.islink(inside) and open_bits(info):
                problem = f"{inside} can be written by group or others (mode {stat.S_IMODE(info.st_mode):04o})"
            if problem:
                break
    if problem is not None:
        raise PublishError(
            f"{problem}. fdl publish serves only from a directory nobody else can write: another account could "
            f"swap the tree after the build gate, and every worker would build and run theirs. Nothing was "
            f"published.",
            hint=f"serve from a directory of your own (--to DIR; the default is {SERVED_IN_HOME}), or make this "
                 f"one yours and closed (chown it to you, chmod go-w it and the directories above it)")


def make_served(served: Path) -> None:
    """Create the served directory and its missing parents, closed to group and others (0755 at most)."""
    missing = []
    here = served
    while not os.path.lexists(here):
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o755)
        except FileExistsError:
            pass


# --------------------------------------------------------------------------- the lock


def _lock_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    except OSError:
        return ""
    return f" (pid {text})" if text.isdigit() else ""


@contextmanager
def publish_lock(served: Path, *, wait: bool, note: Note) -> Iterator[None]:
    """Hold `<served>/.publish.lock` (flock) for one publish.

    A second publish into the same served directory waits for the first, saying
    so, or with wait=False fails at once. The kernel drops the lock when its
    holder dies, so a killed publish never leaves a stale lock behind.
    """
    path = served / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise PublishError(f"cannot open the publish lock {path}: {exc.strerror}.") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise PublishError(f"cannot lock {path}: {exc.strerror}.") from None
            holder = _lock_holder(fd)
            if not wait:
                raise PublishError(
                    f"another fdl publish{holder} is publishing into {served} right now; nothing was touched.",
                    hint="Wait for it to finish, or run without --no-wait to queue behind it.") from None
            note(f"another fdl publish{holder} is publishing into {served}; waiting for it to finish "
                 f"(Ctrl-C to give up)")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- the publish


def _slot_of(served: Path) -> str | None:
    """The release slot `<served>/tree` points at, or None when there is no live run."""
    try:
        target = os.readlink(served / TREE_NAME)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # a real directory: the layout before staged publishes
            return None
        raise PublishError(f"cannot read {served / TREE_NAME}: {exc.strerror}.") from None
    for slot in SLOTS:
        if target == f"{RELEASES_NAME}/{slot}":
            return slot
    raise PublishError(f"{served / TREE_NAME} points at {target!r}, which is not one of fdl's release slots "
                       f"({', '.join(RELEASES_NAME + '/' + s for s in SLOTS)}); something else changed it.",
                       hint=f"Remove {served / TREE_NAME} and publish again.")


def _flip(served: Path, slot: str) -> None:
    """Point `<served>/tree` at a release slot in one rename (a symlink replaced atomically), durably."""
    tmp = served / f".{TREE_NAME}.{os.getpid()}.tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(f"{RELEASES_NAME}/{slot}", tmp)
    os.replace(tmp, served / TREE_NAME)
    fsync_dir(served)


def _settle_layout(served: Path, say: Note) -> str | None:
    """Bring the served directory to the staged layout; returns the live slot (None: no run yet).

    Called under the lock. Leftovers of an interrupted flip go; a tree from
    before staged publishes (a real directory) becomes slot `a` with its
    manifest intact; a served directory whose `tree` link is missing while a
    slot holds a whole run (a crash between those two steps) gets the link back.
    """
    releases = served / RELEASES_NAME
    releases.mkdir(mode=0o755, exist_ok=True)  # closed whatever the umask (check_served)
    for entry in os.scandir(served):
        if entry.name.startswith(f".{TREE_NAME}.") and entry.name.endswith(".tmp"):
            os.unlink(entry.path)
    tree = served / TREE_NAME
    if tree.is_dir() and not tree.is_symlink():
        old = releases / SLOTS[0]
        if old.exists():
            shutil.rmtree(old)
        os.rename(tree, old)
        fsync_dir(served)
        _flip(served, SLOTS[0])
        say(f"moved the served tree into {old} (staged publishes: {tree} is now a link to the live release)")
        return SLOTS[0]
    live = _slot_of(served)
    if live is None and not tree.is_symlink():
        whole = [(m.published_epoch, slot) for slot in SLOTS
                 if (m := _quiet_manifest(releases / slot)) is not None]
        if whole:
            live = max(whole)[1]
            _flip(served, live)
            say(f"{tree} was missing; pointed it back at the last whole run in {releases / live}")
    return live


def _quiet_manifest(tree: Path) -> Manifest | None:
    try:
        return read_manifest(tree)
    except FdlError:
        return None


def _inside_lexically(link_dir: str, target: str) -> bool:
    """rsync's own rule: a link is safe when it is relative and never climbs above the tree root."""
    if target.startswith("/"):
        return False
    depth = 0 if link_dir in ("", ".") else len(link_dir.split("/"))
    for part in target.split("/"):
        if part in ("", "."):
            continue
        depth = depth - 1 if part == ".." else depth + 1
        if depth < 0:
            return False
    return True


@dataclass(frozen=True)
class EscapingLink:
    """A symbolic link of a staged tree that reaches outside it."""

    path: str  # inside the tree
    text: str  # what the link says
    why: str  # "absolute" | "climbs out" | "resolves outside"

    def describe(self) -> str:
        return f"{self.path} -> {self.text}  ({_WHY[self.why]})"


_WHY = {
    "absolute": "absolute: it names a place outside any copy of the tree",
    "climbs out": "climbs above the tree root as written",
    "resolves outside": "resolves to a place outside the tree",
}


def _escapes(link_dir: str, text: str) -> str | None:
    """Why a link's text alone takes it out of its tree ("absolute", "climbs out"), or None."""
    if text.startswith("/"):
        return "absolute"
    if not _inside_lexically(link_dir, text):
        return "climbs out"
    return None


def commit_escaping(links: list[tuple[str, str]]) -> list[EscapingLink]:
    """The links of a commit (fetch.commit_links: path, text) whose text takes them out of the tree."""
    found = []
    for path, text in links:
        why = _escapes(path.rpartition("/")[0], text)
        if why is not None:
            found.append(EscapingLink(path, text, why))
    return sorted(found, key=lambda link: link.path)


def _not_copied(rel_dir: str, name: str) -> bool:
    """The real directories a publish's rsync leaves out of a file:// source (fetch.PUBLISH_EXCLUDES)."""
    return name in ("target", ".git") or (rel_dir == "" and name == "libtorch")


def links_out_of_tree(tree: Path, skip: Callable[[str, str], bool] | None = None) -> list[EscapingLink]:
    """Every symbolic link anywhere in a staged tree that reaches outside it, sorted by path.

    A link is kept only when its text is relative, never climbs above the tree
    root read as written (rsync's --safe-links rule), and what it resolves to on
    this box is inside the tree. The whole tree is walked: build output
    (`target/` at any depth), `.git/` and the top-level `libtorch/` too, since a
    git source checks tracked files out there, a build writes there, and door b
    serves whatever the release directory holds. Links are listed, never followed.
    skip(parent, name) leaves a real directory out of the walk (a source's parts that are never copied).
    """
    root = os.fspath(tree)
    real_tree = os.path.realpath(root)
    found: list[EscapingLink] = []
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel_dir) if rel_dir else root))
        except FileNotFoundError:
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if entry.is_symlink():
                text = os.readlink(entry.path)
                why = _escapes(rel_dir, text)
                if why is None:
                    real = os.path.realpath(entry.path)
                    if real != real_tree and not real.startswith(real_tree + os.sep):
                        why = "resolves outside"
                if why is not None:
                    found.append(EscapingLink(rel, text, why))
            elif entry.is_dir(follow_symlinks=False) and not (skip is not None and skip(rel_dir, entry.name)):
                pending.append(rel)
    return sorted(found, key=lambda link: link.path)


def _take_back(stage: Path, escaping: list[EscapingLink]) -> None:
    """Remove the refused links from the staging slot, so that the next publish finds none of them there (the
    parts a fetch never replaces, target/ and libtorch/, would keep them). Links only: nothing is followed."""
    for link in escaping:
        path = stage / link.path
        try:
            if path.is_symlink():
                path.unlink()
        except OSError:
            continue


def _refuse_links(escaping: list[EscapingLink], what: str, kept: str) -> PublishError:
    shown = [f"  {link.describe()}" for link in escaping[:20]]
    if len(escaping) > 20:
        shown.append(f"  ... and {len(escaping) - 20} more")
    return PublishError(
        f"{what} {len(escaping)} symbolic link(s) that reach outside the tree; a served tree never points "
        f"outside itself:\n" + "\n".join(shown) + f"\nNothing was published: {kept}.",
        hint="Make each link relative and inside the tree, or replace it with the file it names (build output "
             "and a committed target/ or libtorch/ are checked too).")


def carry_build_output(live: Path, stage: Path) -> int:
    """Move the live release's build output (`target/` directories) into the staging one; returns how many.

    One warm cargo cache follows the newest build from slot to slot, so a
    republish compiles only what changed (cargo keeps a moved target/ valid:
    its fingerprints are relative to the package). Workers never pull
    target/, so the live run loses nothing they fetch. A target/ already in
    the staging slot is kept when the live one has none (the last build ran
    there and failed).
    """
    moved = 0
    for root, dirs, _ in os.walk(live):
        rel = os.path.relpath(root, live)
        descend = []
        for name in dirs:
            here = Path(root) / name
            if name == ".git" or (rel == "." and name == "libtorch") or here.is_symlink():
                continue
            if name != "target":
                descend.append(name)
                continue
            parent = stage / rel
            if not parent.is_dir() or parent.is_symlink():
                continue
            dest = parent / name
            if dest.is_symlink() or dest.is_file():
                dest.unlink()
            elif dest.exists():
                shutil.rmtree(dest)
            os.rename(here, dest)
            moved += 1
        dirs[:] = descend
    return moved


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _put_back(path: Path, body: bytes | None) -> None:
    """Restore a file removed a moment ago (the staging slot's manifest), as it was: 0644, written atomically."""
    if body is not None:
        with contextlib.suppress(OSError):
            atomic_write(path, body, mode=0o644)


def publish(request: PublishRequest, *, project_root: Path | None = None, note: Note = lambda _: None,
            output: IO[Any] | None = None) -> PublishResult:
    """Publish a run. Raises an FdlError (exit 1) when nothing new was published.

    The run is fetched and built in the release slot that is not live, and
    `<served>/tree` is flipped to it only once its manifest is written: the
    previous run stays served, whole, through a failed or interrupted publish.
    """
    notes: list[str] = []

    def say(text: str) -> None:
        notes.append(text)
        note(text)

    libtorch, variants = preflight(request, project_root, say)
    served = request.served
    try:
        make_served(served)
    except OSError as exc:
        raise PublishError(f"cannot create the served directory {served}: {exc.strerror}.") from None
    check_served(served)  # again: what was made, and what was there, as it is now
    gates: list[GateResult] = []
    with publish_lock(served, wait=request.wait, note=say):
        try:
            live = _settle_layout(served, say)
        except OSError as exc:
            raise PublishError(f"cannot prepare the served directory {served}: {exc.strerror}. Nothing was "
                               f"published.") from None
        slot = SLOTS[1] if live == SLOTS[0] else SLOTS[0]
        stage = served / RELEASES_NAME / slot
        kept = "the previous run stays served" if live else "nothing is served yet"
        # A source with links out of its tree is refused before it reaches the staging slot where that can be
        # told beforehand (a file:// directory, a git commit), so a refusal leaves the slot as it found it.
        if isinstance(request.source, FileSource):
            escaping = links_out_of_tree(Path(os.path.realpath(request.source.path)), skip=_not_copied)
            if escaping:
                raise _refuse_links(escaping, "the source holds", kept)
        made_stage = not stage.exists()
        stage.mkdir(mode=0o755, exist_ok=True)
        # The staging slot is never what `tree` points at, so no worker can reach it
        # by name; its old manifest goes first all the same (back in place if the source is refused unfetched).
        old_manifest = _read_bytes(stage / MANIFEST_NAME)
        remove_manifest(stage)

        def vet(links: list[tuple[str, str]]) -> None:
            refused = commit_escaping(links)
            if refused:
                _put_back(stage / MANIFEST_NAME, old_manifest)
                raise _refuse_links(refused, "the source holds", kept)

        try:
            fetched = fetch_mod.materialize(request.source, stage, identity=request.identity, note=say,
                                            excludes=fetch_mod.PUBLISH_EXCLUDES, vet=vet)
        except FdlError as exc:
            if made_stage:  # a git source refused or not fetched left it empty: gone, as it was before
                with contextlib.suppress(OSError):
                    stage.rmdir()
            if isinstance(exc, PublishError):
                raise
            raise PublishError(f"{exc.message}\nNothing was published: {kept}.", hint=exc.hint) from None
        if remove_manifest(stage):
            say(f"the source carried its own {MANIFEST_NAME}; it was removed before the build (the run "
                f"manifest is written by fdl publish alone)")
        escaping = links_out_of_tree(stage)
        if escaping:
            _take_back(stage, escaping)
            raise _refuse_links(escaping, "the source holds", kept)
        if live is not None:
            try:
                carry_build_output(served / RELEASES_NAME / live, stage)
            except OSError as exc:
                say(f"could not move the warm build output into {stage} ({exc.strerror}); the gate builds "
                    f"what it lacks")
        if not (stage / request.cwd).is_dir():
            raise PublishError(f"cwd '{request.cwd}' is not a directory in the fetched tree. Nothing was "
                               f"published: {kept}.", hint="cwd is a path inside the source tree.")
        if request.no_build:
            say("--no-build: the build gate was SKIPPED; nothing has compiled this tree, and the manifest says "
                "built: false. The first worker to build it is where a broken build will show.")
        else:
            if libtorch is None:
                say(f"no libtorch found (LIBTORCH and LIBTORCH_PATH unset, no libtorch/ in the project or "
                    f"{FLODL_IN_HOME}): the gate builds without LIBTORCH_PATH (a crate linking flodl needs one; "
                    "a CPU libtorch is enough for a gate)")
            else:
                say(f"gate: building `{request.build}` in {request.cwd} against libtorch {libtorch.label} "
                    f"(from {libtorch.source})")
            try:
                gates.append(primary_gate(stage, request.cwd, request.build, request.bin, libtorch, output))
                for variant in variants:
                    say(f"gate: check-building against {variant.label} ({variant.path})")
                    gates.append(variant_gate(stage, request.cwd, request.build, variant, output))
            except FdlError as exc:
                raise PublishError(f"{exc.message}\nNothing was published: {kept}.", hint=exc.hint) from None
        escaping = links_out_of_tree(stage)  # the build and the carried build output, checked like the source
        if escaping:
            _take_back(stage, escaping)
            raise _refuse_links(escaping, "after the build, the tree holds", kept)
        rustc = rustc_version()
        manifest = Manifest(bin=request.bin, run=new_run_id(), published_epoch=int(time.time()),
                            built=not request.no_build, cwd=request.cwd, build=request.build,
                            args=tuple(request.args), origin=request.source.spec, rustc=rustc)
        write_manifest(stage, manifest)
        _flip(served, slot)  # the commit point
    return PublishResult(request=request, manifest=manifest, libtorch=libtorch, gates=gates,
                         commit=fetched.commit, notes=notes, release=stage)
