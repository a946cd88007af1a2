"""How a launcher run speaks: every rank's lines to stdout, the launcher's own notes to stderr.

The launcher (run.py), its rank sessions (dispatch.py) and the all-reduce smoke test (fdl.collective, which
hands in its own streams to read the rank lines) all write through one Printer.
"""

from __future__ import annotations

import sys
import threading
from typing import Protocol


class TextSink(Protocol):
    """Where a Printer writes: a text stream, or anything with its write and flush."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class Printer:
    """Rank lines to stdout, launcher notes to stderr; one lock, so lines never interleave."""

    def __init__(self, out: TextSink | None = None, err: TextSink | None = None):
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        with self._lock:
            try:
                self.out.write(text.rstrip("\n") + "\n")
                self.out.flush()
            except (BrokenPipeError, ValueError):
                pass

    def note(self, text: str) -> None:
        from fdl.controller.view import printable

        text = printable(text)  # host names and details from walk-ins are data, never terminal controls
        with self._lock:
            try:
                self.err.write(f"fdl: launch: {text}\n")
                self.err.flush()
            except (BrokenPipeError, ValueError):
                pass
