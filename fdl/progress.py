"""Live progress on a terminal, in one place (rich, on stderr; shown only where the caller says so).

- `HostsProgress`: one row per host of a fan-out (pending, running the task
  named, ok, failed with why), and a title with the hosts done and the time
  taken; the Ansible driver feeds it the hosts' states.
- `StatusLine`: permanent lines that scroll (`line()`), and one line under
  them that rewrites itself (`status()`), e.g. "still building: 2m05s".

Both re-render on a timer of their own, so clocks tick between updates, and
both leave the terminal as they found it when stopped (transient).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TextIO

REFRESH_PER_SECOND = 8


class HostState(Protocol):
    status: str
    current_task: str | None
    message: str | None


_STYLE = {"pending": "dim", "running": "cyan", "ok": "green", "failed": "red", "unreachable": "red",
          "skipped": "yellow", "missing": "red"}
_WAITING = ("pending", "running")


class HostsProgress:
    """Per-host progress of one run: `start()`, `update(states)` as often as states change, `stop()`."""

    def __init__(self, title: str, hosts: Sequence[str], stream: TextIO | None = None):
        self.title = title
        self.hosts = list(hosts)
        self.stream = stream
        self._live: Any = None
        self._start = time.monotonic()
        self._state: Mapping[str, HostState] = {}

    def start(self) -> None:
        from rich.console import Console
        from rich.live import Live

        # Live re-renders this object (its __rich__) on every refresh, so the clock ticks between events.
        self._live = Live(self, console=Console(file=self.stream or sys.stderr),
                          refresh_per_second=REFRESH_PER_SECOND, transient=True)
        self._live.start()

    def update(self, states: Mapping[str, HostState]) -> None:
        self._state = states

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def __rich__(self) -> Any:
        from rich.table import Table

        state = dict(self._state)  # a C-level copy: the event handler may add hosts while this renders
        done = sum(1 for h in state.values() if h.status not in _WAITING)
        table = Table(title=f"{self.title}: {done}/{len(self.hosts)} hosts done, "
                            f"{time.monotonic() - self._start:.1f}s", title_justify="left", box=None)
        table.add_column("host")
        table.add_column("state")
        table.add_column("task")
        for name in self.hosts:
            host = state.get(name)
            status = host.status if host is not None else "pending"
            task = (host.current_task or (host.message or "")[:60]) if host is not None else ""
            table.add_row(name, f"[{_STYLE.get(status, '')}]{status}[/]", task)
        return table


class StatusLine:
    """Lines that scroll, and one status line below them that rewrites itself (a terminal only)."""

    def __init__(self, stream: TextIO | None = None):
        from rich.console import Console

        self._console = Console(file=stream or sys.stderr, highlight=False)
        self._live: Any = None

    def line(self, text: str) -> None:
        """A permanent line, printed above the status line."""
        self._console.print(text, markup=False)

    def status(self, text: str) -> None:
        """Show text as the status line (replacing the previous one)."""
        from rich.live import Live
        from rich.text import Text

        if self._live is None:
            self._live = Live(Text(text), console=self._console, refresh_per_second=REFRESH_PER_SECOND,
                              transient=True)
            self._live.start()
        else:
            self._live.update(Text(text))

    def clear(self) -> None:
        """Remove the status line (the permanent lines stay)."""
        if self._live is not None:
            self._live.stop()
            self._live = None
