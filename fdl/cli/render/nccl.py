"""Human text for `fdl nccl build`: the plan, the up-front notice, the result."""

from __future__ import annotations

from fdl.nccl.build import BuildResult, preload_entry
from fdl.nccl.plan import BUILD_MINUTES, BuildPlan, command_line

_W = 12


def _row(label: str, value: str, *more: str) -> list[str]:
    lines = [f"  {label:<{_W}} {value}"]
    lines += [f"  {'':<{_W}} {line}" for line in more]
    return lines


def plan_text(plan: BuildPlan) -> str:
    """The whole plan, as `--dry-run` prints it."""
    commands = [command_line(argv) for argv in plan.docker_commands().values()]
    where = plan.host + (" (over ssh)" if plan.remote else " (this machine)")
    lines = ["NCCL build plan (dry run: nothing was changed)"]
    lines += _row("build host", where)
    lines += _row("tag", f"{plan.nccl} (git tag {plan.nccl.git_ref})", f"from: {plan.tag_source}")
    lines += _row("archs", ", ".join(a.dotted for a in plan.archs), f"from: {plan.archs_source}")
    lines += _row("gencode", *plan.gencode)
    lines += _row("jobs", str(plan.jobs))
    lines += _row("base image", plan.base_image)
    lines += _row("Dockerfile", plan.dockerfile)
    lines += _row("docker", *commands)
    lines += _row("output", plan.library)
    lines += _row("runs", f"flodl.fdl.nccl_build (role fdl_nccl) on {plan.host}")
    lines += _row("time", f"{BUILD_MINUTES[0]}-{BUILD_MINUTES[1]} minutes, depending on CPU cores and arch count")
    return "\n".join(lines)


def start_text(plan: BuildPlan) -> str:
    return (f"Building NCCL {plan.nccl} for {', '.join(a.dotted for a in plan.archs)} on {plan.host}: "
            f"this takes {BUILD_MINUTES[0]}-{BUILD_MINUTES[1]} minutes depending on CPU cores and arch count. "
            f"Output: {plan.library}")


def result_text(result: BuildResult) -> str:
    minutes, seconds = divmod(int(result.seconds), 60)
    verb = "Rebuilt" if result.replaced else "Built"
    entry = preload_entry(result.snippet_host, result.library)
    indented = "".join(f"  {line}\n" for line in entry.splitlines())
    return (f"{verb} {result.library} on {result.plan.host} in {minutes}m{seconds:02d}s.\n\n"
            f"Preload it on {result.snippet_host}: add this env: entry to that worker in fdl.cluster.yml "
            f"(next to any env: it already has):\n\n{indented}")
