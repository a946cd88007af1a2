"""fdl's signal policy, in one place: what SIGINT/SIGTERM/SIGHUP do while a command runs.

Two policies, both installed only for the duration of a `with` block and
restored on the way out (and only from the main thread, the one Python
delivers signals to):

- `Interrupts(cancel)`: a run that can stop gracefully (an Ansible run, a
  launch). SIGINT/SIGTERM set `cancel`; the run notices, stops and cleans up.
  A second Ctrl-C raises KeyboardInterrupt: stop waiting for the clean-up.
- `stop_on(exc)`: a long-lived process that tears itself down (`fdl join`).
  The first signal raises `exc(signum)` at the point the program was, and
  puts every watched signal back to its default action, so a second one
  ends the process at once. `die_of(signum)` then ends the process by the
  same signal once the teardown is done, so whoever started it sees the
  signal (a shell reads 128+N; systemd counts a SIGTERM death as a clean stop).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

GRACEFUL = (signal.SIGINT, signal.SIGTERM)
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

Handler = Callable[[int, FrameType | None], Any]


@contextmanager
def handling(signals: tuple[int, ...], handler: Handler) -> Iterator[None]:
    """Install handler for signals for the duration of the block (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


class Interrupts:
    """While active, SIGINT/SIGTERM set `cancel` instead of raising; a second Ctrl-C raises KeyboardInterrupt.

    `signal` holds the first signal received (None when there was none), so
    the caller can re-raise KeyboardInterrupt after its clean-up.
    """

    def __init__(self, cancel: threading.Event):
        self.cancel = cancel
        self.signal: int | None = None
        self._block = handling(GRACEFUL, self._handle)

    def __enter__(self) -> Interrupts:
        self._block.__enter__()
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is not None and signum == signal.SIGINT:  # a second Ctrl-C: stop waiting for the sweep
            raise KeyboardInterrupt
        self.signal = signum
        self.cancel.set()

    def __exit__(self, *exc: object) -> None:
        self._block.__exit__(None, None, None)


@contextmanager
def stop_on(exc: Callable[[int], BaseException], signals: tuple[int, ...] = STOPPING) -> Iterator[None]:
    """The first of signals raises exc(signum) and restores their default actions; restored on exit either way."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        for sig in signals:
            signal.signal(sig, signal.SIG_DFL)
        raise exc(signum)

    with handling(signals, handler):
        yield


def die_of(signum: int) -> None:
    """End this process by signum with its default action (returns only when the signal is blocked)."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
