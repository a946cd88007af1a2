"""State shared by every command of one invocation: env selection, --gpus, debug."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fdl.gpus import GpuSelection, parse_gpus
from fdl.hostside.envvars import FDL_ENV, read

if TYPE_CHECKING:
    import click

    from fdl.config.project import Config, EnvSelection
    from fdl.config.schema import CommandSpec


class Invocation:
    """What main() learned before the command line was parsed."""

    def __init__(self, sigil: str | None = None, debug: bool = False):
        self.sigil = sigil
        self.debug = debug


class Globals:
    """The root options, plus the configuration they select (loaded once, on demand)."""

    def __init__(self, invocation: Invocation, env_flag: str | None = None, gpus_spec: str | None = None,
                 debug: bool = False, verbose: bool = False, gpus_given: tuple[str, ...] = ()):
        self.invocation = invocation
        self.gpus_given = gpus_given  # every --gpus value on the command line, in order
        self.env_flag = env_flag
        self.gpus_spec = gpus_spec
        self.debug = debug
        self.verbose = verbose
        self.gpus: GpuSelection | None = None
        self._configs: dict[bool, Config] = {}
        self._warned = False
        self._env_checked = False

    @property
    def env(self) -> EnvSelection:
        from fdl.config.project import EnvSelection

        if not self._env_checked:  # a conflict is said once, on stderr, whichever command asks first
            self._env_checked = True
            conflict = EnvSelection.conflict(self.env_flag, self.invocation.sigil)
            if conflict is not None:
                print(f"fdl: warning: {conflict}", file=sys.stderr)
        return EnvSelection.choose(self.env_flag, self.invocation.sigil)

    def apply_gpus(self) -> None:
        """Parse --gpus and scope every process this command starts to that selection; --gpus given more than
        once is refused (exit 2), never "the last one wins"."""
        if len(self.gpus_given) > 1:
            from fdl.errors import UsageError

            given = " and ".join(f"--gpus {spec}" for spec in self.gpus_given)
            raise UsageError(f"--gpus is given {len(self.gpus_given)} times ({given}); give it once, with every GPU "
                             f"the command may use: 'all' or ids like 0,1.")
        if self.gpus_spec is None:
            return
        self.gpus = parse_gpus(self.gpus_spec)
        if self.gpus.ids is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.gpus.ids))

    def config(self, *, required: bool = False) -> Config:
        """The resolved configuration for the selected env (warnings printed once)."""
        from fdl.config.project import load_config

        key = required
        if key not in self._configs:
            config = load_config(Path.cwd(), self.env, required=required)
            self._configs[key] = config
            self._configs.setdefault(False, config)
            if not self._warned:
                self._warned = True
                for warning in config.warnings:
                    print(f"fdl: warning: {warning}", file=sys.stderr)
        return self._configs[key]

    def user_commands(self) -> dict[str, CommandSpec]:
        """commands: from fdl.yml, or {} when there is no project here."""
        from fdl.config.discover import find_base

        no_env = self.invocation.sigil is None and self.env_flag is None and not read(FDL_ENV)
        if no_env and find_base(Path.cwd()) is None:
            return {}
        return self.config().commands


def globals_of(ctx: click.Context) -> Globals:
    """The invocation's Globals, which fdl.cli.main sets on the root context before any command runs."""
    found = ctx.find_object(Globals)
    if found is None:
        raise RuntimeError("a command ran outside fdl.cli.main, which sets up the Globals every command reads")
    return found

