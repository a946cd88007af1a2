"""Gather a BuildPlan's inputs: flags first, then detection (NVML, libtorch, the cluster probe's reports)."""

from __future__ import annotations

import re
from pathlib import Path

from fdl.config.schema import ClusterSpec, WorkerSpec
from fdl.hostside.paths import FLODL_IN_HOME
from fdl.nccl.build import find_worker, this_host_name
from fdl.nccl.detect import choose_archs, choose_tag, choose_target
from fdl.nccl.fleet import Fleet
from fdl.nccl.plan import DEFAULT_BASE_IMAGE, DEFAULT_JOBS, BuildPlan, PlanError, parse_jobs

REMOTE_ROOT = FLODL_IN_HOME  # holds libtorch/, where `fdl join --libtorch` keeps a worker's libtorch variants
_IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")


def needs_fleet(cluster: ClusterSpec | None, *, tag: str | None, host: str | None, archs: str | None) -> bool:
    """Whether the plan needs the cluster's own reports (one cluster probe): under a cluster env without --tag
    (the version and the host to build for come from them), or for --host without --archs (its GPUs)."""
    if cluster is None or not cluster.workers:
        return False
    return tag is None or (host is not None and archs is None)


def named_worker(cluster: ClusterSpec | None, host: str | None) -> WorkerSpec | None:
    """The worker --host names (None without --host); refused without a cluster, or naming no worker."""
    if host is None:
        return None
    if cluster is None or not cluster.workers:
        raise PlanError(f"--host {host} builds on a cluster worker, but no cluster is configured here. "
                        f"Select the cluster env (fdl @cluster nccl build --host {host}) or drop --host "
                        f"to build on this machine.")
    return find_worker(cluster, host)


def make_plan(*, project_root: Path | None, cluster: ClusterSpec | None, tag: str | None = None,
              archs: str | None = None, jobs: int = DEFAULT_JOBS, host: str | None = None,
              root: str | None = None, base_image: str = DEFAULT_BASE_IMAGE,
              fleet: Fleet | None = None) -> BuildPlan:
    """The plan for building here (host=None) or on the cluster worker `host`.

    `fleet` is what the cluster probe reported (fdl.nccl.fleet.collect; needs_fleet() says when it is
    wanted): without --tag the cluster's newest NCCL is built for the host with the older one (seed 000's rig
    flow), which becomes the build host when --host does not name one; a worker's GPUs come from it too.
    """
    jobs = parse_jobs(jobs)
    if not _IMAGE_RE.match(base_image):
        raise PlanError(f"--base-image {base_image!r} is not a Docker image reference "
                        f"(e.g. {DEFAULT_BASE_IMAGE}).")
    local_root = (project_root or Path.cwd()).resolve()
    notes: list[str] = []

    worker = named_worker(cluster, host)

    if tag is None and fleet is not None and fleet.versions:
        me = this_host_name(cluster)
        target = choose_target(fleet.versions, host=host, me=me)
        nccl, tag_source = target.version, target.source
        notes += target.notes
        if target.host is not None and target.host != me:
            worker = find_worker(cluster, target.host)
    else:
        if tag is None and fleet is not None:
            notes.append("no cluster host reported an NCCL version, so the version comes from this project's "
                         "libtorch (use --tag to name it)")
        try:
            nccl, tag_source = choose_tag(tag, root=local_root)
        except PlanError as exc:
            if tag is not None or fleet is None:
                raise
            why = "; ".join(f"{name}: {reason.rstrip('.')}" for name, reason in fleet.unreported.items())
            raise PlanError(f"{exc.message} No cluster host reports one either ({why}).", hint=exc.hint) from None
    if fleet is not None and fleet.unreported and tag is None:
        notes.append("not compared (no NCCL version reported): "
                     + "; ".join(f"{name}: {why.rstrip('.')}" for name, why in fleet.unreported.items()))

    if worker is not None:
        chosen = worker

        def detect() -> list[tuple[int, int]]:
            found = fleet.capabilities.get(chosen.host) if fleet is not None else None
            if not found:
                why = fleet.unreported.get(chosen.host) if fleet is not None else None
                raise PlanError(
                    f"fdl cannot tell the GPU architectures of {chosen.host}: its probe reported no GPU"
                    + (f" ({why.rstrip('.')})" if why else "") + ". Pass them with --archs, e.g. --archs \"6.1\" "
                    f"(on {chosen.host}, nvidia-smi --query-gpu=compute_cap --format=csv,noheader prints them).")
            return found

        arch_list, archs_source = choose_archs(archs, detect=detect, where=worker.host)
        if archs is None:
            archs_source = archs_source.replace("through NVML", "by the cluster probe (NVML there)")
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
