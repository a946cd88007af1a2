"""The run's sessions on its hosts: staging on the remote ones, one rank session per host, and the sweep of
whatever of the run is left on them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fdl.errors import FdlError
from fdl.hostside.envvars import FDL_RUN_ID
from fdl.launch.build import BuildJob
from fdl.launch.dispatch import LocalSession, RemoteSession, Session, stage_remote
from fdl.launch.plan import LaunchPlan
from fdl.launch.printer import Printer

if TYPE_CHECKING:
    from fdl.cluster.inventory import ClusterInventory

__all__ = ["SWEEP_TIMEOUT_S", "HostSessions", "open_files_for"]

SWEEP_TIMEOUT_S = 60.0


class HostSessions:
    """Opens one rank session per host of the plan (staging the remote ones first) and sweeps the remote hosts."""

    def __init__(self, plan: LaunchPlan, printer: Printer, *, progress: bool | None = None):
        self.plan = plan
        self.printer = printer
        self.progress = progress
        self.inventory: ClusterInventory | None = None

    def open(self, jobs: dict[str, BuildJob], specs: dict[str, list[dict[str, Any]]], log_root: Path) -> list[Session]:
        plan = self.plan
        sessions: list[Session] = []
        staged: dict[str, dict[str, Any]] = {}
        inventory = None
        if plan.remote:
            from fdl.cluster.inventory import build_inventory

            assert plan.cluster is not None
            inventory = build_inventory(plan.cluster, plan.root)
            problem = open_files_for(len(plan.remote))
            if problem:
                self.printer.note(problem)
            self.printer.note(f"staging on {len(plan.remote)} remote host(s): binary (rsync), rank supervisor, "
                              f"rank spec")
            staged = stage_remote(plan, inventory, jobs, specs, progress=self.progress)
        self.inventory = inventory
        for host in plan.hosts:
            if host.local:
                job = jobs[host.name]
                argv = plan.rank_argv(None if job.artifact is None else str(job.artifact))
                sessions.append(LocalSession(host, argv, specs[host.name], plan.root, log_root, self.printer))
            else:
                from fdl.cluster.ssh import ssh_argv

                assert inventory is not None
                sessions.append(RemoteSession(host, ssh_argv(inventory.hosts[host.name]), staged[host.name],
                                              self.printer, plan.run_id))
        return sessions

    def remote_names(self) -> set[str]:
        return {h.name for h in self.plan.remote}

    def sweep(self) -> None:
        """Stop anything of this run left on the remote hosts (roles/fdl_reap finds it by FDL_RUN_ID)."""
        remote = sorted(self.remote_names())
        inventory = self.inventory
        if not remote or inventory is None:
            return
        from fdl.cluster.runner import run_playbook

        self.printer.note(f"sweeping {len(remote)} host(s) for processes of run {self.plan.run_id}")
        try:
            run_playbook("reap.yml", inventory, extravars={"fdl_reap_run_id": self.plan.run_id},
                         limit=remote, progress=False, timeout=SWEEP_TIMEOUT_S, title="sweep")
        except (FdlError, KeyboardInterrupt) as exc:
            self.printer.note(f"the sweep did not finish ({exc}); check the hosts for processes with "
                              f"{FDL_RUN_ID}={self.plan.run_id}")


def open_files_for(hosts: int) -> str | None:
    """Raise this process's soft limit on open files to what `hosts` remote sessions need (three pipes each, and
    the staging's while it runs), up to the hard limit; a note when even the hard limit is short. The usual soft
    limit of 1,024 ends at about 300 hosts."""
    import resource

    needed = 256 + 8 * hosts
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        target = soft
    if target < needed:
        return (f"this process may open {target} files and {hosts} remote hosts need about {needed}; raise the "
                f"hard limit (ulimit -Hn) if sessions fail to start")
    return None
