"""Where a live launcher run can be found: one small record per running launcher.

A launcher writes `<state dir>/live-<pid>.json` (mode 0600: temp file, fsync,
rename) once its controller listens, and removes it when it exits. `fdl
status` and `fdl start` with no `--addr` read these records, so a run whose
controller had to move off its configured port is still found without flags.
A record whose launcher process is gone (killed, crashed) is stale: ignored,
and removed when it is seen.

The state dir is `$XDG_RUNTIME_DIR/fdl` when that directory is private (the
per-login runtime directory, cleared at logout), else `~/.flodl/launch/live`
(fdl.hostside.paths names both).
A record holds only the address, the configured address it stands in for,
the run id and the launcher's pid: nothing secret. The run's token (the
configured one, or one the launcher made for the run) is in its own file,
`~/.flodl/launch/runs/<run id>/token`, mode 0600: `run_token` reads it for
this user's own commands, and only when no other account could have written
or read it.

It sits with the controller's client side, beside its reader (address.py: where
status and start look); the launcher (fdl.launch.run) writes the records.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fdl.hostside.fsio import atomic_write
from fdl.hostside.paths import launch_live, launch_runs

MAX_RECORD_BYTES = 4096


@dataclass(frozen=True)
class LiveRun:
    """A launcher that is running now."""

    address: str  # where its controller listens, host:port
    configured: str  # the address the configuration gave (differs when the run moved off a taken port)
    run_id: str
    pid: int
    started: float


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    return launch_live(environ)


def write_record(address: str, configured: str, run_id: str, environ: Mapping[str, str] | None = None) -> Path:
    """Record this process's live run; returns the record's path (remove it with remove_record)."""
    directory = state_dir(environ)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"live-{os.getpid()}.json"
    body = json.dumps({"address": address, "configured": configured, "run_id": run_id, "pid": os.getpid(),
                       "started": time.time()}).encode()
    atomic_write(path, body, mode=0o600)
    return path


def remove_record(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process holds that pid: not our launcher
        return False
    return True


def live_runs(environ: Mapping[str, str] | None = None) -> list[LiveRun]:
    """The live runs of this user, newest first; stale records are removed."""
    directory = state_dir(environ)
    try:
        names = [p for p in directory.iterdir() if p.name.startswith("live-") and p.name.endswith(".json")]
    except OSError:
        return []
    runs = []
    for path in names:
        try:
            if path.stat().st_size > MAX_RECORD_BYTES:
                continue
            doc = json.loads(path.read_text())
            run = LiveRun(address=str(doc["address"]), configured=str(doc["configured"]), run_id=str(doc["run_id"]),
                          pid=int(doc["pid"]), started=float(doc["started"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if path.name != f"live-{run.pid}.json" or not _alive(run.pid):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        runs.append(run)
    return sorted(runs, key=lambda r: r.started, reverse=True)


_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def kept_state(run_id: str | None, environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The final state.json a launcher on this machine kept for run_id (~/.flodl/launch/runs/ID/), or None."""
    if not run_id or not _RUN_ID.match(run_id):  # the id came over the wire: never a path
        return None
    path = launch_runs(environ) / run_id / "state.json"
    try:
        if path.stat().st_size > 16 << 20:
            return None
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def run_dir(run_id: str, environ: Mapping[str, str] | None = None) -> Path:
    """This machine's record of a launcher run: its token, local rank logs and final state.json."""
    return launch_runs(environ) / run_id


def token_path(run_id: str, environ: Mapping[str, str] | None = None) -> Path:
    return run_dir(run_id, environ) / "token"


def run_token(run_id: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The token of this user's launcher run run_id, or None: the file must be this user's own regular file
    that no other account can read or write (mode 0600 or stricter), in a directory only this user can
    change (a token someone else could have planted, or could read, is no token of ours)."""
    if not run_id or not _RUN_ID.match(run_id):
        return None
    path = token_path(run_id, environ)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        parent = os.stat(path.parent)
        uid = os.getuid()
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid or info.st_mode & 0o077 or info.st_size > 4096:
            return None
        if parent.st_uid != uid or parent.st_mode & 0o022:
            return None
        text = os.read(fd, 4097).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return text or None
