"""A playbook run's per-host results, read live from ansible-runner's events.

Every runner event goes through `Collector` (from ansible-runner's loop: it stays fast), which keeps one
`HostResult` per host: pending, running, then ok, failed, unreachable or skipped, with every task's outcome
and the reason a host failed as Ansible or SSH said it; `missing` is the run's verdict for a host the
playbook never reached (fdl.cluster.runner). Callers that watch a run live get each event as a
`RunnerEvent`; `keep_event` decides which events ansible-runner writes into the run's artifacts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fdl.progress import HostsProgress

OK, FAILED, UNREACHABLE, SKIPPED, PENDING, RUNNING, MISSING = (
    "ok", "failed", "unreachable", "skipped", "pending", "running", "missing")


@dataclass
class TaskOutcome:
    """One task's result on one host; `res` is the module's return (None for skipped tasks)."""

    task: str
    status: str
    res: dict[str, Any] | None = None
    duration: float | None = None


@dataclass
class HostResult:
    """Everything one host did in a run.

    status: pending (nothing yet), running, ok, failed, unreachable, skipped
    (every task skipped) or missing (the playbook never ran on it).
    """

    host: str
    status: str = PENDING
    tasks: list[TaskOutcome] = field(default_factory=list)
    message: str | None = None  # why it failed or was unreachable, as Ansible/SSH said it
    current_task: str | None = None
    started: float | None = None
    finished: float | None = None

    @property
    def res(self) -> dict[str, Any] | None:
        """The last module return this host produced (the playbook's answer for one-task playbooks)."""
        for outcome in reversed(self.tasks):
            if outcome.res is not None:
                return outcome.res
        return None


@dataclass(frozen=True)
class RunnerEvent:
    """A runner event, trimmed to what callers use; `raw` is the full event."""

    kind: str  # runner event name without the prefix: on_start, on_ok, on_failed, ...
    host: str | None
    task: str | None
    res: dict[str, Any] | None
    raw: dict[str, Any] = field(repr=False, default_factory=dict)


class Collector:
    """Turns runner events into HostResults (called live from ansible-runner's loop; keep it fast).

    A run in parts (the direct hosts, and each execution node's: fdl.cluster.nodes) feeds one Collector from a
    thread per part: calls are serialized by `lock`, and `stats` is set once every part's final stats arrived
    (or the part ended without them: `part_done()`).
    """

    def __init__(self, hosts: Sequence[str], on_event: Callable[[RunnerEvent], None] | None,
                 progress: HostsProgress | None):
        self.hosts = {name: HostResult(host=name) for name in hosts}
        self.on_event = on_event
        self.progress = progress
        self.errors: list[str] = []
        self.stats = threading.Event()  # the play's final stats arrived: every host's result is in
        self.lock = threading.RLock()
        self.parts = 1  # how many playbook runs feed this collector
        self._parts_done = 0

    def part_done(self) -> None:
        """One part of the run is over (its final stats arrived, or it ended without them)."""
        with self.lock:
            self._parts_done += 1
            if self._parts_done >= self.parts:
                self.stats.set()

    def _host(self, name: str) -> HostResult:
        if name not in self.hosts:  # a host the play added (add_host, delegate_to): track it too
            self.hosts[name] = HostResult(host=name)
        return self.hosts[name]

    def __call__(self, event: dict[str, Any]) -> bool:
        with self.lock:
            return self._take(event)

    def _take(self, event: dict[str, Any]) -> bool:
        name = event.get("event", "")
        data = event.get("event_data") or {}
        host_name = data.get("host")
        task = data.get("task")
        res = data.get("res") if isinstance(data.get("res"), dict) else None
        if name.startswith("runner_") and host_name:
            host = self._host(host_name)
            kind = name[len("runner_"):]
            if kind == "on_start":
                host.status = RUNNING if host.status == PENDING else host.status
                host.current_task = task
                host.started = host.started or time.monotonic()
            elif kind in ("on_ok", "on_failed", "on_unreachable", "on_skipped"):
                status = {"on_ok": OK, "on_failed": FAILED, "on_unreachable": UNREACHABLE,
                          "on_skipped": SKIPPED}[kind]
                if kind == "on_failed" and data.get("ignore_errors"):
                    status = OK
                host.tasks.append(TaskOutcome(task=task or "", status=status, res=res,
                                              duration=data.get("duration")))
                host.finished = time.monotonic()
                if status in (FAILED, UNREACHABLE):
                    host.status = status
                    host.message = _reason(res)
                elif host.status in (PENDING, RUNNING, SKIPPED):
                    host.status = OK if status == OK else SKIPPED
                host.current_task = None
        elif name == "error" or (name == "verbose" and "ERROR!" in (event.get("stdout") or "")):
            self.errors.append(event.get("stdout") or "")
        elif name == "playbook_on_stats":
            self.part_done()
        if self.progress is not None:
            self.progress.update(self.hosts)
        if self.on_event is not None:
            kind = name[len("runner_"):] if name.startswith("runner_") else name
            self.on_event(RunnerEvent(kind=kind, host=host_name, task=task, res=res, raw=event))
        return keep_event(event)


def _reason(res: dict[str, Any] | None) -> str | None:
    if not res:
        return None
    message = res.get("msg")
    if isinstance(message, str) and message.strip():
        return message.strip()
    for key in ("stderr", "module_stderr", "exception"):
        if isinstance(res.get(key), str) and res[key].strip():
            return str(res[key]).strip().splitlines()[-1]
    return None


def keep_event(event: dict[str, Any]) -> bool:
    """Whether ansible-runner writes the event into the artifacts: only the play-level ones (a handful per run,
    whatever the host count: enough to see where a run's time went). Per-host events are read live, and
    writing each as a file cost the controller CPU on every host."""
    return str(event.get("event", "")).startswith("playbook_on_")
