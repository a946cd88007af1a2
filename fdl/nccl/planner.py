"""Gather a BuildPlan's inputs: flags first, then detection (NVML, libtorch, the fleet)."""

from __future__ import annotations

import re
from pathlib import Path

from fdl.config.schema import ClusterSpec
from fdl.hostside.paths import FLODL_IN_HOME
from fdl.nccl import fleet
from fdl.nccl.build import find_worker, this_host_name
from fdl.nccl.detect import choose_archs, choose_tag
from fdl.nccl.plan import DEFAULT_BASE_IMAGE, DEFAULT_JOBS, BuildPlan, PlanError, parse_jobs

REMOTE_ROOT = FLODL_IN_HOME  # holds libtorch/, where `fdl join --libtorch` keeps a worker's libtorch variants
_IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")


def make_plan(*, project_root: Path | None, cluster: ClusterSpec | None, tag: str | None = None,
              archs: str | None = None, jobs: int = DEFAULT_JOBS, host: str | None = None,
              root: str | None = None, base_image: str = DEFAULT_BASE_IMAGE) -> BuildPlan:
    """The plan for building here (host=None) or on the cluster worker `host`."""
    jobs = parse_jobs(jobs)
    if not _IMAGE_RE.match(base_image):
        raise PlanError(f"--base-image {base_image!r} is not a Docker image reference "
                        f"(e.g. {DEFAULT_BASE_IMAGE}).")
    local_root = (project_root or Path.cwd()).resolve()
    notes: list[str] = []

    worker = None
    if host is not None:
        if cluster is None or not cluster.workers:
            raise PlanError(f"--host {host} builds on a cluster worker, but no cluster is configured here. "
                            f"Select the cluster env (fdl @cluster nccl build --host {host}) or drop --host "
                            f"to build on this machine.")
        worker = find_worker(cluster, host)

    fleet_versions = None
    if tag is None and cluster is not None and cluster.workers:
        me = host if host is not None else this_host_name(cluster)
        fleet_versions = fleet.fleet_nccl_versions(cluster, exclude=me)
        if fleet_versions is None:
            notes.append("the cluster hosts' NCCL versions are not collected by this fdl yet; the target "
                         "version comes from this project's libtorch (use --tag to name it)")
    nccl, tag_source = choose_tag(tag, root=local_root, fleet=fleet_versions)

    if worker is not None:
        def detect() -> list[tuple[int, int]]:
            found = fleet.worker_capabilities(worker)
            if found is None:
                raise PlanError(
                    f"fdl cannot read the GPUs of {worker.host} from here yet, so it cannot pick the archs to "
                    f"build for. Pass them with --archs, e.g. --archs \"6.1\" (on {worker.host}, "
                    f"nvidia-smi --query-gpu=compute_cap --format=csv,noheader prints them)."
                )
            return found

        arch_list, archs_source = choose_archs(archs, detect=detect, where=worker.host)
    else:
        arch_list, archs_source = choose_archs(archs)

    if worker is not None:
        build_root = root or REMOTE_ROOT
        if not (build_root.startswith("/") or build_root == "~" or build_root.startswith("~/")):
            raise PlanError(f"--root {build_root!r}: on a worker the root must be an absolute path or start "
                            f"with ~/ (default {REMOTE_ROOT}).")
        build_root = build_root.rstrip("/") or "/"
    else:
        build_root = str(Path(root).expanduser().resolve()) if root else str(local_root)

    return BuildPlan(nccl=nccl, archs=arch_list, root=build_root,
                     host=worker.host if worker else "localhost", remote=worker is not None, jobs=jobs,
                     base_image=base_image, tag_source=tag_source, archs_source=archs_source,
                     notes=tuple(notes))
