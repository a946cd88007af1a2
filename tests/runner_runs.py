"""What fdl's ansible-runner driver ran under a test's cache: one record per ansible-playbook run.

fdl.cluster.runner keeps each run's play-level events in its artifacts
(`<XDG_CACHE_HOME>/fdl/runner/<inventory>/artifacts/<run>/job_events/`): the
playbook, every task's resolved action and the final per-host stats. Tests read
them to prove that a command ran a playbook (not how long it took).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class PlaybookRun:
    """One ansible-playbook run: its playbook's file name, the actions its tasks resolved to, its stats."""

    artifact_dir: Path
    playbook: str
    actions: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)

    def hosts(self, counter: str = "ok") -> dict[str, int]:
        """Per-host counts of one stats counter (ok, changed, skipped, failures, dark)."""
        return dict(self.stats.get(counter) or {})


def playbook_runs(cache_home: Path | str) -> list[PlaybookRun]:
    """Every run the artifacts under this XDG_CACHE_HOME still hold, oldest first."""
    found = []
    for artifact in sorted(Path(cache_home).glob("fdl/runner/*/artifacts/*"), key=lambda p: p.stat().st_mtime):
        events = []
        for path in (artifact / "job_events").glob("*.json"):
            event = json.loads(path.read_text())
            events.append((int(event.get("counter") or 0), event))
        events.sort(key=lambda pair: pair[0])
        playbook = next((e["event_data"].get("playbook", "") for _, e in events if e["event"] == "playbook_on_start"),
                        "")
        try:
            command = json.loads((artifact / "command").read_text()).get("command", [])
        except (OSError, ValueError):
            command = []
        found.append(PlaybookRun(
            artifact_dir=artifact, playbook=Path(playbook).name, command=command,
            actions=[e["event_data"].get("resolved_action", "") for _, e in events
                     if e["event"] == "playbook_on_task_start"],
            stats=next((e["event_data"] for _, e in events if e["event"] == "playbook_on_stats"), {})))
    return found


def runs_of(cache_home: Path | str, playbook: str) -> list[PlaybookRun]:
    """The runs of one playbook (by file name, e.g. dispatch.yml), oldest first."""
    return [run for run in playbook_runs(cache_home) if run.playbook == playbook]
