"""`fdl publish`: resolve a source into the served tree, gate it, commit the manifest.

The order is the whole design:

1. everything that can be checked without touching the tree is checked first
   (the spec parses, bin and cwd stay inside the tree, the tools exist, the
   libtorch variants and their vendor headers are there), so a typo costs
   nothing;
2. the served directory's lock is taken (two publishes never interleave);
3. the manifest is removed: from here on a worker finds no run and waits;
4. the tree is updated incrementally (rsync --delete, or git fetch + checkout);
5. the gate builds it (and each --gate check-builds it);
6. the manifest is written atomically, with a fresh run nonce.

A crash or a failure anywhere between 3 and 6 leaves no manifest, so a tree
with a manifest is always complete and gated.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shlex
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from fdl.config.schema import PublishDefaults
from fdl.errors import FdlError
from fdl.publish import fetch as fetch_mod
from fdl.publish.gate import GateResult, check_gate_headers, primary_gate, rustc_version, variant_gate
from fdl.publish.libtorch import Libtorch, resolve_active, resolve_variant
from fdl.publish.manifest import (
    DEFAULT_BUILD,
    MANIFEST_NAME,
    Manifest,
    check_tree_path,
    new_run_id,
    remove_manifest,
    write_manifest,
)
from fdl.publish.spec import FileSource, GitSource, RsyncSource, SourceSpec, parse_source_spec

TREE_NAME = "tree"
LOCK_NAME = ".publish.lock"
DEFAULT_SERVED = "~/.flodl/run"
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
    origins: dict = field(default_factory=dict)  # field -> "flag" | "fdl.yml:LINE" | "default"

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

    def pick(name: str, flag_value, block_value, default=None):
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
        served, origins["to"] = Path(os.path.expanduser(DEFAULT_SERVED)), "default"
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
                hint="Serve from a directory outside the source tree (--to DIR, default ~/.flodl/run).")
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


def publish(request: PublishRequest, *, project_root: Path | None = None, note: Note = lambda _: None,
            output: IO | None = None) -> PublishResult:
    """Publish a run. Raises an FdlError (exit 1) when nothing new was published."""
    notes: list[str] = []

    def say(text: str) -> None:
        notes.append(text)
        note(text)

    libtorch, variants = preflight(request, project_root, say)
    served, tree = request.served, request.tree
    try:
        tree.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PublishError(f"cannot create the served directory {tree}: {exc.strerror}.") from None
    gates: list[GateResult] = []
    with publish_lock(served, wait=request.wait, note=say):
        # The commit point, undone first: from here until the manifest is written
        # again, a worker that dials finds no run and waits.
        if remove_manifest(tree):
            say(f"took the previous run out of service ({MANIFEST_NAME} removed) while publishing")
        try:
            fetched = fetch_mod.materialize(request.source, tree, identity=request.identity, note=say)
        except fetch_mod.FetchError as exc:
            raise PublishError(f"{exc.message}\nNothing was published: the run manifest stays removed, so workers "
                               f"wait for the next successful publish.", hint=exc.hint) from None
        if not (tree / request.cwd).is_dir():
            raise PublishError(f"cwd '{request.cwd}' is not a directory in the fetched tree ({tree}). Nothing was "
                               f"published.", hint="cwd is a path inside the source tree.")
        if request.no_build:
            say("--no-build: the build gate was SKIPPED; nothing has compiled this tree, and the manifest says "
                "built: false. The first worker to build it is where a broken build will show.")
        else:
            if libtorch is None:
                say("no libtorch found (LIBTORCH and LIBTORCH_PATH unset, no libtorch/ in the project or "
                    "~/.flodl): the gate builds without LIBTORCH_PATH (a crate linking flodl needs one; "
                    "a CPU libtorch is enough for a gate)")
            else:
                say(f"gate: building `{request.build}` in {request.cwd} against libtorch {libtorch.label} "
                    f"(from {libtorch.found_by})")
            gates.append(primary_gate(tree, request.cwd, request.build, request.bin, libtorch, output))
            for variant in variants:
                say(f"gate: check-building against {variant.label} ({variant.path})")
                gates.append(variant_gate(tree, request.cwd, request.build, variant, output))
        rustc = rustc_version()
        manifest = Manifest(bin=request.bin, run=new_run_id(), published_epoch=int(time.time()),
                            built=not request.no_build, cwd=request.cwd, build=request.build,
                            args=tuple(request.args), origin=request.source.spec, rustc=rustc)
        write_manifest(tree, manifest)
    return PublishResult(request=request, manifest=manifest, libtorch=libtorch, gates=gates,
                         commit=fetched.commit, notes=notes)


# --------------------------------------------------------------------------- the report


def worker_sources(served: Path, host: str, user: str | None) -> list[dict]:
    """The two source spellings a worker can use, each with the key it pairs with."""
    login = f"{user}@" if user else ""
    restricted = f'command="rrsync -ro {served}",restrict'
    return [
        {"source": f"rsync://{login}{host}:/{TREE_NAME}", "key": "rrsync",
         "authorized_keys_options": restricted,
         "pairs_with": f"a key restricted to the served directory: {restricted} in authorized_keys (rrsync "
                       f"re-roots every path at {served})"},
        {"source": f"rsync://{login}{host}:{served / TREE_NAME}", "key": "plain",
         "authorized_keys_options": None,
         "pairs_with": "an ordinary ssh key without a forced command (the absolute path; behind an rrsync key "
                       "it would be rooted twice and fail)"},
    ]


def report_data(result: PublishResult, *, host: str, user: str | None) -> dict:
    """The report as data: the JSON twin, and what the human text is rendered from."""
    request, manifest = result.request, result.manifest
    return {
        "published": True,
        "run": manifest.run,
        "served": str(request.served),
        "tree": str(request.tree),
        "manifest_path": str(request.tree / MANIFEST_NAME),
        "manifest": manifest.to_dict(),
        "source": {"kind": request.source.kind, "spec": request.source.spec, "commit": result.commit},
        "libtorch": None if result.libtorch is None else {
            "path": str(result.libtorch.path), "label": result.libtorch.label,
            "found_by": result.libtorch.found_by, "feature": result.libtorch.feature},
        "gates": [{"name": g.name, "libtorch": g.libtorch, "target_dir": g.target_dir, "recipe": g.recipe,
                   "passed": True} for g in result.gates],
        "built": manifest.built,
        "from": dict(request.origins),
        "worker_sources": worker_sources(request.served, host, user),
        "notes": list(result.notes),
    }


def render_human(data: dict) -> str:
    m = data["manifest"]
    lines = [f"published run {data['run']} from {data['source']['spec']}"
             + (f" (commit {data['source']['commit'][:12]})" if data["source"].get("commit") else "")]
    rows = [("tree", data["tree"]), ("cwd", m["cwd"]), ("bin", m["bin"]),
            ("args", shlex.join(m["args"]) if m["args"] else "(none)")]
    if data["built"]:
        gates = [g["name"] for g in data["gates"] if g["name"] != "build"]
        rows.append(("built", f"yes: `{m['build']}` passed"
                     + (f" (libtorch {data['libtorch']['label']})" if data.get("libtorch") else " (no libtorch)")))
        if gates:
            rows.append(("gates", ", ".join(gates) + " check-built"))
    else:
        rows.append(("built", "NO: --no-build skipped the gate; nothing has compiled this tree (built: false)"))
    rows.append(("rustc", m["rustc"] or "(none on this box)"))
    width = max(len(k) for k, _ in rows)
    lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    lines.append("workers pull it with --source, the spelling that matches their key:")
    for spelling in data["worker_sources"]:
        lines.append(f"  {spelling['source']}")
        lines.append(f"      with {spelling['pairs_with']}")
    return "\n".join(lines) + "\n"
