"""The pre-flight per-host build: one build per roster host, on this machine, all at once.

Each host builds into its own `CARGO_TARGET_DIR=target/cluster/<host>/<arch>/`
(keyed on the arch too, so changing a host's `arch:` builds afresh instead of
reusing a binary linked against the old libtorch), against the libtorch its
`arch:` names (the publish gate's environment: `LIBTORCH_PATH`, `LIBTORCH`,
`FDL_GPU_FEATURE` from the variant's GPU vendor, `LD_LIBRARY_PATH`). A host
without `arch:` builds against this machine's own libtorch, under
`target/cluster/<host>/native/`.

The recipe is the command's `build:`; without one, `cargo build --release`
when the project is a cargo crate (Cargo.toml at its root), else nothing is
built and `bin` is shipped as it is. The builds run as one playbook
(playbooks/prebuild.yml: local connection, one task per host, every host at
once); the first failure stops the others and is reported with the tail of
that host's build log. A single-host run builds once, in the project's own
target directory, and runs `bin` where it says.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from fdl.errors import BuildError
from fdl.hostside.envvars import FDL_GPU_FEATURE
from fdl.launch.plan import SINGLE, LaunchHost, LaunchPlan

if TYPE_CHECKING:
    from fdl.cluster.events import RunnerEvent
    from fdl.hostside.libtorch.variants import Libtorch
    from fdl.launch.printer import Printer

DEFAULT_RECIPE = "cargo build --release"
TARGET = "target"
NATIVE = "native"  # the target-dir key of a host without arch: (this machine's libtorch)
LOG_NAME = "fdl-build.log"
_ENV_KEYS = ("LIBTORCH_PATH", FDL_GPU_FEATURE, "LD_LIBRARY_PATH")


@dataclass(frozen=True)
class BuildJob:
    """One host's build: where it runs, what it runs, and the environment it adds."""

    host: str
    arch: str | None
    recipe: str | None  # None: nothing to build, the artifact is shipped as it is
    target_dir: Path | None  # CARGO_TARGET_DIR (None: the project's own target dir)
    env: dict[str, Any]  # variables the recipe gets on top of this process's environment
    log: Path
    artifact: Path | None  # what the host's ranks run (None for a run: shell line)
    libtorch: str | None  # shown in messages

    def to_vars(self, root: Path) -> dict[str, Any]:
        """This job as the fdl_prebuild role's inputs."""
        return {"recipe": self.recipe, "chdir": str(root), "environment": self.env, "log": str(self.log),
                "target_dir": str(self.target_dir) if self.target_dir is not None else ""}


def recipe_of(plan: LaunchPlan) -> str | None:
    command = plan.command
    if command.build:
        return command.build
    if command.bin is not None and (plan.root / "Cargo.toml").is_file():
        return DEFAULT_RECIPE
    return None


def arch_key(arch: str | None) -> str:
    return arch.strip("/") if arch else NATIVE


def artifact_path(bin_: str, root: Path, target_dir: Path | None) -> Path:
    """Where `bin` lands for a build into target_dir: a path under target/ moves with CARGO_TARGET_DIR."""
    path = PurePosixPath(bin_)
    if target_dir is not None and not path.is_absolute() and path.parts[:1] == (TARGET,):
        return target_dir.joinpath(*path.parts[1:])
    return Path(bin_) if path.is_absolute() else root / bin_


def host_libtorch(host: LaunchHost, root: Path) -> Libtorch | None:
    """The libtorch a host's build links against: its arch:'s variant, else this machine's own (or None)."""
    from fdl.libtorch.gate import LibtorchError, resolve_active, resolve_variant

    if host.arch:
        return resolve_variant(host.arch, root, what=f"host {host.name}: arch {host.arch}")
    try:
        return resolve_active(root)
    except LibtorchError as exc:
        raise LibtorchError(f"host {host.name} has no arch:, so it builds against this machine's libtorch, and "
                            f"that is not usable: {exc.message}", hint=exc.hint) from None


def build_overrides(libtorch: Libtorch | None) -> dict[str, str]:
    """What the publish gate's build environment adds for this libtorch (LIBTORCH too, for tch-rs)."""
    from fdl.libtorch.gate import build_env

    env = build_env(libtorch)
    out = {key: env[key] for key in _ENV_KEYS if key in env}
    if libtorch is not None:
        out["LIBTORCH"] = out["LIBTORCH_PATH"]
    return out


def build_jobs(plan: LaunchPlan) -> list[BuildJob]:
    """One job per host of the plan (the single-host run: one job, in the project's own target dir)."""
    root = plan.root
    recipe = recipe_of(plan)
    jobs = []
    for host in plan.hosts:
        libtorch = host_libtorch(host, root) if recipe is not None else None
        env = build_overrides(libtorch) if recipe is not None else {}
        if plan.mode == SINGLE:
            target_dir = None
            log = root / TARGET / LOG_NAME
        else:
            target_dir = root / TARGET / "cluster" / host.name / arch_key(host.arch)
            log = target_dir / LOG_NAME
            if recipe is not None:
                env["CARGO_TARGET_DIR"] = str(target_dir)
        artifact = None
        if plan.command.bin is not None:
            artifact = artifact_path(plan.command.bin, root, target_dir if recipe is not None else None)
        jobs.append(BuildJob(host=host.name, arch=host.arch, recipe=recipe, target_dir=target_dir, env=env,
                             log=log, artifact=artifact,
                             libtorch=None if libtorch is None else f"{libtorch.label} ({libtorch.path})"))
    return jobs


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no build log was written)"
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n    ".join(kept) if kept else "(the build printed nothing)"


def prebuild(plan: LaunchPlan, jobs: list[BuildJob], *, progress: bool | None = None) -> None:
    """Run every job's recipe at once through playbooks/prebuild.yml; raise BuildError on the first failure."""
    from fdl.cluster.events import OK, SKIPPED
    from fdl.cluster.inventory import WORKERS_GROUP, ClusterInventory, InventoryHost, local_vars
    from fdl.cluster.runner import run_playbook

    todo = [job for job in jobs if job.recipe is not None]
    if todo:
        inventory = ClusterInventory(
            hosts={job.host: InventoryHost(name=job.host, vars=local_vars(sys.executable)) for job in todo},
            groups={WORKERS_GROUP: [job.host for job in todo]})
        for job in todo:
            job.log.parent.mkdir(parents=True, exist_ok=True)
        cancel = threading.Event()
        first: list[str] = []

        def on_event(event: RunnerEvent) -> None:
            if event.kind == "on_failed" and event.host and not first:
                first.append(event.host)
                cancel.set()  # the first failure aborts the other builds

        result = run_playbook("prebuild.yml", inventory, extravars={
            "fdl_prebuild_plan": {job.host: job.to_vars(plan.root) for job in todo}},
            on_event=on_event, cancel=cancel, progress=progress, title="prebuild")
        failed = first[0] if first else next(
            (h for h, r in result.hosts.items() if r.status not in (OK, SKIPPED)), None)
        if failed is not None:
            job = next(j for j in todo if j.host == failed)
            outcome = result.hosts[failed]
            code = (outcome.res or {}).get("rc")
            raise BuildError(
                f"the pre-flight build failed for host {failed}"
                + (f" (arch {job.arch})" if job.arch else "")
                + f": `{job.recipe}` "
                + (f"exited {code}" if code is not None else f"did not finish ({outcome.message or outcome.status})")
                + f" in {plan.root}. Nothing was dispatched. Last lines of {job.log}:\n    {_tail(job.log)}",
                hint="Fix the build for that host's libtorch (the log above), or pass --no-prebuild to run the "
                     "binaries already built.")
    check_artifacts(plan, jobs)


def check_artifacts(plan: LaunchPlan, jobs: list[BuildJob]) -> None:
    """Every host's artifact must exist before anything is dispatched."""
    for job in jobs:
        if job.artifact is not None and not job.artifact.is_file():
            built = f"the build for {job.host} passed, but" if job.recipe is not None else "there is nothing at"
            raise BuildError(
                f"{built} bin '{plan.command.bin}' of '{plan.command.name}' is not where the launcher looks for "
                f"{job.host}'s binary ({job.artifact}). Nothing was dispatched.",
                hint="bin is the built artifact relative to the project root, e.g. target/release/<name>; a path "
                     "under target/ is looked up in each host's own target dir (target/cluster/<host>/<arch>/)."
                     + (" Drop --no-prebuild to build it." if job.recipe is None or not job.log.exists() else ""))
        if job.artifact is not None and not os.access(job.artifact, os.X_OK):
            raise BuildError(f"{job.artifact} ({job.host}'s bin) is not executable. Nothing was dispatched.",
                             hint=f"chmod +x {job.artifact}, or make bin the built program.")


def build_for_run(plan: LaunchPlan, *, no_prebuild: bool, printer: Printer,
                  progress: bool | None = None) -> dict[str, BuildJob]:
    """The launcher's build step: the pre-flight build (or, with --no-prebuild or no recipe, the check that the
    binaries are there), noted as it goes; the build job of each host by name."""
    jobs = build_jobs(plan)
    if plan.hosts and any(job.recipe for job in jobs):
        if no_prebuild:
            printer.note("--no-prebuild: running the binaries already built")
            check_artifacts(plan, jobs)
        else:
            recipe = next(job.recipe for job in jobs if job.recipe)
            printer.note(f"pre-flight build: `{recipe}` for {len(jobs)} host(s)"
                         + ("" if plan.mode == SINGLE else " (target/cluster/<host>/<arch>/)"))
            t0 = time.monotonic()
            prebuild(plan, jobs, progress=progress)
            printer.note(f"pre-flight build done in {time.monotonic() - t0:.1f}s")
    else:
        check_artifacts(plan, jobs)
    return {job.host: job for job in jobs}
