"""The dataset root a worker's ranks read, and the directories its data plane writes.

`--data-path` names where the ranks look for data (shipped to them as
FDL_DATA_PATH). With `--data-source sshfs://...` fdl puts it there: when the
path is not already a mount point (and is not a directory someone already
filled), it is mounted read-only with sshfs. Nothing is checked when neither
option is set. The mount is left in place after the run, so the next dial of
a `--persist` box finds it there.

Writable directories are proven by writing, fsyncing and removing a file in
each: a permission bit can lie (read-only file systems, full disks, root
squash), a real write cannot. An unwritable stage is permanent (exit 2).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from fdl.agent.options import SshfsSource
from fdl.agent.tunnel import ssh_words
from fdl.errors import ExitCode, FdlError, PermanentError

MOUNT_TIMEOUT_S = 60
Note = Callable[[str], None]


class DataError(FdlError):
    """The dataset root could not be put in place (transient unless said otherwise)."""


def is_read_only(path: str) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def sshfs_argv(source: SshfsSource, mountpoint: str, identity: str | None,
               environ: Mapping[str, str] | None = None) -> list[str]:
    options = ["ro", "reconnect", "ServerAliveInterval=15", "ServerAliveCountMax=3", "BatchMode=yes",
               "ConnectTimeout=15"]
    if source.port:
        options.append(f"port={source.port}")
    if identity:
        options += [f"IdentityFile={identity}", "IdentitiesOnly=yes"]
    words = ssh_words(environ)
    if words != ["ssh"]:  # sshfs splits -o on commas: escape any in the command
        options.append("ssh_command=" + shlex.join(words).replace(",", "\\,"))
    return ["sshfs", "-o", ",".join(options), source.remote, mountpoint]


def prepare_data(data_root: str | None, source: SshfsSource | None, *, identity: str | None = None,
                 environ: Mapping[str, str] | None = None, note: Note = lambda _: None) -> str | None:
    """Put the dataset root in place; returns it (None when no data plane is configured)."""
    if data_root is None:
        return None
    if source is None:
        if not os.path.isdir(data_root):
            raise DataError(f"the dataset root {data_root} (--data-path) is not there on this box.",
                            hint="Mount or copy the data there, or name --data-source sshfs://user@host:/path so "
                                 "fdl mounts it; the next dial checks again.")
        if not os.access(data_root, os.R_OK | os.X_OK):
            raise PermanentError(f"the dataset root {data_root} is not readable by this user.",
                                 hint="Fix its permissions, or run fdl join as a user that can read it.")
        note(f"data: {data_root} is in place")
        return data_root
    if os.path.ismount(data_root):
        note(f"data: {data_root} is already mounted{' (read-only)' if is_read_only(data_root) else ''}")
        return data_root
    if os.path.isdir(data_root) and os.listdir(data_root):
        note(f"data: {data_root} is already there (not a mount point, but not empty): left as it is")
        return data_root
    if shutil.which("sshfs") is None:
        raise PermanentError("--data-source sshfs:// needs sshfs, which is not installed on this box.",
                             hint="Install it (Debian/Ubuntu: apt-get install sshfs), or provision the data "
                                  "another way and name it with --data-path alone.")
    try:
        os.makedirs(data_root, exist_ok=True)
    except OSError as exc:
        raise PermanentError(f"cannot create the mount point {data_root}: {exc.strerror}.",
                             hint="Create it once as root and give it to this user (or choose a --data-path "
                                  "this user may create).") from None
    argv = sshfs_argv(source, data_root, identity, environ)
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=MOUNT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise DataError(f"mounting {source.spec} on {data_root} did not finish within {MOUNT_TIMEOUT_S} s.",
                        hint="Check that the data host answers over ssh; the next dial tries again.") from None
    except OSError as exc:
        raise DataError(f"cannot run sshfs: {exc.strerror}.") from None
    if done.returncode != 0 or not os.path.ismount(data_root):
        lines = [line for line in (done.stderr or "").strip().splitlines() if line.strip()][-5:]
        detail = "\n    ".join(lines) or f"sshfs exited {done.returncode}"
        raise DataError(f"mounting {source.spec} read-only on {data_root} failed:\n    {detail}",
                        hint="Check the host, path and key (--identity), that this box knows the host's key, and "
                             "that FUSE is usable here (/dev/fuse, fusermount3); the next dial tries again.",
                        exit_code=ExitCode.FAILURE)
    note(f"data: mounted {source.spec} read-only on {data_root}")
    return data_root


def prove_writable(directories: Iterable[Path | str], *, note: Note = lambda _: None) -> None:
    """Create each directory and write, fsync and remove a file in it; PermanentError on the first that fails."""
    directories = list(directories)
    for directory in directories:
        path = Path(directory)
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=path, prefix=".fdl-write-probe.")
            try:
                os.write(fd, b"fdl\n")
                os.fsync(fd)
            finally:
                os.close(fd)
                os.unlink(probe)
        except OSError as exc:
            raise PermanentError(
                f"the stage directory {path} is not writable: {exc.strerror or exc}.",
                hint="fdl join writes its source tree, build output and rank logs there; give this user a writable "
                     "home, or fix the directory's permissions or file system.") from None
    note("stage: " + ", ".join(str(d) for d in directories) + " writable")
