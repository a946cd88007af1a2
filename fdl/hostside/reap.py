"""Stop what a canceled fdl run left on a host: the host-side half of the fdl_reap role.

fdl's playbooks export FDL_RUN_ID to everything they start (a play-level `environment:`), and the launcher's
rank sessions carry it too, so after a cancel the run's processes on a host are the ones whose environment
holds it, with their descendants. The flodl.fdl.fdl_reap module calls `reap()`; the finding and the stopping
are the process sweep of supervisor.py, the one every caller in fdl uses.
"""

from typing import List

from .envvars import FDL_RUN_ID
from .supervisor import end_processes, processes_with_env


def reap(run_id: str, grace_s: float, check_mode: bool = False) -> List[int]:
    """The processes of run `run_id` on this host, stopped (SIGTERM, SIGKILL after grace_s) unless check_mode.

    ValueError when `run_id` is not the hex id of an fdl run (it becomes part of what is matched)."""
    if not run_id or not all(c in "0123456789abcdef" for c in run_id):
        raise ValueError(f"run_id must be the hex id of an fdl run, got {run_id!r}")
    pids = processes_with_env(FDL_RUN_ID, run_id)
    if pids and not check_mode:
        end_processes(pids, grace_s)
    return pids
