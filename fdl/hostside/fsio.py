"""Durable file writes: the one atomic-write and directory-fsync helper of fdl.

Host-side (fdl/hostside/), because code that runs on managed hosts writes through it too (the
authorized_keys edit, the launcher's staging, the probe's textfile); the rest of fdl imports it from here.

A reader of `path` sees either the old content or the new, never a mix, and after a crash the file is
one of the two: the data goes to a temporary file in the same directory, which is given its mode (and
owner), fsynced, renamed over `path`, and the directory is fsynced so the rename itself is durable.
"""

import os
import tempfile
from typing import Callable, Optional, Tuple, Union

PathLike = Union[str, "os.PathLike[str]"]
TEMP_SUFFIX = ".fdl-tmp"


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
