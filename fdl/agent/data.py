"""The dataset root a worker's ranks read, and the directories its data plane writes.

`--data-path` names where the ranks look for data (shipped to them as
FDL_DATA_PATH). With `--data-source sshfs://...` fdl puts it there: when the
path is not already a mount point (and is not a directory someone already
filled), it is mounted read-only with sshfs. Nothing is checked when neither
option is set. The mount is left in place after the run, so the next dial of
a `--persist` box finds it there.

A mount that lost its server (the data host's sshd restarted, the host went
down, the sshfs process died) answers with an errno, never a message to
read: ENOTCONN once the FUSE daemon is gone, EIO or ECONNABORTED while it
reconnects in vain (`STALE`). Every dial checks a mount it finds (by
statvfs, which reaches the server); a stale FUSE mount is unmounted
lazily (`fusermount3 -uz`, `fusermount -uz`, or `umount -l` as root) and
mounted again. A data host that is down makes that mount fail: transient,
like everything here.

Writable directories are proven by writing, fsyncing and removing a file in
each: a permission bit can lie (read-only file systems, full disks, root
squash), a real write cannot. What is permanent about a stage is decided
once, before the first dial (fdl.agent.permanent); a failure here is
transient (exit 1), and says what would mend it (`disk_error`).
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from fdl.agent.options import SshfsSource, SshHop
from fdl.agent.tunnel import Tunnel, ssh_words
from fdl.errors import FdlError
from fdl.hostside.fsio import write_probe

MOUNT_TIMEOUT_S = 60
UNMOUNT_TIMEOUT_S = 30
Note = Callable[[str], None]
#: What a network file system answers once it lost its server: the mount is stale.
STALE = frozenset({errno.ENOTCONN, errno.ECONNABORTED, errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.EHOSTDOWN,
                   errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNREFUSED, errno.ECONNRESET})
MOUNTINFO = "/proc/self/mountinfo"


class DataError(FdlError):
    """The dataset root or a stage directory could not be put in place (transient: the next dial tries again)."""


def is_read_only(path: str) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


# ------------------------------------------------------------------------------------------ disk failures

def errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, "no errno")


def disk_hint(exc: OSError) -> str:
    """What would mend an OSError on this box's disks and mounts; none of it is permanent."""
    code = exc.errno
    if code == errno.ENOSPC:
        return ("The file system is full: free space on it (another account, old rank logs or the job's own "
                "checkpoints may have filled it). The next dial checks again.")
    if code == errno.EDQUOT:
        return "This user's disk quota there is used up: free some, or raise the quota. The next dial checks again."
    if code in STALE:
        return ("A network mount that lost its server, or a failing disk: check the mount and the host it comes "
                "from (a --data-source mount is mounted again by fdl itself). The next dial checks again.")
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ("Its modes, owner or mount changed since fdl join started, or a fetched tree carries a directory "
                "this user may not write: fix that (or publish the tree with writable directories). The next dial "
                "checks again.")
    return "The next dial checks again."


def disk_error(exc: OSError, what: str | None = None) -> DataError:
    """An OSError as a transient failure that names the path, the errno and what would mend it."""
    where = what or (f"{exc.filename}" if exc.filename is not None else "a file operation")
    return DataError(f"{where}: {exc.strerror or exc} ({errno_name(exc)}).", hint=disk_hint(exc))


def prove_writable(directories: Iterable[Path | str], *, what: str = "the stage directory",
                   note: Note = lambda _: None) -> None:
    """write_probe each directory; DataError (transient) on the first that fails."""
    directories = list(directories)
    for directory in directories:
        failed = write_probe(directory)
        if failed is not None:
            raise disk_error(failed, f"{what} {directory} is not writable")
    note("stage: " + ", ".join(str(d) for d in directories) + " writable")


# ------------------------------------------------------------------------------------------------ mounts

def _unescape(field: str) -> str:
    """A mountinfo path field: spaces, tabs, newlines and backslashes come as octal escapes (\\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def mount_type(path: str, mountinfo: str = MOUNTINFO) -> str | None:
    """The file system type mounted at path (the top one), from the kernel's mount table; None: no mount there.
    Read from the table, not by stat: a stale mount point cannot be stat'ed."""
    target = os.path.realpath(path)  # a component that cannot be stat'ed is kept as it is
    found = None
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as table:
            for line in table:
                fields = line.split()
                if "-" not in fields[6:]:
                    continue
                sep = fields.index("-", 6)
                if len(fields) > sep + 1 and _unescape(fields[4]) == target:
                    found = fields[sep + 1]
    except OSError:
        return None
    return found


def mount_problem(path: str) -> OSError | None:
    """Whether a mounted path answers, by statvfs: it reaches the server (sshfs asks it), where a stat or a listing
    may come from a cache, and it costs the same on a directory of a million files. The OSError, or None."""
    try:
        os.statvfs(path)
    except OSError as exc:
        return exc
    return None


def unmount_lazily(path: str, *, note: Note = lambda _: None) -> None:
    """Detach a stale FUSE mount from path (`-z`/`-l`: whoever still holds a file in it keeps it, the path is
    free at once); raises DataError when no tool could."""
    tried: list[str] = []
    commands = [["fusermount3", "-uz", path], ["fusermount", "-uz", path]]
    if os.geteuid() == 0:
        commands.append(["umount", "-l", path])
    for argv in commands:
        if mount_type(path) is None:
            break
        if shutil.which(argv[0]) is None:
            continue
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=UNMOUNT_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as exc:
            tried.append(f"{argv[0]}: {exc}")
            continue
        tried.append(f"{' '.join(argv[:2])} exited {done.returncode}")
    if mount_type(path) is not None:
        raise DataError(f"the stale mount on {path} could not be unmounted ({'; '.join(tried) or 'no fusermount'}).",
                        hint=f"Unmount it by hand (fusermount3 -uz {path}, or umount -l {path} as root); the next "
                             f"dial mounts it again.")
    note(f"data: unmounted the stale mount on {path}")


def data_host_down(source: SshfsSource, environ: Mapping[str, str] | None) -> str | None:
    """Why the data host does not answer at all (a refused or timed-out TCP connection to the address ssh
    dials, `ssh -G` after the user's ssh config), or None when it answers or cannot be told (a proxy)."""
    endpoint = Tunnel(SshHop(source.host, source.user, source.port), ("127.0.0.1", 0), environ=environ).endpoint()
    if endpoint is None:
        return None
    host, port = endpoint
    try:
        socket.create_connection((host, port), timeout=10).close()
    except OSError as exc:
        return f"{host}:{port} does not answer ({exc.strerror or exc}, {errno_name(exc)})"
    return None


# ------------------------------------------------------------------------------------------ the data root

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
    mounted = mount_type(data_root)
    problem = mount_problem(data_root) if mounted is not None else None
    if source is None:
        if problem is not None:
            raise DataError(f"the dataset root {data_root} (--data-path, a {mounted} mount) does not answer: "
                            f"{problem.strerror} ({errno_name(problem)}).",
                            hint="Whatever provisions that mount must mend it (only what it mounted itself, from "
                                 "--data-source, is mounted again by fdl); the next dial checks again.")
        if not os.path.isdir(data_root):
            raise DataError(f"the dataset root {data_root} (--data-path) is not there on this box.",
                            hint="Mount or copy the data there, or name --data-source sshfs://user@host:/path so "
                                 "fdl mounts it; the next dial checks again.")
        if not os.access(data_root, os.R_OK | os.X_OK):
            raise DataError(f"the dataset root {data_root} is not readable by this user.",
                            hint="Fix its permissions, or run fdl join as a user that can read it; the next dial "
                                 "checks again.")
        note(f"data: {data_root} is in place")
        return data_root
    if mounted is not None and problem is None:
        note(f"data: {data_root} is already mounted{' (read-only)' if is_read_only(data_root) else ''}")
        return data_root
    if problem is not None:
        if problem.errno not in STALE or not (mounted or "").startswith("fuse"):
            raise DataError(f"the mount on {data_root} ({mounted}) does not answer: {problem.strerror} "
                            f"({errno_name(problem)}).", hint=disk_hint(problem))
        note(f"data: the {mounted} mount on {data_root} is stale ({problem.strerror}, {errno_name(problem)}): "
             f"unmounting it to mount {source.spec} again")
        unmount_lazily(data_root, note=note)
    else:
        try:
            if os.path.isdir(data_root) and _not_empty(data_root):
                note(f"data: {data_root} is already there (not a mount point, but not empty): left as it is")
                return data_root
        except OSError as exc:
            raise disk_error(exc, f"the dataset root {data_root}") from None
    if shutil.which("sshfs") is None:
        raise DataError("--data-source sshfs:// needs sshfs, which is not installed on this box (any more).",
                        hint="Install it (Debian/Ubuntu: apt-get install sshfs); the next dial mounts again.")
    try:
        os.makedirs(data_root, exist_ok=True)
    except OSError as exc:
        raise disk_error(exc, f"cannot create the mount point {data_root}") from None
    return _mount(source, data_root, identity, environ, note)


def _not_empty(directory: str) -> bool:
    with os.scandir(directory) as entries:  # the first entry answers: no listing of a large dataset
        return next(entries, None) is not None


def _mount(source: SshfsSource, data_root: str, identity: str | None, environ: Mapping[str, str] | None,
           note: Note) -> str:
    argv = sshfs_argv(source, data_root, identity, environ)
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=MOUNT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise DataError(f"mounting {source.spec} on {data_root} did not finish within {MOUNT_TIMEOUT_S} s.",
                        hint="Check that the data host answers over ssh; the next dial tries again.") from None
    except OSError as exc:
        raise DataError(f"cannot run sshfs: {exc.strerror}.", hint="The next dial tries again.") from None
    if done.returncode != 0 or mount_type(data_root) is None:
        lines = [line for line in (done.stderr or "").strip().splitlines() if line.strip()][-5:]
        detail = "\n    ".join(lines) or f"sshfs exited {done.returncode}"
        down = data_host_down(source, environ)
        if down is not None:
            raise DataError(f"mounting {source.spec} read-only on {data_root} failed: the data host {down}:\n"
                            f"    {detail}",
                            hint="The data host (or its sshd) is down or unreachable from here: bring it back; the "
                                 "next dial mounts again.")
        raise DataError(f"mounting {source.spec} read-only on {data_root} failed (sshfs exited "
                        f"{done.returncode}):\n    {detail}",
                        hint="Check the host, path and key (--identity), that this box knows the host's key, and "
                             "that FUSE is usable here (/dev/fuse, fusermount3); the next dial tries again.")
    note(f"data: mounted {source.spec} read-only on {data_root}")
    return data_root
