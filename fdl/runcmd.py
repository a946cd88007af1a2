"""Running a project command from fdl.yml `commands:`."""

from __future__ import annotations

import shlex
import subprocess

from fdl.config import CommandSpec, Config
from fdl.errors import FdlError


def command_line(spec: CommandSpec, args: list[str]) -> str:
    """The shell line for a run: command, args appended shell-quoted."""
    assert spec.run is not None
    return " ".join([spec.run, *(shlex.quote(a) for a in args)])


def run_project_command(spec: CommandSpec, args: list[str], config: Config, globals_: object) -> int:
    """Run an ordinary command in the project root; its exit code is fdl's."""
    if spec.cluster:
        raise FdlError(
            f"'{spec.name}' is a cluster command (cluster: true): launcher mode is not available in this "
            f"version of fdl yet, so it cannot run. Use an ordinary command (run:) meanwhile."
        )
    line = command_line(spec, args)
    try:
        completed = subprocess.run(["/bin/sh", "-c", line], cwd=config.root)
    except OSError as exc:
        raise FdlError(f"cannot start /bin/sh for '{spec.name}': {exc.strerror}.") from None
    return completed.returncode
