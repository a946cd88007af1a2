"""Carry out a BuildPlan through the flodl.fdl.nccl_build playbook (role fdl_nccl).

The plan decides; the role acts on the build host (this one, or a worker
over ssh). The playbook runs through fdl's one Ansible driver
(fdl.cluster.runner) over an inventory from fdl.cluster.inventory; this module
turns the run's events into progress and into errors a person can act on, and
says how to wire the result into fdl.cluster.yml.
"""

from __future__ import annotations

import socket
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from fdl.config.schema import ClusterSpec, WorkerSpec
from fdl.errors import FdlError, RemoteError
from fdl.nccl.plan import BuildPlan
from fdl.progress import StatusLine

if TYPE_CHECKING:  # the dry run never loads the Ansible side
    from fdl.cluster.events import RunnerEvent
    from fdl.cluster.inventory import ClusterInventory

PLAYBOOK = "nccl_build.yml"
_TAIL_LINES = 25


@dataclass
class BuildResult:
    plan: BuildPlan
    library: str  # absolute, on the build host
    replaced: bool
    seconds: float
    snippet_host: str

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "library": self.library, "replaced": self.replaced,
                "seconds": round(self.seconds, 1), "preload": preload_entry(self.snippet_host, self.library)}


def find_worker(cluster: ClusterSpec | None, name: str) -> WorkerSpec:
    workers = cluster.workers if cluster is not None else ()
    for worker in workers:
        if worker.host == name:
            return worker
    known = ", ".join(w.host for w in workers) or "none"
    raise FdlError(f"--host {name}: no worker of that name in the cluster configuration (workers: {known}).",
                   hint="Name a worker's host: from fdl.cluster.yml, or run without --host to build here.")


def this_host_name(cluster: ClusterSpec | None) -> str:
    """This machine's worker name in the cluster file when it has one, else its hostname."""
    names = {socket.gethostname(), socket.getfqdn()}
    for worker in cluster.workers if cluster is not None else ():
        if worker.host in names or worker.address in names:
            return worker.host
    return socket.gethostname()


def preload_entry(host: str, library: str) -> str:
    """The fdl.cluster.yml lines that make a worker's ranks load this library."""
    return (f"workers:\n"
            f"  - host: {host}\n"
            f"    env:\n"
            f"      LD_PRELOAD: {library}\n")


def _action(data: dict[str, Any]) -> str:
    """A task's module without its collection: the role names fdl's own modules short (the clone's library/ or
    the collection's own namespace resolves them) and Ansible's with or without ansible.builtin."""
    return str(data.get("task_action") or "").rsplit(".", 1)[-1]


class Progress:
    """Turns runner events into progress lines (on a terminal) and collects what the role reported."""

    def __init__(self, stream: TextIO, live: bool):
        self.display = StatusLine(stream) if live else None
        self.failures: list[str] = []
        self.installed: dict[str, Any] | None = None
        self.context_ready = False
        self.build_started: float | None = None

    def __call__(self, event: RunnerEvent) -> None:
        kind = event.kind
        data = event.raw.get("event_data") or {}
        if kind == "playbook_on_task_start" and self.display is not None:
            self.display.clear()
            self.display.line(f"  - {data.get('task', '')}")
        elif kind == "on_ok" and (event.res or {}).get("ansible_job_id") and self.build_started is None:
            self.build_started = time.monotonic()  # the image build was started as a job
        elif kind == "retry":  # the role checked on the build job and found it still running
            if self.build_started is None:
                self.build_started = time.monotonic()
            if self.display is not None:
                elapsed = int(time.monotonic() - self.build_started)
                self.display.status(f"    still building: {elapsed // 60}m{elapsed % 60:02d}s elapsed")
        elif kind == "on_ok" and _action(data) == "fdl_nccl_install":
            self.installed = event.res or {}
        elif kind == "on_ok" and _action(data) == "template":
            self.context_ready = True
        elif kind == "on_failed" and not data.get("ignore_errors"):
            self.failures.append(describe_failure(data))
        elif kind == "on_unreachable":
            res = event.res or {}
            self.failures.append(f"cannot reach {event.host} over ssh: {str(res.get('msg', '')).strip()}")

    def close(self) -> None:
        if self.display is not None:
            self.display.clear()


def describe_failure(data: dict[str, Any]) -> str:
    """One failed task, in words: the role's own message, or the command's exit and last output lines."""
    res = data.get("res") or {}
    host = data.get("host", "?")
    if _action(data) in ("fail", "assert"):
        return f"{res.get('msg', 'failed')}"
    msg = str(res.get("msg", "")).strip()
    parts = [f"'{data.get('task', 'a task')}' failed on {host}"]
    if "rc" in res and res.get("cmd"):
        parts.append(f": {' '.join(map(str, res['cmd']))} exited {res['rc']}")
    elif msg:
        parts.append(f": {msg}")
    text = "".join(parts) + "."
    output = "\n".join(filter(None, [str(res.get("stdout", "")).rstrip(), str(res.get("stderr", "")).rstrip()]))
    if output:
        tail = output.splitlines()[-_TAIL_LINES:]
        text += "\nLast lines of its output:\n" + "\n".join(f"  | {line}" for line in tail)
    return text


def run_build(plan: BuildPlan, inventory: ClusterInventory, *, snippet_host: str,
              stream: TextIO | None = None, live: bool = False) -> BuildResult:
    """Run the role for `plan` on the plan's host of `inventory`; raises FdlError with the role's words
    when anything fails.

    `inventory` is the cluster's (fdl.cluster.inventory.build_inventory) for a worker build, or
    fdl.cluster.inventory.local_inventory() for a build on this machine.
    """
    from fdl.cluster.runner import run_playbook  # imports ansible_runner: only a real build pays for it

    progress = Progress(stream or sys.stderr, live)
    started = time.monotonic()
    try:
        outcome = run_playbook(PLAYBOOK, inventory, extravars=plan.role_vars(),
                               limit=[plan.host], on_event=progress, progress=False)
    finally:
        progress.close()
    seconds = time.monotonic() - started
    untouched = f"{plan.output_dir} was left as it was."
    if progress.failures:
        error_class = RemoteError if plan.remote else FdlError
        hint = None
        if progress.context_ready:
            hint = (f"the build context stays in {plan.context_dir} on {plan.host}; `fdl nccl build --dry-run` "
                    f"prints the docker commands to rerun by hand.")
        raise error_class(f"NCCL build on {plan.host} failed: " + "\n".join(progress.failures) + f"\n{untouched}",
                          hint=hint)
    if outcome.status != "successful":
        raise FdlError(f"NCCL build on {plan.host} ended {outcome.status} (ansible-playbook exit {outcome.rc}). "
                       f"{untouched}")
    installed = progress.installed or {}
    library = str(installed.get("library") or plan.library)
    return BuildResult(plan=plan, library=library, replaced=bool(installed.get("replaced")), seconds=seconds,
                       snippet_host=snippet_host)
