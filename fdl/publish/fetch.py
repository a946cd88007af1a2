"""Moving a source tree onto local disk: rsync for file:// and rsync://, git for git+.

Both are incremental and keep mtimes, which is what keeps cargo's own
incremental build alive across fetches: `rsync -a --delete` copies what
changed and removes what went away; a git fetch plus a forced checkout
rewrites only the files that differ. Build output (`target/` at any depth),
`.git/` and the project's `/libtorch/` are never copied and never deleted on
the receiving side, so the gate's warm cache survives a republish.

`pull_run` is the worker's side: it fetches a published tree together with
its manifest and checks, by reading the manifest before and after the copy,
that no publish started in between (a tree copied across a publish boundary
could mix two runs). A worker's copy is its own stage: every directory lands
owner-writable there (`--chmod=Du+rwx`), so a read-only directory of the
published tree neither stops its build nor the next fetch over it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fdl.errors import FdlError, RemoteError
from fdl.hostside.envvars import FDL_GIT_PASSWORD, FDL_GIT_USERNAME
from fdl.hostside.fsio import atomic_write
from fdl.publish.manifest import (
    MANIFEST_NAME,
    TEMP_PATTERNS,
    Manifest,
    ManifestMissing,
    parse_manifest,
    read_manifest,
    remove_manifest,
)
from fdl.publish.spec import FileSource, GitSource, RsyncSource, SourceSpec

EXCLUDES = ("target/", ".git/", "/libtorch/", f"/{MANIFEST_NAME}", *(f"/{pattern}" for pattern in TEMP_PATTERNS))
# A publish copies a source's own manifest too, so that it can say so and remove it
# before the build (the run manifest is fdl's alone).
PUBLISH_EXCLUDES = ("target/", ".git/", "/libtorch/")
SSH_CONNECT_TIMEOUT = 15
Note = Callable[[str], None]


class FetchError(FdlError):
    """Fetching a source tree failed (a retry or a fix at the source can mend it)."""


@dataclass(frozen=True)
class Fetched:
    """What a fetch put in place."""

    kind: str
    commit: str | None = None  # git sources: the commit checked out


def _need(tool: str, why: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise FetchError(f"{why} needs {tool}, which is not installed (not on PATH).",
                         hint=f"Install it: {install_line(tool)}")
    return path


def install_line(package: str) -> str:
    """A one-line install command for a Debian/Fedora/macOS package of the same name."""
    sudo = "" if os.geteuid() == 0 else "sudo "
    if shutil.which("apt-get"):
        return f"{sudo}apt-get install {package}"
    if shutil.which("dnf"):
        return f"{sudo}dnf install {package}"
    if shutil.which("brew"):
        return f"brew install {package}"
    return f"install the '{package}' package with your system's package manager"


def check_tools(source: SourceSpec) -> None:
    """Refuse early when the tools a source needs are missing (before anything is touched)."""
    if isinstance(source, GitSource):
        _need("git", "a git+ source")
        if source.url.startswith("ssh://"):
            _need("ssh", "a git+ssh source")
    else:
        _need("rsync", f"a {source.kind}:// source")
        if isinstance(source, RsyncSource):
            _need("ssh", "an rsync:// source")


def ssh_command(source: RsyncSource, identity: str | None, env: Mapping[str, str] | None = None) -> str:
    """The remote shell rsync runs: $RSYNC_RSH (default ssh) plus port, key and no prompts.

    RSYNC_RSH is rsync's own variable for the remote shell, so ssh options a
    site already passes that way (a known-hosts file, a jump host) keep working.
    """
    env = os.environ if env is None else env
    words = shlex.split(env.get("RSYNC_RSH", "").strip() or "ssh")
    if source.port is not None:
        words += ["-p", str(source.port)]
    if identity:
        words += ["-i", identity, "-o", "IdentitiesOnly=yes"]
    words += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT}"]
    return " ".join(shlex.quote(word) for word in words)


def rsync_argv(src: str, dest: Path, *, rsh: str | None = None, excludes: tuple[str, ...] = EXCLUDES,
               delete: bool = True, safe_links: bool = False, writable_dirs: bool = False) -> list[str]:
    # --modify-window=-1: compare mtimes to the nanosecond. The default compares whole
    # seconds, so a same-size edit made within a second of the previous copy would be
    # skipped by rsync's quick check and the tree would keep the old file.
    argv = ["rsync", "-a", "--modify-window=-1"]
    if delete:
        argv.append("--delete")
    if safe_links:  # a pull never takes a link that points outside the tree it fetches
        argv.append("--safe-links")
    if writable_dirs:  # a worker's copy is its own to build in and fetch over: no directory lands read-only
        argv.append("--chmod=Du+rwx")
    argv += [f"--exclude={pattern}" for pattern in excludes]
    if rsh is not None:
        argv += ["-e", rsh]
    return argv + [src, f"{dest}/"]


def _run(argv: list[str], what: str, env: Mapping[str, str] | None = None,
         pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=None if env is None else dict(env),
                              stdin=subprocess.DEVNULL, pass_fds=pass_fds)
    except OSError as exc:
        raise FetchError(f"cannot start {argv[0]} to {what}: {exc.strerror}.") from None


# The program rsync runs as its remote shell, in front of ssh, to report ssh's own exit status (its docstring
# says why rsync's status cannot be trusted to carry it).
RSH_STATUS = "fdl.hostside.rsh_status"


def _rsync_over_ssh(argv_for: Callable[[str], list[str]], rsh: str, what: str,
                    env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
    """Run the rsync command line `argv_for(remote shell)` with `rsh` (ssh_command()) as its remote shell, started
    through fdl/hostside/rsh_status.py. The result is rsync's, except that its returncode is SSH_FAILED whenever
    rsync failed and the remote shell itself exited 255 (ssh could not connect or log in), which rsync reports as
    12 about as often as it passes the 255 on: it takes ssh's status only if ssh is already gone when it exits."""
    read_end, write_end = os.pipe()
    wrapper = " ".join(shlex.quote(word) for word in (sys.executable, "-I", "-m", RSH_STATUS, str(write_end)))
    with os.fdopen(read_end, "rb") as status:
        try:
            result = _run(argv_for(f"{wrapper} {rsh}"), what, env, pass_fds=(write_end,))
        finally:
            os.close(write_end)
        # Read to the end, which comes once the wrapper is gone: it held rsync's stderr too, which _run read to its
        # end, so this waits no longer than rsync's own output did.
        said = status.read(64)
    if result.returncode != 0 and said.strip() == str(SSH_FAILED).encode():
        result.returncode = SSH_FAILED
    return result


def _tail(text: str, lines: int = 12) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return "\n    ".join(kept) if kept else "(no output)"


Vet = Callable[[list[tuple[str, str]]], None]


def materialize(source: SourceSpec, tree: Path, *, identity: str | None = None, note: Note = lambda _: None,
                env: Mapping[str, str] | None = None, excludes: tuple[str, ...] = EXCLUDES,
                safe_links: bool = False, writable_dirs: bool = False, vet: Vet | None = None) -> Fetched:
    """Make `tree` hold the source, incrementally. `tree` is fdl's to manage: local edits there do not survive.

    vet (git sources): called with the fetched commit's symbolic links, (path, link text) each, before anything
    is checked out; when it raises, the tree's files are as they were (and a repository this call made is gone).
    """
    tree = Path(tree)
    tree.mkdir(parents=True, exist_ok=True)
    if isinstance(source, GitSource):
        return _git(source, tree, identity, note, env, vet)
    if isinstance(source, FileSource):
        src = source.path.rstrip("/") + "/"
        argv = rsync_argv(src, tree, excludes=excludes, safe_links=safe_links, writable_dirs=writable_dirs)
        result = _run(argv, f"copy {source.path}", env)
    else:
        def argv_for(rsh: str) -> list[str]:
            return rsync_argv(source.remote.rstrip("/") + "/", tree, rsh=rsh, excludes=excludes,
                              safe_links=safe_links, writable_dirs=writable_dirs)

        result = _rsync_over_ssh(argv_for, ssh_command(source, identity, env), f"pull {source.remote}", env)
    if result.returncode != 0:
        raise FetchError(_rsync_failure(source, result), hint=_rsync_hint(source, result))
    note(f"source: {'copied' if isinstance(source, FileSource) else 'pulled'} {source.spec} into {tree} "
         f"(rsync, incremental)")
    return Fetched(kind=source.kind)


# rsync's exit statuses (rsync(1), EXIT VALUES) that fdl tells apart. Failures are classified by
# these and by what was asked, never by the wording of a message: that changes between releases
# (Debian 12's rrsync 3.2.7 and 3.5.0 answer the same request with different text and statuses).
RSYNC_PARTIAL = 23  # some files were not transferred: the remote path (or part of it) is not there
RSYNC_VANISHED = 24  # source files vanished during the copy
RSYNC_STREAM = 12  # the remote side closed before or during the transfer (a forced command refused it)
SSH_FAILED = 255  # ssh's own status when it cannot connect or log in (learnt from ssh itself: _rsync_over_ssh)
NOT_THERE = (RSYNC_PARTIAL, RSYNC_STREAM)


def _rsync_failure(source: SourceSpec, result: subprocess.CompletedProcess[str]) -> str:
    code = result.returncode
    if code == RSYNC_VANISHED:
        why = "files vanished from the source while it was being copied (it changed under the copy)"
    elif code == SSH_FAILED:
        why = "ssh could not connect or log in"
    else:
        why = f"rsync exited {code}"
    return f"fetching {source.spec} failed: {why}:\n    {_tail(result.stderr)}"


def _rsync_hint(source: SourceSpec, result: subprocess.CompletedProcess[str]) -> str:
    if isinstance(source, FileSource):
        return "Check that the directory exists and is readable, then publish again."
    if result.returncode == SSH_FAILED:
        return ("Check the host, port, user and key (--identity), and that this box knows the host's key "
                "(ssh once by hand, or pass ssh options through RSYNC_RSH).")
    return ("Check the remote path, and that the key's forced command (if any) permits rsync: a key "
            "restricted with command=\"rrsync -ro DIR\" sees paths re-rooted at DIR.")


# The credential helper of one fetch: git asks it for the user and password of the URL the spec carried, and it
# answers from this process's environment (readable by this user alone, never on a command line, never in a
# file). It answers "get" only; git's "store" and "erase" reach nothing. An empty credential.helper first
# clears the helpers of the user's own configuration, so none of them stores what the URL carried.
_URL_CREDENTIAL_HELPER = (
    f'!f() {{ test "$1" = get || exit 0; printf "username=%s\\n" "${FDL_GIT_USERNAME}"; '
    f'if [ -n "${{{FDL_GIT_PASSWORD}+set}}" ]; then printf "password=%s\\n" "${FDL_GIT_PASSWORD}"; fi; }}; f')


def _git_config_env(out: dict[str, str], pairs: list[tuple[str, str]]) -> None:
    """Add git configuration through GIT_CONFIG_COUNT/KEY/VALUE (after any the caller set): no command line."""
    try:
        count = int(out.get("GIT_CONFIG_COUNT", "0") or "0")
    except ValueError:
        count = 0
    for key, value in pairs:
        out[f"GIT_CONFIG_KEY_{count}"] = key
        out[f"GIT_CONFIG_VALUE_{count}"] = value
        count += 1
    out["GIT_CONFIG_COUNT"] = str(count)


def _git_env(source: GitSource, identity: str | None, env: Mapping[str, str] | None) -> dict[str, str]:
    out = dict(os.environ if env is None else env)
    out["GIT_TERMINAL_PROMPT"] = "0"  # never wait on a credential prompt
    out.setdefault("GIT_ASKPASS", "true")
    for name in (FDL_GIT_USERNAME, FDL_GIT_PASSWORD):
        out.pop(name, None)
    if source.credentials is not None:
        out[FDL_GIT_USERNAME] = source.credentials.username
        if source.credentials.password is not None:
            out[FDL_GIT_PASSWORD] = source.credentials.password
        _git_config_env(out, [("credential.helper", ""), ("credential.helper", _URL_CREDENTIAL_HELPER)])
    if source.url.startswith("ssh://"):
        words = shlex.split(out.get("GIT_SSH_COMMAND", "").strip() or "ssh")
        if identity:
            words += ["-i", identity, "-o", "IdentitiesOnly=yes"]
        words += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT}"]
        out["GIT_SSH_COMMAND"] = " ".join(shlex.quote(w) for w in words)
    return out


def _git(source: GitSource, tree: Path, identity: str | None, note: Note,
         env: Mapping[str, str] | None, vet: Vet | None = None) -> Fetched:
    made_repo = not (tree / ".git").is_dir()
    try:
        target = _git_fetch(source, tree, identity, note, env)
        if vet is not None:
            vet(commit_links(tree, target, env))
    except BaseException:
        if made_repo:  # a refused or failed fetch leaves the tree as it found it: no repository of its own
            shutil.rmtree(tree / ".git", ignore_errors=True)
        raise
    return _git_checkout(source, tree, target, identity, note, env)


def commit_links(tree: Path, rev: str, env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """The symbolic links a commit of the repository in `tree` holds, (path, link text) each, read from git's
    objects (`ls-tree`, `cat-file`): nothing is checked out, and no link is followed."""
    listed = subprocess.run(["git", "-C", str(tree), "ls-tree", "-r", "-z", "--full-tree", rev],
                            capture_output=True, env=None if env is None else dict(env), stdin=subprocess.DEVNULL)
    if listed.returncode != 0:
        raise FetchError(f"git failed to list the files of {rev} in {tree}:\n    "
                         f"{_tail(listed.stderr.decode(errors='replace'))}")
    links: list[tuple[str, bytes]] = []
    for record in listed.stdout.split(b"\0"):
        head, tab, raw = record.partition(b"\t")
        fields = head.split()
        if tab and len(fields) == 3 and fields[0] == b"120000" and fields[1] == b"blob":
            links.append((os.fsdecode(raw), fields[2]))
    if not links:
        return []
    read = subprocess.run(["git", "-C", str(tree), "cat-file", "--batch"], capture_output=True,
                          input=b"".join(oid + b"\n" for _, oid in links), env=None if env is None else dict(env))
    if read.returncode != 0:
        raise FetchError(f"git failed to read the links of {rev} in {tree}:\n    "
                         f"{_tail(read.stderr.decode(errors='replace'))}")
    out, texts = read.stdout, []
    for path, _oid in links:  # "<oid> blob <size>\n<contents>\n" per object, in the order asked
        header, _, out = out.partition(b"\n")
        fields = header.split()
        if len(fields) != 3 or not fields[2].isdigit():
            raise FetchError(f"git could not read the link {path} of {rev} in {tree} "
                             f"({header.decode(errors='replace')}).")
        size = int(fields[2])
        texts.append(os.fsdecode(out[:size]))
        out = out[size + 1:]
    return [(path, text) for (path, _), text in zip(links, texts, strict=True)]


def _git_fetch(source: GitSource, tree: Path, identity: str | None, note: Note,
               env: Mapping[str, str] | None) -> str:
    """Fetch the spec's ref into the repository in `tree` (made when missing); returns what to check out."""
    genv = _git_env(source, identity, env)

    def git(*args: str, what: str) -> subprocess.CompletedProcess[str]:
        return _run(["git", "-C", str(tree), *args], what, genv)

    def must(result: subprocess.CompletedProcess[str], what: str) -> None:
        if result.returncode != 0:
            raise FetchError(f"git failed to {what} in {tree}:\n    {_tail(result.stderr)}")

    if source.credentials is not None:
        note(f"source: the URL of {source.spec} carried a user or password; git gets them from a credential "
             f"helper of this fetch alone, and they are written nowhere (the manifest, the report and the logs carry "
             f"the URL without them). Keep credentials in a git credential helper or GIT_ASKPASS instead: a URL "
             f"on a command line is visible to every account on this box while the command runs")
    if not (tree / ".git").is_dir():
        must(git("init", "--quiet", what="initialise the tree"), "initialise the tree")
    fetched = git("fetch", "--quiet", "--no-tags", "--depth", "1", "--", source.url, source.ref,
                  what=f"fetch {source.spec}")
    target = "FETCH_HEAD"
    if fetched.returncode != 0:
        first_error = fetched.stderr
        # A commit by (possibly abbreviated) sha cannot always be fetched by name;
        # fetch the branches and tags and look it up among them.
        if all(ch in "0123456789abcdef" for ch in source.ref.lower()) and 4 <= len(source.ref) <= 64:
            full = git("fetch", "--quiet", "--tags", "--", source.url,
                       "+refs/heads/*:refs/fdl-fetch/heads/*", what=f"fetch {source.spec}")
            found = git("rev-parse", "--verify", "--quiet", f"{source.ref}^{{commit}}",
                        what="find the commit") if full.returncode == 0 else None
            if found is None or found.returncode != 0:
                raise FetchError(
                    f"fetching {source.spec} failed: no branch, tag or commit '{source.ref}' there:\n    "
                    f"{_tail(first_error)}",
                    hint="Check the ref (a full commit sha always works when the commit is on a branch).")
            target = found.stdout.strip()
        else:
            raise FetchError(
                f"fetching {source.spec} failed (is '{source.ref}' a branch, tag or commit of {source.url}?):"
                f"\n    {_tail(first_error)}",
                hint="Check the URL, the ref and this box's access to the repository.")
    return target


def _git_checkout(source: GitSource, tree: Path, target: str, identity: str | None, note: Note,
                  env: Mapping[str, str] | None) -> Fetched:
    genv = _git_env(source, identity, env)

    def git(*args: str, what: str) -> subprocess.CompletedProcess[str]:
        return _run(["git", "-C", str(tree), *args], what, genv)

    def must(result: subprocess.CompletedProcess[str], what: str) -> None:
        if result.returncode != 0:
            raise FetchError(f"git failed to {what} in {tree}:\n    {_tail(result.stderr)}")

    must(git("checkout", "--quiet", "--force", "--detach", target, what="check out"), f"check out {source.ref}")
    # Files that are not part of this commit (a previous source's) go; build output stays.
    must(git("clean", "--quiet", "-f", "-d", "-e", "target/", "-e", "/libtorch/", what="clean"),
         "remove files that are not part of the commit")
    head = git("rev-parse", "HEAD", what="read the commit")
    commit = head.stdout.strip() if head.returncode == 0 else None
    note(f"source: checked out {source.spec} ({commit[:12] if commit else '?'}) in {tree}")
    return Fetched(kind="git", commit=commit)


# --------------------------------------------------------------------------- the worker's pull


def _read_remote_manifest(source: FileSource | RsyncSource, identity: str | None, scratch: Path,
                          env: Mapping[str, str] | None) -> bytes | None:
    if isinstance(source, FileSource):
        try:
            return (Path(source.path) / MANIFEST_NAME).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise FetchError(f"cannot read {source.path}/{MANIFEST_NAME}: {exc.strerror}.") from None
    result = _fetch_remote_manifest(source, source.path, identity, scratch, env)
    if result.returncode == 0:
        return (scratch / "manifest").read_bytes()
    if result.returncode == SSH_FAILED:
        raise RemoteError(_rsync_failure(source, result), hint=_rsync_hint(source, result))
    if result.returncode not in NOT_THERE:
        raise FetchError(_rsync_failure(source, result), hint=_rsync_hint(source, result))
    # The manifest is not where it was asked for. When an absolute path was asked for, a key that
    # re-roots paths (command="rrsync -ro DIR") would serve it under a shorter spelling: ask for
    # the manifest under each tail of the path; one that answers names the spelling to use.
    for tail in rerooted_spellings(source.path):
        probe = _fetch_remote_manifest(source, tail, identity, scratch, env)
        if probe.returncode == 0:
            raise ManifestMissing(
                f"no run manifest at {source.path}/{MANIFEST_NAME} on {source.host}, but there is one at "
                f"{tail}/{MANIFEST_NAME}: the key re-roots every path at the served directory (an rrsync key), "
                f"so the tree is {source.at(tail)} there; an absolute path is rooted twice.",
                hint=f"Use the spelling fdl publish printed: {source.at(tail)}")
        if probe.returncode == SSH_FAILED:
            raise RemoteError(_rsync_failure(source, probe), hint=_rsync_hint(source, probe))
    return None


def rerooted_spellings(path: str) -> list[str]:
    """The shorter absolute spellings of `path` a re-rooting key could serve it under, longest first.

    `/home/op/.flodl/run/tree` -> `/op/.flodl/run/tree`, ..., `/run/tree`, `/tree`.
    """
    parts = [part for part in path.split("/") if part]
    if not path.startswith("/") or len(parts) < 2:
        return []
    return ["/" + "/".join(parts[i:]) for i in range(1, len(parts))]


def _fetch_remote_manifest(source: RsyncSource, path: str, identity: str | None, scratch: Path,
                           env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
    target = scratch / "manifest"
    target.unlink(missing_ok=True)
    remote = _remote_at(source, path).rstrip("/") + "/" + MANIFEST_NAME
    return _rsync_over_ssh(lambda rsh: ["rsync", "-e", rsh, remote, str(target)], ssh_command(source, identity, env),
                           f"read the run manifest from {source.remote}", env)


def _remote_at(source: RsyncSource, path: str) -> str:
    host = f"[{source.host}]" if ":" in source.host else source.host
    return f"{source.user + '@' if source.user else ''}{host}:{path}"


def pull_run(source: FileSource | RsyncSource, dest: Path, *, identity: str | None = None,
             note: Note = lambda _: None, env: Mapping[str, str] | None = None) -> Manifest:
    """Fetch a published run (tree plus manifest) into dest; returns its manifest.

    Raises ManifestMissing (exit 1, transient) when nothing is published there
    or a publish started while the tree was being copied.
    """
    if isinstance(source, GitSource):
        raise FetchError("a published run is pulled from a file:// or rsync:// source (the served tree), "
                         "not from git.")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    remove_manifest(dest)
    where = source.spec
    with tempfile.TemporaryDirectory(prefix=".fdl-pull-", dir=dest.parent) as scratch:
        before = _read_remote_manifest(source, identity, Path(scratch), env)
        if before is None:
            raise ManifestMissing(
                f"no run is published at {where} yet ({MANIFEST_NAME} is missing): nothing was published there, "
                f"a publish is under way, or its build failed.",
                hint="Wait for the next dial, or run `fdl publish` on the controller. Behind an rrsync key, "
                     "paths are rooted at the served directory: the tree is HOST:/tree there.")
        first = parse_manifest(before, f"{where}/{MANIFEST_NAME}")
        materialize(source, dest, identity=identity, note=note, env=env, safe_links=True, writable_dirs=True)
        after = _read_remote_manifest(source, identity, Path(scratch), env)
    if after != before:
        raise ManifestMissing(
            f"a new publish started at {where} while its tree was being copied (run {first.run[:12]} was "
            f"replaced), so the copy may mix two runs; it is not used.",
            hint="Fetch again on the next dial.")
    atomic_write(dest / MANIFEST_NAME, before, mode=0o644)
    manifest = read_manifest(dest, required=True)
    assert manifest is not None
    return manifest
