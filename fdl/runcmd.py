"""Running a project command from fdl.yml `commands:`."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from fdl.config.project import Config
from fdl.config.schema import CommandSpec
from fdl.errors import FdlError


def _env(spec: CommandSpec) -> dict[str, str] | None:
    """The command's environment: this one, with the command's env: over it (None: inherit as it is)."""
    return {**os.environ, **spec.env_dict} if spec.env else None


def command_line(spec: CommandSpec, args: list[str]) -> str:
    """The shell line for a run: command, args appended shell-quoted."""
    assert spec.run is not None
    return " ".join([spec.run, *(shlex.quote(a) for a in args)])


def run_project_command(spec: CommandSpec, args: list[str], config: Config, globals_: object, *,
                        no_prebuild: bool = False, port: int | None = None) -> int:
    """Run a command in the project root; its exit code is fdl's.

    A `cluster: true` command is a launcher run (fdl.launch) when the configuration gives it hosts (cluster
    workers, a discovery window) or a single-host shape (--gpus with two or more GPUs, local_devices:);
    otherwise it runs once, here, like an ordinary command.
    """
    if spec.cluster:
        from fdl.launch.plan import plan_launch

        assert config.root is not None
        plan = plan_launch(spec, args, config.cluster, config.root, getattr(globals_, "gpus", None), port=port)
        if plan is not None:
            from fdl.launch.run import launch

            return launch(plan, no_prebuild=no_prebuild, env_name=config.env.name)
        print(f"fdl: note: '{spec.name}' runs once, on this machine: there are no cluster workers, and neither "
              f"--gpus (two or more GPUs) nor the command's local_devices: asks for a single-host cluster.",
              file=sys.stderr)
        if spec.run is None:
            return _run_binary(spec, args, config, no_prebuild)
    line = command_line(spec, args)
    try:
        completed = subprocess.run(["/bin/sh", "-c", line], cwd=config.root, env=_env(spec), check=False)
    except OSError as exc:
        raise FdlError(f"cannot start /bin/sh for '{spec.name}': {exc.strerror}.") from None
    return completed.returncode


def _run_binary(spec: CommandSpec, args: list[str], config: Config, no_prebuild: bool) -> int:
    """A cluster command with bin: and nowhere to fan out: build it (build:, when set) and run it once."""
    assert spec.bin is not None and config.root is not None
    if spec.build and not no_prebuild:
        from fdl.publish.gate import run_recipe

        code = run_recipe(spec.build, config.root, dict(os.environ))
        if code != 0:
            raise FdlError(f"the build of '{spec.name}' failed: `{spec.build}` exited {code} (its output is above).")
    binary = config.root / spec.bin
    try:
        completed = subprocess.run([str(binary), *spec.args, *args], cwd=config.root, env=_env(spec),
                                   check=False)
    except OSError as exc:
        raise FdlError(f"cannot run bin '{spec.bin}' of '{spec.name}' ({binary}): {exc.strerror}.",
                       hint="bin is the built program relative to the project root.") from None
    return completed.returncode
