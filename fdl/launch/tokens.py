"""A run's own join token: made when none is configured, kept 0600 beside the run, removed when the run ends, and
the leftovers of launchers that are gone swept at the next start."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from fdl.controller import live
from fdl.hostside.paths import launch_runs
from fdl.launch.printer import Printer

__all__ = ["TOKEN_OWNER", "RunToken", "forget_token", "sweep_tokens"]

#: beside a run's token file: the pid of the launcher that made it (the token goes when that process is gone)
TOKEN_OWNER = "token.pid"
#: a token without an owner record (an fdl from before it) younger than this may belong to a launcher that has not
#: written its live record yet: it stays
UNOWNED_GRACE_S = 300


class RunToken:
    """The token one run made for itself (none until `mint`): where it lies, how it is shown, and its removal."""

    def __init__(self, run_id: str, printer: Printer):
        self.run_id = run_id
        self.printer = printer
        self.path: Path | None = None  # the token this run made, removed when it ends
        self.shown: str | None = None  # the made token's file, as shown (~/...), when the run made one

    def mint(self, *, discovery: bool) -> str:
        """A random token for this run alone, kept 0600 in the run's directory while the run lives (never printed,
        never on a command line; removed when the run ends): this user's `fdl status`/`fdl start` find it there,
        walk-ins read it from there; the launcher's own hosts need none (they are admitted in-process)."""
        import secrets

        from fdl.hostside.fsio import atomic_write

        token = secrets.token_hex(32)
        path = live.token_path(self.run_id)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path.parent, 0o700)
        atomic_write(path.parent / TOKEN_OWNER, f"{os.getpid()}\n".encode(), mode=0o600)  # before the token
        atomic_write(path, (token + "\n").encode(), mode=0o600)
        self.path = path
        shown = f"~/{path.relative_to(Path.home())}" if path.is_relative_to(Path.home()) else str(path)
        self.shown = shown
        self.printer.note(f"no join token is configured, so this run made its own (0600, in {shown}): this "
                          f"account's fdl status and fdl start find it"
                          + ("; walk-ins read it from there (the line below)" if discovery else ""))
        return token

    def forget(self) -> None:
        """Remove the token this run made (if it made one)."""
        forget_token(self.path)


def forget_token(path: Path | None) -> None:
    """Remove a run's token file (and its owner record) once the run is over: the token admits nobody any more,
    and ranks of this account should not find earlier runs' tokens lying about."""
    if path is None:
        return
    for leftover in (path, path.parent / TOKEN_OWNER):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()


def _launcher_alive(run_dir: Path, live_ids: set[str]) -> bool:
    """Whether the launcher that made the token in run_dir may still run: the pid recorded beside the token is
    alive; or, with no such record (an fdl from before it), a live run names this run or the token is recent."""
    try:
        pid = int((run_dir / TOKEN_OWNER).read_text().strip())
    except FileNotFoundError:
        try:
            recent = time.time() - (run_dir / "token").stat().st_mtime < UNOWNED_GRACE_S
        except OSError:
            recent = False
        return run_dir.name in live_ids or recent
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except OSError:  # no such process, or another account's: not the launcher that made it
        return False
    return True


def sweep_tokens() -> int:
    """Remove the token files of this user's earlier runs whose launcher is gone (killed, crashed, or from an
    fdl that kept them); returns how many went. A running launcher's token stays."""
    count = 0
    try:
        runs = list(launch_runs().iterdir())
    except OSError:
        return 0
    live_ids = {run.run_id for run in live.live_runs()}
    for run_dir in runs:
        token = run_dir / "token"
        if not token.is_file() or _launcher_alive(run_dir, live_ids):
            continue
        forget_token(token)
        count += 1
    return count
