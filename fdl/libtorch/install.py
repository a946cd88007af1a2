"""Downloading a libtorch variant into the user's root, verified, installed in one step, or not at all.

What is verified, in order (PyTorch publishes no checksums, so a pin is the fleet's own):

1. transport: PyTorch's location is HTTPS only, redirects included; a mirror given as https:// may not
   redirect to http:// either;
2. completeness: the bytes received match the Content-Length the server announced (a dropped connection
   fails here or in the read);
3. the pin: when `libtorch: sha256:` pins the variant, or the mirror serves a `.sha256`, the archive's
   SHA-256 must equal it (when both exist they must agree before anything is fetched);
4. the archive: every member's CRC-32 is checked, and every member path and link target is checked to stay
   inside the tree, before anything is unpacked;
5. what it is: PyTorch's own `build-version` inside the archive must name the variant asked for (and the
   pinned release, for an archive in PyTorch's naming).

The SHA-256 of what was fetched is recorded in the variant (`.fdl-download`, shown by `fdl libtorch info`),
so a fleet can pin the bytes its first box got. The archive is unpacked into a temporary directory beside
its destination and renamed into place; a variant directory is complete or absent. A lock file in the root
keeps two installs apart; whatever fails, no temporary file, lock, or directory this install made stays
behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO, NamedTuple
from urllib.parse import urljoin, urlsplit

from fdl.config.parse import is_sha256
from fdl.errors import FdlError, UsageError
from fdl.hostside.envvars import FDL_LIBTORCH_MIRROR
from fdl.hostside.fsio import TEMP_SUFFIX, atomic_write, install_dir, staging_dir
from fdl.hostside.libtorch.resolve import ACTIVE, RECORD, describe_variant, home_of, home_root, read_active
from fdl.hostside.libtorch.variants import DOWNLOADS, VARIANT_GROUPS, Libtorch
from fdl.hostside.paths import FLODL_IN_HOME
from fdl.libtorch.source import (
    OFFICIAL_BASE,
    PYTORCH_RELEASE,
    Source,
    check_served,
    fdl_file,
    official_file,
    official_url,
)

if TYPE_CHECKING:
    import requests

CONNECT_TIMEOUT_S = 15
READ_TIMEOUT_S = 60
MAX_CHECKSUM_BYTES = 4096
OFFICIAL_HOST = urlsplit(OFFICIAL_BASE).hostname or OFFICIAL_BASE
MAX_REDIRECTS = 10
MAX_BUILD_VERSION_BYTES = 256
CHUNK = 1 << 20
Note = Callable[[str], None]
Progress = Callable[[int, "int | None"], None]  # (bytes so far, total bytes when the server said)


class LibtorchFetchError(FdlError):
    """Downloading or verifying a libtorch variant failed; nothing was installed (a retry may mend it)."""


class Installed(NamedTuple):
    """A variant present under the user's root after ensure_variant."""

    libtorch: Libtorch
    variant: str  # the download name: cpu, cu130, ...
    acquired: bool  # downloaded by this call


class Located(NamedTuple):
    url: str
    expected: str | None  # the SHA-256 the archive must have
    pinned_by: str  # "libtorch.sha256", "the mirror's .sha256", "both", or "nothing"
    release: str | None  # the release its name promises (PyTorch's naming), None for fdl's naming


def write_active(root: Path, label: str) -> None:
    """Point the root's `.active` at label (atomically: temp file, fsync, rename)."""
    if read_active(root) == label:
        return
    atomic_write(root / ACTIVE, label + "\n", mode=0o644)


def ensure_variant(variant: str, *, source: Source, environ: Mapping[str, str] | None = None,
                   note: Note = lambda _: None, progress: Progress | None = None,
                   activate: bool = True) -> Installed:
    """Make `variant` present under the user's root (downloading it when missing); activate it unless told not.

    An installed variant is checked against the source's pin for it, when there is one: its install record
    must name those bytes (a mismatch is refused, not mended: re-downloading is a choice for its owner)."""
    if variant not in DOWNLOADS:
        raise UsageError(f"libtorch variant {variant!r} is not one fdl downloads ({', '.join(DOWNLOADS)}).")
    root = home_root(home_of(environ))
    label = DOWNLOADS[variant]
    target = root / label
    with root_lock(root):
        acquired = False
        if (target / "lib").is_dir():
            _check_installed_pin(describe_variant(target, "home", label), variant, source)
            note(f"libtorch: {label} already installed in {target}")
        else:
            check_served(variant, source)
            try:
                _download_and_install(variant, source, target, note, progress)
            except OSError as exc:  # the box's own disk: full, read-only, permissions
                raise LibtorchFetchError(f"cannot write libtorch {variant} under {root}: {exc.strerror or exc}; "
                                         f"nothing was installed.",
                                         hint="Free some space or fix the permissions there, then try again.") \
                    from None
            acquired = True
        if activate:
            try:
                write_active(root, label)
            except OSError as exc:
                raise LibtorchFetchError(f"libtorch {variant} is installed in {target}, but {root / ACTIVE} "
                                         f"could not be written: {exc.strerror or exc}.",
                                         hint=f"Fix that, then: fdl libtorch activate {variant}") from None
    return Installed(describe_variant(target, "home", label), variant, acquired)


def check_installed_pin(variant: str, source: Source, environ: Mapping[str, str] | None = None) -> None:
    """Refuse an installed `variant` whose bytes are not the ones the source pins (LibtorchFetchError); a variant
    that is not installed, or not pinned, passes."""
    label = DOWNLOADS[variant]
    target = home_root(home_of(environ)) / label
    if (target / "lib").is_dir():
        _check_installed_pin(describe_variant(target, "home", label), variant, source)


def _check_installed_pin(info: Libtorch, variant: str, source: Source) -> None:
    pin = source.pin(variant)
    if pin is None or info.sha256 == pin:
        return
    got = f"was installed from bytes with sha256 {info.sha256}" if info.sha256 else \
        "has no install record (it was not downloaded by fdl), so its bytes are unknown"
    raise LibtorchFetchError(f"libtorch {variant} in {info.path} {got}, but libtorch.sha256 pins {pin}.",
                             hint=f"Remove {info.path} and download it again (fdl libtorch download {variant}), or "
                                  f"correct the pin.")


# ---- the lock ----

@contextlib.contextmanager
def root_lock(root: Path) -> Iterator[None]:
    """Hold the root's install lock; afterwards remove the lock file and every directory left empty.

    The lock file is unlinked while held, so a waiter that locked the old file finds it gone and retries on
    the new one (two holders never coexist). On the way out the root's variant groups, the root, and a
    ~/.flodl this call created are removed when empty: a failed install leaves nothing."""
    parent_made = not root.parent.exists()
    fd = _lock(root)
    try:
        _sweep(root)
        yield
    finally:
        for group in (root / "precompiled", root / "builds"):  # while held: nobody is installing into them
            with contextlib.suppress(OSError):
                group.rmdir()  # only when empty
        with contextlib.suppress(OSError):
            os.unlink(root / ".lock")
        os.close(fd)
        for directory in (root,) + ((root.parent,) if parent_made else ()):
            with contextlib.suppress(OSError):
                directory.rmdir()  # only when empty (a next holder's lock file keeps the root)


def _sweep(root: Path) -> None:
    """Remove what an install killed outright (SIGKILL, power loss) left: its temporary archive and tree in a
    variant group, and an `.active` write's temporary file. Only under the lock: nobody else is writing them."""
    leftovers = [p for group in VARIANT_GROUPS for p in _entries(root / group)
                 if p.name.startswith(".") and p.name.endswith((".zip.part", ".tmp"))]
    leftovers += [p for p in _entries(root) if p.name.startswith(ACTIVE + ".") and p.name.endswith(TEMP_SUFFIX)]
    for path in leftovers:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()


def _entries(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except OSError:
        return []


def _lock(root: Path) -> int:
    path = root / ".lock"
    for _attempt in range(100):
        try:
            root.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            continue  # another install removed the empty root between the two calls: make it again
        except OSError as exc:  # its modes, a full disk, a stale mount: whoever can, mends it (fdl join decides
            # before its first dial whether its own permissions make this permanent: fdl.agent.permanent)
            name = errno.errorcode.get(exc.errno or 0, "no errno")
            raise LibtorchFetchError(f"cannot take the install lock in the libtorch root {root}: {exc.strerror} "
                                     f"({name}); nothing was installed.",
                                     hint=f"Free space there, or give this user a writable home ({FLODL_IN_HOME}); "
                                          f"then try again.") from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder before us removed this lock file: lock the current one
    raise LibtorchFetchError(f"could not take the install lock {path}: it kept being replaced.")


# ---- fetching ----

def _download_and_install(variant: str, source: Source, target: Path, note: Note, progress: Progress | None) -> None:
    import requests

    target.parent.mkdir(exist_ok=True)
    with requests.Session() as session:
        located = _locate(session, source, variant)
        note(f"libtorch: downloading {located.url}")
        fd, part = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".zip.part")
        try:
            with os.fdopen(fd, "wb") as handle:
                digest, size = _stream(session, located.url, variant, source, handle, progress)
            checked = "no pin to check against"
            if located.expected is not None:
                if digest != located.expected:
                    raise LibtorchFetchError(
                        f"{located.url} failed its checksum: got sha256 {digest}, {located.pinned_by} says "
                        f"{located.expected} ({size} bytes downloaded). Nothing was installed.",
                        hint="A mirror in the middle of an update, a corrupted transfer, or bytes other than the "
                             "ones the pin names; a retry tells the first two apart.")
                checked = f"sha256 verified against {located.pinned_by}"
            build = _install(Path(part), target, located, variant, f"sha256={digest}\nbytes={size}\n")
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
    note(f"libtorch: installed {variant} ({build}) in {target}; sha256 {digest} ({checked})")


def _locate(session: requests.Session, source: Source, variant: str) -> Located:
    pin = source.pin(variant)
    if source.official:
        return Located(official_url(variant), pin, "libtorch.sha256" if pin else "nothing", PYTORCH_RELEASE)
    fdl_url = f"{source.base}/{fdl_file(variant)}"
    mirror_sum = _checksum(session, fdl_url + ".sha256", source)
    if mirror_sum is not None:
        url, release = fdl_url, None
    else:
        url, release = official_url(variant, source.base), PYTORCH_RELEASE
        mirror_sum = _checksum(session, url + ".sha256", source)
    if pin is not None and mirror_sum is not None and pin != mirror_sum:
        raise LibtorchFetchError(f"{url}.sha256 says {mirror_sum}, but libtorch.sha256 pins {variant} to {pin}; "
                                 f"nothing was downloaded.",
                                 hint="The mirror serves other bytes than the fleet pinned: update the mirror or "
                                      "the pin.")
    expected = pin or mirror_sum
    by = "both" if pin and mirror_sum else "libtorch.sha256" if pin else \
        "the mirror's .sha256" if mirror_sum else "nothing"
    return Located(url, expected, by, release)


def _checksum(session: requests.Session, url: str, source: Source) -> str | None:
    """A mirror's checksum file (sha256sum's output or the bare hex), or None when it serves none."""
    resp = _get(session, url, source, absent_ok=True)
    if resp is None:
        return None
    try:
        text = resp.raw.read(MAX_CHECKSUM_BYTES, decode_content=True).decode("ascii", "replace").strip()
    except Exception as exc:  # urllib3's read errors are not requests' own exceptions
        raise LibtorchFetchError(f"cannot read {url}: {_reason(exc)}.") from None
    finally:
        resp.close()
    value = text.split()[0].lower() if text else ""
    if not is_sha256(value):
        raise LibtorchFetchError(f"{url} does not hold a SHA-256 checksum.",
                                 hint="The mirror must serve sha256sum's output (or the bare hex) there.")
    return value


def _get(session: requests.Session, url: str, source: Source, *, absent_ok: bool = False,
         missing: str | None = None) -> requests.Response | None:
    """GET url (streamed), following redirects by hand so that an https:// URL never takes an http:// hop:
    such a hop is refused before anything is sent to it."""
    import requests

    current = url
    for _hop in range(MAX_REDIRECTS + 1):
        try:
            resp = session.get(current, stream=True, allow_redirects=False,
                               timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
        except requests.exceptions.RequestException as exc:
            raise LibtorchFetchError(f"cannot download {current}: {_reason(exc)}.",
                                     hint=_unreachable_hint(exc, source)) from None
        if not resp.is_redirect:
            break
        following = urljoin(current, resp.headers.get("Location", ""))
        resp.close()
        if url.startswith("https://") and not following.startswith("https://"):
            raise LibtorchFetchError(f"{url} redirected to {following}, which is not HTTPS; nothing was "
                                     f"downloaded from there.",
                                     hint="A libtorch fetched over HTTPS stays on HTTPS; check the network path "
                                          "(a proxy or captive portal) or the mirror's redirects.")
        current = following
    else:
        raise LibtorchFetchError(f"{url} redirected more than {MAX_REDIRECTS} times; nothing was downloaded.")
    if absent_ok and resp.status_code in (403, 404):
        resp.close()
        return None
    if resp.status_code != 200:
        resp.close()
        raise LibtorchFetchError(f"cannot download {current}: HTTP {resp.status_code}.",
                                 hint=missing or f"Check that {source.describe()} serves this variant (docs/cli.md "
                                                 f"shows a mirror's layout).")
    return resp


def _stream(session: requests.Session, url: str, variant: str, source: Source, handle: BinaryIO,
            progress: Progress | None) -> tuple[str, int]:
    import requests

    missing = None
    if not source.official:
        missing = (f"Put the archive on {source.describe()}: as {fdl_file(variant)} with its .sha256 (fdl's "
                   f"naming), or as {variant}/{official_file(variant)} (PyTorch's); docs/cli.md shows both layouts.")
    resp = _get(session, url, source, missing=missing)
    assert resp is not None
    length = resp.headers.get("Content-Length", "")
    total = int(length) if length.isdigit() else None
    digest = hashlib.sha256()
    size = 0
    try:
        for chunk in resp.iter_content(CHUNK):
            digest.update(chunk)
            handle.write(chunk)  # an OSError here is this box's disk: ensure_variant reports it
            size += len(chunk)
            if progress is not None:
                progress(size, total)
    except requests.exceptions.RequestException as exc:
        raise LibtorchFetchError(f"the download of {url} broke off after {size} bytes: {_reason(exc)}. Nothing "
                                 f"was installed.", hint="Try again.") from None
    finally:
        resp.close()
    if total is not None and size != total:
        raise LibtorchFetchError(f"the download of {url} broke off: {size} of {total} bytes arrived. Nothing was "
                                 f"installed.", hint="Try again.")
    return digest.hexdigest(), size


def _reason(exc: BaseException, limit: int = 200) -> str:
    """What went wrong, in the words of the innermost cause: requests wraps urllib3's retry error, which wraps
    the failure itself (a name that does not resolve, a refused connection), each adding its own preamble. The
    cause's text is kept whole, or cut at a word with "..." when it is still longer than `limit`."""
    import requests
    import urllib3.exceptions

    inner: BaseException = exc
    for _depth in range(4):
        if isinstance(inner, urllib3.exceptions.MaxRetryError) and inner.reason is not None:
            inner = inner.reason
        elif isinstance(inner, requests.exceptions.RequestException) and inner.args and \
                isinstance(inner.args[0], BaseException):
            inner = inner.args[0]
        else:
            break
    text = " ".join(str(inner).split()) or type(inner).__name__
    conn = getattr(inner, "conn", None)  # NewConnectionError and its kin start with the connection object
    if conn is not None:
        text = text.removeprefix(f"{conn}: ")
    if len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0] + " ..."
    return text


def _unreachable_hint(exc: BaseException, source: Source) -> str:
    """The fix for a download that could not reach its source: on PyTorch's own location, name the mirror
    settings (a box that cannot reach download.pytorch.org can often reach a mirror)."""
    import requests

    retry = "then try again (a joining worker retries on its next dial)"
    if source.official and isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
        return (f"This box cannot reach {OFFICIAL_HOST} (offline, or behind a firewall or proxy). Fetch from a "
                f"mirror it can reach: `fdl libtorch download VARIANT --mirror URL`, or {FDL_LIBTORCH_MIRROR}=URL, "
                f"or `libtorch: mirror: URL` in fdl.yml (docs/cli.md shows a mirror's layout); or fix the "
                f"network, {retry}.")
    return f"Check this box's network and {source.describe()}, {retry}."


# ---- checking and unpacking ----

def _install(archive: Path, target: Path, located: Located, variant: str, fetched: str) -> str:
    """Check the archive whole, unpack it beside target, record it, rename it into place; return its build.

    `fetched` is the record's sha256= and bytes= lines."""
    url = located.url
    try:
        with zipfile.ZipFile(archive) as zf:
            prefix = _check_members(zf, url)
            build = _check_build_version(zf, prefix, url, variant, located.release)
            with staging_dir(target, suffix=".tmp") as staging:  # a hidden .tmp: what the lock's sweep removes
                _extract(zf, Path(staging))
                tree = Path(staging) / prefix.rstrip("/") if prefix else Path(staging)
                record = f"url={url}\n{fetched}build={build}\npinned_by={located.pinned_by}\n"
                (tree / RECORD).write_text(record, encoding="utf-8")
                os.chmod(tree, 0o755)
                try:  # what is at target has no lib/ (else nothing is downloaded): a half-made tree, replaced
                    install_dir(tree, target, replace=True)
                except OSError as exc:
                    if not (target / "lib").is_dir():  # not installed meanwhile by someone else
                        raise LibtorchFetchError(f"cannot move libtorch into {target}: {exc.strerror}.") from None
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise LibtorchFetchError(f"{url} is not a readable zip archive ({_reason(exc)}); nothing was installed.") \
            from None
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise LibtorchFetchError(f"no space left to unpack {url} into {target.parent}; nothing was "
                                     f"installed.", hint="Free some space and try again.") from None
        raise LibtorchFetchError(f"cannot unpack {url} into {target.parent}: {_reason(exc)}; nothing was "
                                 f"installed.") from None
    return build


def _check_members(zf: zipfile.ZipFile, url: str) -> str:
    """Every member's path and link stay inside the tree, and every CRC matches; return the tree's prefix
    ("libtorch/" for PyTorch's layout, "" for a flat archive)."""
    infos = zf.infolist()
    for info in infos:
        name = PurePosixPath(info.filename)
        if info.filename.startswith("/") or ".." in name.parts or "\\" in info.filename or "\0" in info.filename:
            raise LibtorchFetchError(f"{url} contains an unsafe path ({info.filename!r}); nothing was installed.")
        if stat.S_ISLNK(info.external_attr >> 16):
            if info.file_size > 4096:
                raise LibtorchFetchError(f"{url} contains a link with a {info.file_size}-byte target "
                                         f"({info.filename!r}); nothing was installed.")
            link = zf.read(info).decode("utf-8", "replace")
            inside = PurePosixPath(*name.parts[:-1], link).parts
            depth = 0
            for part in inside:
                depth += -1 if part == ".." else 0 if part == "." else 1
                if depth < 0:
                    break
            if link.startswith("/") or depth < 0:
                raise LibtorchFetchError(f"{url} contains a link leaving the archive ({info.filename!r} -> "
                                         f"{link!r}); nothing was installed.")
    bad = zf.testzip()  # reads every member: CRC-32 and the compressed stream
    if bad is not None:
        raise LibtorchFetchError(f"{url} is corrupt: member {bad!r} fails its CRC check; nothing was installed.",
                                 hint="A damaged archive on the server or in transit; try again, or check the "
                                      "mirror's copy.")
    tops = {PurePosixPath(i.filename).parts[0] for i in infos if PurePosixPath(i.filename).parts}
    prefix = ""
    if len(tops) == 1 and "lib" not in tops:
        prefix = tops.pop() + "/"
    if not any(i.filename.startswith(prefix + "lib/") for i in infos):
        raise LibtorchFetchError(f"{url} holds no libtorch: there is no lib/ directory in it; nothing was "
                                 f"installed.", hint="The archive must be a libtorch distribution (lib/, include/, "
                                                     "build-version).")
    return prefix


def _check_build_version(zf: zipfile.ZipFile, prefix: str, url: str, variant: str, release: str | None) -> str:
    """PyTorch's build-version in the archive names the variant asked for (and the release its name promises)."""
    try:
        with zf.open(prefix + "build-version") as member:
            text = member.read(MAX_BUILD_VERSION_BYTES).decode("utf-8", "replace").strip()
    except KeyError:
        raise LibtorchFetchError(f"{url} has no {prefix}build-version, so what it holds cannot be checked; nothing "
                                 f"was installed.", hint="PyTorch's libtorch archives carry one; a mirror's own "
                                                         "archive needs one too (e.g. 2.13.0+cpu).") from None
    version, _plus, suffix = text.partition("+")
    if suffix != variant or (release is not None and version != release):
        wanted = f"{release}+{variant}" if release is not None else f"<version>+{variant}"
        raise LibtorchFetchError(f"{url} holds libtorch {text!r}, not the {wanted} asked for; nothing was "
                                 f"installed.", hint="The server serves another build under this name; check the "
                                                     "mirror's files.")
    return text


def _extract(zf: zipfile.ZipFile, dest: Path) -> None:
    """Unpack every (already checked) member under dest, links as links, modes kept within 0o755."""
    for info in zf.infolist():
        out = dest.joinpath(*PurePosixPath(info.filename).parts)
        if info.is_dir():
            out.mkdir(parents=True, exist_ok=True)
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        if stat.S_ISLNK(info.external_attr >> 16):
            os.symlink(zf.read(info).decode("utf-8", "replace"), out)
            continue
        with zf.open(info) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK)
        os.chmod(out, ((info.external_attr >> 16) & 0o755) or 0o644)
