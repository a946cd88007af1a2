"""The shared-data check: the dataset root ranks read (and write) on this host.

It must exist, be a directory this user can list, and take a file (the probe
creates and removes a uniquely named empty file: permission bits alone would
say yes to root on a read-only mount). A path that sits on the root file
system rather than a mount of its own is a warning: on one host that is
normal, across hosts it means each box has its own copy.

Host-side (fdl/hostside/: runs in fdl and on managed hosts): standard library only, relative imports.
"""

from __future__ import annotations

import errno
import os
import time
from typing import Any

from ..paths import DEFAULT_DATA_PATH
from .report import ERROR, OK, SKIPPED, WARNING, CheckResult

NAME = "data"
SKIP_HINT = "on a single host without shared storage, --skip-mount skips this check"


def mount_of(path: str) -> tuple[str, str | None]:
    """(mount point, file system type) of the mount holding path, from /proc/self/mountinfo."""
    real = os.path.realpath(path)
    best, fstype = "/", None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                fields = line.split()
                if " - " not in line or len(fields) < 5:
                    continue
                point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
                after = line.split(" - ", 1)[1].split()
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):  # later lines stack over earlier ones
                    best, fstype = point, after[0] if after else None
    except OSError:
        pass
    return best, fstype


def check_data_path(path: str = DEFAULT_DATA_PATH, skip: bool = False) -> CheckResult:
    """Run the shared-data check on path; `skip` (--skip-mount) reports it as skipped."""
    data: dict[str, Any] = {"path": path}
    if skip:
        return CheckResult(NAME, SKIPPED, f"Shared data path {path} not checked (--skip-mount).", data=data)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return CheckResult(NAME, ERROR, f"Shared data path {path} does not exist on this host.",
                           hint=f"mount the shared dataset storage at {path} or name the right place with "
                                f"--data-path; {SKIP_HINT}", data=data)
    except PermissionError:
        return CheckResult(NAME, ERROR, f"Shared data path {path} cannot be reached: a parent directory denies "
                           f"access to this user.", hint="fix the permissions of its parent directories",
                           data=data)
    except OSError as exc:
        return CheckResult(NAME, ERROR, f"Shared data path {path} cannot be examined: {exc.strerror}.",
                           hint="a stale network mount is the usual cause: remount it", data=data)
    if not os.path.isdir(path):
        return CheckResult(NAME, ERROR, f"Shared data path {path} is not a directory.",
                           hint="name the dataset directory with --data-path", data=data)
    mount_point, fstype = mount_of(path)
    data.update({"mount_point": mount_point, "fs_type": fstype, "readable": False, "writable": False,
                 "uid": os.geteuid(), "owner_uid": st.st_uid, "mode": oct(st.st_mode & 0o7777)})
    try:
        os.listdir(path)
        data["readable"] = True
    except OSError as exc:
        return CheckResult(NAME, ERROR, f"Shared data path {path} exists but this user (uid {os.geteuid()}) "
                           f"cannot read it: {exc.strerror}.",
                           hint="check the mount's permissions and uid mapping (ranks run as this user)",
                           data=data)
    try:
        probe_file = os.path.join(path, f".fdl-probe-{os.getpid()}-{time.monotonic_ns()}")
        os.close(os.open(probe_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe_file)
        data["writable"] = True
    except OSError as exc:
        if exc.errno == errno.EROFS:
            message = (f"Shared data path {path} is on a read-only file system ({mount_point}); ranks cannot "
                       f"write there.")
            hint = f"remount {mount_point} read-write, or point --data-path at a writable location"
        else:
            message = (f"Shared data path {path} is readable but this user (uid {os.geteuid()}) cannot write "
                       f"there: {exc.strerror}.")
            hint = "give the ranks' user write access (ownership or mode), or fix the mount's uid mapping"
        return CheckResult(NAME, ERROR, message, hint=hint, data=data)
    where = f"{fstype} mount {mount_point}" if fstype else f"mount {mount_point}"
    if mount_point == "/":
        data["mounted"] = False
        return CheckResult(NAME, WARNING, f"Shared data path {path} is readable and writable but is not a mount: "
                           f"it lives on the root file system, so other hosts do not see it.",
                           hint=f"fine on a single host; for a cluster mount shared storage there; {SKIP_HINT}",
                           data=data)
    data["mounted"] = True
    return CheckResult(NAME, OK, f"Shared data path {path} is readable and writable ({where}).", data=data)
