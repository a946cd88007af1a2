"""The world's supervision: heartbeats for the launcher's own hosts, waiting for the world to form, and watching
the rank sessions until every host ended (stopping the others on the first failure)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fdl.controller.states import FAILED, FORMING, TERMINAL, TRAINING, Refused
from fdl.launch.dispatch import GRACE_S, HostOutcome, Session
from fdl.launch.notes import RunNotes
from fdl.launch.printer import Printer
from fdl.signals import Interrupts

if TYPE_CHECKING:
    from fdl.controller.server import ControllerServer

__all__ = ["BEAT_S", "Beats", "Watch", "wait_world"]

BEAT_S = 1.0


class Beats:
    """Heartbeats for the launcher's hosts, so the controller's liveness rules see them alive: their tickets,
    which of them run ranks, and the thread that beats for them."""

    def __init__(self) -> None:
        self.tickets: dict[str, str] = {}
        self.running: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, server: ControllerServer) -> None:
        self._thread = threading.Thread(target=self._loop, args=(server,), name="fdl-launch-beats", daemon=True)
        self._thread.start()

    def _loop(self, server: ControllerServer) -> None:
        while not self._stop.wait(BEAT_S):
            for name, ticket in list(self.tickets.items()):
                try:
                    server.call(lambda m, t=ticket, r=name in self.running: m.heartbeat(t, running=r))
                except (Refused, RuntimeError, TimeoutError):
                    pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def wait_world(server: ControllerServer, signals: Interrupts, notes: RunNotes, started: float) -> bool:
    """Until the world forms or the run fails; False when interrupted."""
    noted = False
    while not server.wait_phase(FORMING, TRAINING, *TERMINAL, timeout=0.2):
        if signals.cancel.is_set():
            return False
        if not noted and time.monotonic() - started > 2:
            noted = True
            notes.waiting(server.state())
    return True


class Watch:
    """The supervision loop and its state: which hosts ended how, the first failure, and the stop in progress."""

    def __init__(self, server: ControllerServer, beats: Beats, printer: Printer, fail: Callable[[str], None],
                 sessions: list[Session]):
        self.server = server
        self.beats = beats
        self.printer = printer
        self.fail = fail
        self.sessions = sessions
        self.outcomes: dict[str, HostOutcome] = {}
        self.first: HostOutcome | None = None
        self.stopping_since: float | None = None
        self.killed = False
        self.ended = threading.Event()
        self.interrupted = False

    @property
    def finished(self) -> bool:
        return len(self.outcomes) == len(self.sessions) and self.server.machine.phase in TERMINAL

    def run(self) -> None:
        """Start the sessions and watch them until every host ended; Ctrl-C stops them (twice: no more grace)."""
        cancel = threading.Event()
        with Interrupts(cancel) as interrupts:
            self.start()
            while not self.finished:
                try:
                    self.ended.clear()
                    if cancel.is_set():
                        self.interrupt(interrupts.signal)
                    self.step()
                    self.ended.wait(0.1)  # a session's end wakes this at once; the timeout catches the rest
                except KeyboardInterrupt:  # a second Ctrl-C: no more grace for the ranks
                    self.hurry()

    def start(self) -> None:
        beats = self.beats
        for session in self.sessions:
            session.ended = self.ended
            session.start()
            beats.running.add(session.host)
        self.printer.note(f"ranks started on {len(self.sessions)} host(s)")
        for name in list(beats.running):  # the world is up as far as the launcher's hosts go
            self.server.call(lambda m, t=beats.tickets[name]: m.heartbeat(t, running=True))

    def interrupt(self, signum: int | None) -> None:
        if not self.interrupted:
            self.interrupted = True
            self.fail("interrupted: the launcher got " + ("SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"))

    def hurry(self) -> None:
        self.interrupted = True
        self.stopping_since = self.stopping_since or time.monotonic()
        self._kill()

    def _kill(self) -> None:
        self.killed = True
        for session in self.sessions:
            if session.host not in self.outcomes:
                session.kill()

    def step(self) -> None:
        """Collect ended hosts (exit reports), and once the run failed stop every host still running."""
        beats, server = self.beats, self.server
        for session in self.sessions:
            if session.host in self.outcomes or not session.done:
                continue
            outcome = session.outcome()
            self.outcomes[session.host] = outcome
            beats.running.discard(session.host)
            if outcome.code != 0 and self.first is None and server.machine.phase not in TERMINAL:
                self.first = outcome
            try:
                server.call(lambda m, o=outcome: m.report_exit(beats.tickets[o.host], o.code, o.detail))
            except Refused:
                pass
        if server.machine.phase == FAILED and self.stopping_since is None:
            self.stopping_since = time.monotonic()
            still = [s for s in self.sessions if s.host not in self.outcomes]
            if still:
                self.printer.note(f"the run failed ({server.machine.reason}); stopping the ranks on "
                                  f"{', '.join(s.host for s in still)}")
            for session in still:
                session.stop()
        if self.stopping_since is not None and not self.killed \
                and time.monotonic() - self.stopping_since > GRACE_S + 10:
            self._kill()
