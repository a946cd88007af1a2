"""Durable file system changes: the one place fdl writes a file, moves a directory or a link into place.

Host-side (fdl/hostside/), because code that runs on managed hosts writes through it too (the
authorized_keys edit, the launcher's staging, the probe's textfile, the NCCL build's install); the rest of
fdl imports it from here. Nothing else in fdl renames, replaces or fsyncs on its own (tests/unit/
test_host_logic.py holds that rule for fdl/, library/ and inventory_plugins/).

A file: a reader of `path` sees either the old content or the new, never a mix, and after a crash the file
is one of the two: the data goes to a temporary file in the same directory, which is given its mode (and
owner), fsynced, renamed over `path`, and the directory is fsynced so the rename itself is durable
(atomic_write; atomic_symlink for a link).

A directory: it is built under a temporary name beside its target (staging_dir), every file and directory
in it is fsynced, and it is renamed onto the target in one step, after which the parent is fsynced
(install_dir). An earlier target is exchanged with the new one in that same step where the kernel can
(renameat2 RENAME_EXCHANGE), so readers see the old tree or the new, never neither; it is deleted after.
A directory leaves the same way: renamed aside in one step, then deleted (retire_dir).
"""

import contextlib
import errno
import os
import secrets
import shutil
import stat
import tempfile
from typing import Callable, Iterator, Optional, Tuple, Union

PathLike = Union[str, "os.PathLike[str]"]
TEMP_SUFFIX = ".fdl-tmp"
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_CANNOT = (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP)  # the kernel or file system lacks it


def fsync_dir(directory: PathLike) -> None:
    """fsync a directory so a rename, creation or unlink in it survives a crash (absent: nothing to do)."""
    try:
        fd = os.open(os.fspath(directory), os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _no_step(name: str) -> None:
    """Default crash-test seam: nothing happens between the steps of a write."""


def atomic_write(
    path: PathLike,
    data: Union[bytes, str],
    mode: int = 0o644,
    owner: Optional[Tuple[int, int]] = None,
    step: Callable[[str], None] = _no_step,
) -> None:
    """Replace `path` with `data` atomically and durably (str is written as UTF-8).

    `owner` (uid, gid) is applied only when running as root. `step` is called with "created",
    "written", "mode-set", "synced" and "renamed" between the steps, a seam for crash tests.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(target) + ".", suffix=TEMP_SUFFIX, dir=directory)
    renamed = False
    try:
        step("created")
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        step("written")
        os.fchmod(fd, mode)
        if owner is not None and os.geteuid() == 0:
            os.fchown(fd, owner[0], owner[1])
        step("mode-set")
        os.fsync(fd)
        step("synced")
        os.close(fd)
        fd = -1
        os.replace(tmp, target)
        renamed = True
        step("renamed")
        fsync_dir(directory)
    finally:
        if fd >= 0:
            os.close(fd)
        if not renamed:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass


def _hidden_name(path: str, suffix: str) -> str:
    """A fresh hidden name beside `path`: `.NAME.<random>SUFFIX`."""
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{secrets.token_hex(4)}{suffix}")


def atomic_symlink(path: PathLike, points_to: str, suffix: str = TEMP_SUFFIX) -> None:
    """Make `path` a symbolic link to `points_to` in one rename (an earlier link or file is replaced), durably.

    The link is made under a hidden name beside `path` ending in `suffix` (what a caller's sweep of leftovers
    looks for), then renamed over it, and the directory is fsynced."""
    target = os.path.abspath(os.fspath(path))
    while True:
        tmp = _hidden_name(target, suffix)
        try:
            os.symlink(points_to, tmp)
            break
        except FileExistsError:
            continue
    try:
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(target))


def write_probe(directory: PathLike) -> Optional[OSError]:
    """Create the directory and write, fsync and remove a file in it; the OSError that stopped it, or None."""
    path = os.fspath(directory)
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".fdl-write-probe.")
        try:
            os.write(fd, b"fdl\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        return exc
    return None


# ---- directories ----

def fsync_tree(root: PathLike) -> None:
    """fsync every regular file and every directory under `root` (links are not followed), `root` last."""
    top = os.fspath(root)
    for directory, _dirs, files in os.walk(top, topdown=False, onerror=_raise):
        for name in files:
            path = os.path.join(directory, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        fsync_dir(directory)


def _raise(exc: OSError) -> None:
    raise exc


def _renameat2(src: str, dst: str, flags: int) -> bool:
    """Linux renameat2(2) with `flags`; False when the kernel, libc or file system cannot (nothing moved)."""
    import ctypes

    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if call(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in _CANNOT:
        return False
    raise OSError(err, os.strerror(err), dst)


def _delete(path: str) -> None:
    """Remove what `path` is (a tree, a link or a file), as far as it goes: what is left is a hidden leftover."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _fsync_parents(*paths: str) -> None:
    for parent in dict.fromkeys(os.path.dirname(p) for p in paths):
        fsync_dir(parent)


def install_dir(staged: PathLike, target: PathLike, replace: bool = False, sync: bool = True) -> bool:
    """Put the directory `staged` in place at `target` in one rename; whether an earlier `target` was replaced.

    `staged` must be on the target's file system (staging_dir() makes one beside it). With `sync`, every file
    and directory under it is fsynced first, so that after a crash `target` is absent, the earlier one, or the
    whole new tree; the parents are fsynced after the rename. An existing `target`: without `replace`,
    FileExistsError and nothing moves (an empty directory counts: it is never silently replaced); with it,
    the two are exchanged in one step and the earlier one is deleted after (where the kernel cannot exchange,
    it is renamed aside first: for a moment there is no `target`).
    """
    src = os.path.abspath(os.fspath(staged))
    dst = os.path.abspath(os.fspath(target))
    if sync:
        fsync_tree(src)
    try:
        moved = _renameat2(src, dst, _RENAME_NOREPLACE)
    except FileExistsError:
        moved = False
    if not moved and not os.path.lexists(dst):
        try:
            os.rename(src, dst)
            moved = True
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    if moved:
        _fsync_parents(src, dst)
        return False
    if not replace:
        raise FileExistsError(errno.EEXIST, "already in place", dst)
    if _renameat2(src, dst, _RENAME_EXCHANGE):
        _fsync_parents(src, dst)
        _delete(src)  # the earlier tree, now under the staged name
        return True
    aside = retire_dir(dst)
    try:
        os.rename(src, dst)
    except OSError:
        os.rename(aside, dst)  # the earlier one back: nothing changed
        raise
    _fsync_parents(src, dst)
    _delete(aside)
    return True


def retire_dir(path: PathLike, suffix: str = TEMP_SUFFIX) -> str:
    """Take `path` out of place in one rename, to a hidden name beside it ending in `suffix`; returns that name.

    The parent is fsynced, so the removal survives a crash; deleting what was moved is the caller's (a hidden
    leftover is what its sweep looks for)."""
    src = os.path.abspath(os.fspath(path))
    while True:
        hidden = _hidden_name(src, suffix)
        if not os.path.lexists(hidden):
            break
    os.rename(src, hidden)
    fsync_dir(os.path.dirname(src))
    return hidden


@contextlib.contextmanager
def staging_dir(target: PathLike, suffix: str = TEMP_SUFFIX) -> Iterator[str]:
    """A new empty directory (0700) beside `target`, named `.NAME.<random>SUFFIX`, to build what install_dir puts
    in place; on the way out it is removed with whatever is left in it (nothing, once installed)."""
    dst = os.path.abspath(os.fspath(target))
    staged = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.", suffix=suffix, dir=os.path.dirname(dst))
    try:
        yield staged
    finally:
        _delete(staged)
