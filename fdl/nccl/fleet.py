"""What the rest of the cluster runs, for `fdl @cluster nccl build`.

Both facts come from `fdl @cluster probe` (the probe module reports each
host's GPUs and NCCL). That wiring is not in place yet, so these two functions
are the seam: they answer "unknown" today and the planner falls back (the
tag) or asks for the value on the command line (a worker's archs).
"""

from __future__ import annotations

from fdl.config.schema import ClusterSpec, WorkerSpec
from fdl.nccl.detect import HostNccl


def fleet_nccl_versions(cluster: ClusterSpec, *, exclude: str | None) -> list[HostNccl] | None:
    """The NCCL version every cluster host other than `exclude` reports through the probe.

    None while the probe is not wired in; then the tag comes from the project's libtorch.
    """
    del cluster, exclude
    return None


def worker_capabilities(worker: WorkerSpec) -> list[tuple[int, int]] | None:
    """Compute capabilities of a worker's GPUs, as its probe reports them; None while not wired in."""
    del worker
    return None
