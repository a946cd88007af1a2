"""libtorch acquisition for `fdl join --libtorch`: download, verify, install atomically, activate.

Variants install under the user's libtorch root (`~/.flodl/libtorch/`) as
`precompiled/<name>` (cpu, cu126, cu128, rocm70,
rocm71), the layout the rest of fdl and flodl read; `.active` in the root is
pointed at the variant so later builds and probes use it too.

Downloads come from a mirror, a plain HTTP(S) directory named by
`FDL_LIBTORCH_MIRROR` (environment) or `libtorch_mirror:` in the `join:`
block. For variant V it serves:

    <mirror>/libtorch-V.zip          the libtorch archive (PyTorch's own zip layout:
                                     one top-level libtorch/ directory, or the tree itself)
    <mirror>/libtorch-V.zip.sha256   its SHA-256 (sha256sum's output, or the bare hex)

The archive is streamed to a temporary file next to its destination while it
is hashed; a checksum mismatch throws it away. It is then extracted into a
temporary directory in the same root (paths checked: nothing may land outside
it) and renamed into place in one step, so a variant directory either is
complete or does not exist. A lock file keeps two agents on one box from
installing the same variant at once.

`auto` routes on this box's own devices: CPU ranks get cpu; NVIDIA GPUs get
cu128, unless one is older than compute capability 7.0 (cu126 is the last
build for those); AMD GPUs get rocm7.1. One image thus serves both vendors.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import stat
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, NamedTuple

from fdl.agent.gpu import Offer
from fdl.agent.options import LIBTORCH_VARIANTS
from fdl.errors import FdlError, PermanentError
from fdl.fsio import atomic_write, fsync_dir

if TYPE_CHECKING:
    import requests

CONNECT_TIMEOUT_S = 15
READ_TIMEOUT_S = 60
MAX_CHECKSUM_BYTES = 4096
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
Note = Callable[[str], None]


class LibtorchFetchError(FdlError):
    """Downloading or installing a libtorch variant failed (transient: the next dial tries again)."""


class Installed(NamedTuple):
    """A libtorch variant present on this box."""

    variant: str  # cpu, cu128, ...
    path: Path  # the variant directory (holds lib/)
    label: str  # precompiled/cu128
    vendor: str | None  # "nvidia" | "amd" | None
    acquired: bool  # downloaded by this call


def home_of(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    return Path(environ.get("HOME") or str(Path.home()))


def libtorch_root(environ: Mapping[str, str] | None = None) -> Path:
    """The user's libtorch root, where every fdl command looks for installed variants."""
    return home_of(environ) / ".flodl" / "libtorch"


def vendor_of(variant: str) -> str | None:
    if variant.startswith("cu"):
        return "nvidia"
    if variant.startswith("rocm"):
        return "amd"
    return None


def route_auto(offer: Offer) -> str:
    """The variant `--libtorch auto` picks for what this box offers."""
    if offer.vendor is None:
        return "cpu"
    if offer.vendor == "amd":
        return "rocm7.1"
    old = [cap for cap in offer.capabilities if cap < (7, 0)]
    new = [cap for cap in offer.capabilities if cap >= (10, 0)]
    if old and new:
        listing = ", ".join(f"sm_{a}{b}" for a, b in offer.capabilities)
        raise PermanentError(
            f"--libtorch auto: no precompiled libtorch serves every GPU offered here ({listing}): cu126 is the "
            f"last build for GPUs older than sm_70, and sm_100+ needs cu128.",
            hint="Offer one generation with --devices, or build libtorch for both archs (builds/sm61-sm120) and "
                 "point LIBTORCH_PATH at it.")
    return "cu126" if old else "cu128"


def archive_name(variant: str) -> str:
    return f"libtorch-{variant}.zip"


def write_active(root: Path, label: str) -> None:
    """Point the root's `.active` at label (atomically: temp file, fsync, rename)."""
    path = root / ".active"
    try:
        if path.read_text().strip() == label:
            return
    except OSError:
        pass
    atomic_write(path, label + "\n", mode=0o644)


Progress = Callable[[int, "int | None"], None]  # (bytes so far, total bytes when the server said)


def ensure_variant(variant: str, *, mirror: str | None, environ: Mapping[str, str] | None = None,
                   note: Note = lambda _: None, progress: Progress | None = None,
                   activate: bool = True) -> Installed:
    """Make `variant` present under the libtorch root (downloading it if needed); activate it unless told not to."""
    if variant not in LIBTORCH_VARIANTS:
        raise PermanentError(f"libtorch variant {variant!r} is not one fdl acquires "
                             f"({', '.join(LIBTORCH_VARIANTS)}).")
    root = libtorch_root(environ)
    label = LIBTORCH_VARIANTS[variant]
    target = root / label
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(root / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    except OSError as exc:
        raise PermanentError(f"the libtorch root {root} is not writable: {exc.strerror}.",
                             hint="Give this user a writable home (~/.flodl).") from None
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        acquired = False
        if not (target / "lib").is_dir():
            if not mirror:
                raise PermanentError(
                    f"libtorch {variant} is not installed here ({target}) and no mirror is configured to "
                    f"download it from.",
                    hint="Set FDL_LIBTORCH_MIRROR (or libtorch_mirror: in the join: block) to the base URL that "
                         f"serves {archive_name(variant)} and its .sha256, or install the variant by hand.")
            _download_and_install(variant, mirror, target, note, progress)
            acquired = True
        else:
            note(f"libtorch: {label} already installed in {target}")
        if activate:
            write_active(root, label)
    finally:
        os.close(lock_fd)
    return Installed(variant=variant, path=target, label=label, vendor=vendor_of(variant), acquired=acquired)


def _get(session: requests.Session, url: str, *, stream: bool = False) -> requests.Response:
    import requests

    try:
        resp = session.get(url, stream=stream, timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
    except requests.exceptions.RequestException as exc:
        raise LibtorchFetchError(f"cannot download {url}: {_short(exc)}.",
                                 hint="Check the mirror URL (FDL_LIBTORCH_MIRROR) and this box's network, then try "
                                      "again (a joining worker retries on its next dial).") from None
    if resp.status_code != 200:
        resp.close()
        raise LibtorchFetchError(f"cannot download {url}: HTTP {resp.status_code}.",
                                 hint="Check that the mirror serves this variant's archive and checksum.")
    return resp


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."


def _download_and_install(variant: str, mirror: str, target: Path, note: Note,
                          progress: Progress | None = None) -> None:
    import requests

    base = mirror.rstrip("/")
    name = archive_name(variant)
    url = f"{base}/{name}"
    with requests.Session() as session:
        resp = _get(session, url + ".sha256")
        text = resp.content[:MAX_CHECKSUM_BYTES].decode("ascii", "replace").strip()
        resp.close()
        expected = text.split()[0] if text else ""
        if not _HEX64.match(expected):
            raise LibtorchFetchError(f"{url}.sha256 does not hold a SHA-256 checksum.",
                                     hint="The mirror must serve sha256sum's output (or the bare hex) next to "
                                          "the archive.")
        note(f"libtorch: downloading {url}")
        fd, archive = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".zip.part")
        try:
            digest = hashlib.sha256()
            size = 0
            with os.fdopen(fd, "wb") as handle:
                resp = _get(session, url, stream=True)
                length = resp.headers.get("Content-Length", "")
                total = int(length) if length.isdigit() else None
                try:
                    for chunk in resp.iter_content(1 << 20):
                        digest.update(chunk)
                        handle.write(chunk)
                        size += len(chunk)
                        if progress is not None:
                            progress(size, total)
                except requests.exceptions.RequestException as exc:
                    raise LibtorchFetchError(f"the download of {url} broke off: {_short(exc)}.") from None
                finally:
                    resp.close()
            if digest.hexdigest() != expected.lower():
                raise LibtorchFetchError(
                    f"{url} failed its checksum: got sha256 {digest.hexdigest()}, the mirror says {expected.lower()}"
                    f" ({size} bytes downloaded). Nothing was installed.",
                    hint="A mirror in the middle of an update, or a corrupted transfer; the next dial tries again.")
            _install(Path(archive), target, url)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(archive)
    note(f"libtorch: installed {variant} in {target} (sha256 verified)")


def _install(archive: Path, target: Path, url: str) -> None:
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        try:
            with zipfile.ZipFile(archive) as zf:
                _safe_extract(zf, staging, url)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise LibtorchFetchError(f"{url} is not a readable zip archive ({_short(exc)}).") from None
        entries = [p for p in staging.iterdir()]
        tree = entries[0] if len(entries) == 1 and entries[0].is_dir() and not (staging / "lib").is_dir() \
            else staging
        if not (tree / "lib").is_dir():
            raise LibtorchFetchError(f"{url} holds no libtorch: there is no lib/ directory in it.",
                                     hint="The archive must be a libtorch distribution (lib/, include/, ...).")
        os.chmod(tree, 0o755)
        try:
            os.rename(tree, target)
        except OSError as exc:
            if (target / "lib").is_dir():  # installed meanwhile by someone else: theirs is as good
                return
            raise LibtorchFetchError(f"cannot move libtorch into {target}: {exc.strerror}.") from None
        fsync_dir(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _safe_extract(zf: zipfile.ZipFile, dest: Path, url: str) -> None:
    """Extract every member under dest, refusing absolute paths, '..', and links that leave dest."""
    base = dest.resolve()
    for info in zf.infolist():
        name = PurePosixPath(info.filename)
        if info.filename.startswith("/") or ".." in name.parts or "\\" in info.filename:
            raise LibtorchFetchError(f"{url} contains an unsafe path ({info.filename!r}); nothing was installed.")
        out = base.joinpath(*name.parts) if name.parts else base
        mode = (info.external_attr >> 16) & 0o7777
        kind = (info.external_attr >> 16) & 0o170000
        if info.is_dir():
            out.mkdir(parents=True, exist_ok=True)
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        if kind == stat.S_IFLNK:
            link = zf.read(info).decode("utf-8", "replace")
            resolved = (out.parent / link).resolve()
            if link.startswith("/") or not str(resolved).startswith(str(base) + os.sep):
                raise LibtorchFetchError(f"{url} contains a link leaving the archive ({info.filename!r} -> "
                                         f"{link!r}); nothing was installed.")
            os.symlink(link, out)
            continue
        with zf.open(info) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.chmod(out, (mode & 0o755) or 0o644)
