"""Project discovery, env overlays and the resolved configuration.

A project is the nearest directory (the working directory or an ancestor)
holding `fdl.yml`, `fdl.yaml` or `fdl.json`. An env NAME is the sibling
overlay `fdl.NAME.yml` (or .yaml/.json), merged over the base; an overlay may
start from another overlay with `inherit-from: OTHER`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from ..errors import ConfigError, UsageError
from ..hostside.envvars import FDL_ENV, read
from .discover import available_envs, find_base, overlay_file
from .join_fields import JoinDefaults
from .keypath import Data, KeyPath, Origins
from .merge import merge_layers
from .schema import (
    TOP_KEYS,
    Checker,
    ClusterSpec,
    CommandSpec,
    LibtorchDefaults,
    PublishDefaults,
    check_cluster,
    check_commands,
    check_join,
    check_libtorch_block,
    check_publish,
)
from .source import Layer, display_path, read_layer

INHERIT_KEY = "inherit-from"
_ENV_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # fullmatch: `$` would accept a trailing newline


class EnvSelection(NamedTuple):
    """Which env the user asked for and how: --env flag, @sigil or FDL_ENV."""

    name: str | None = None
    source: str | None = None  # "--env", "@sigil", "FDL_ENV", "argument" (fdl config show ENV)

    @staticmethod
    def choose(flag: str | None, sigil: str | None, environ: Mapping[str, str] | None = None) -> EnvSelection:
        """Precedence: --env flag, then the @NAME sigil, then FDL_ENV."""
        for name, source in ((flag, "--env"), (sigil, "@sigil"), (read(FDL_ENV, environ) or None, FDL_ENV)):
            if name:
                return EnvSelection.named(name, source)
        return EnvSelection()

    @staticmethod
    def conflict(flag: str | None, sigil: str | None, environ: Mapping[str, str] | None = None) -> str | None:
        """The warning when the ways of naming an env name different ones (None when they agree or only one is
        used): the strongest wins, as choose() says, and the user hears which."""
        given = [(name, how) for name, how in ((flag, f"--env {flag}"), (sigil, f"@{sigil}"),
                                               (read(FDL_ENV, environ) or None, f"{FDL_ENV}={read(FDL_ENV, environ)}"))
                 if name]
        if len({name for name, _how in given}) < 2:
            return None
        ignored = " and ".join(how for name, how in given[1:] if name != given[0][0])
        return (f"{given[0][1]} overrides {ignored}: using env '{given[0][0]}' (strongest first: --env NAME, then "
                f"@NAME, then {FDL_ENV}).")

    @staticmethod
    def named(name: str, source: str) -> EnvSelection:
        """The env `name`, selected the way `source` says; a name that cannot be a file name is refused."""
        selection = EnvSelection(name, source)
        if not _ENV_RE.fullmatch(name):
            raise UsageError(f"env name {name!r} (from {selection.how}) is not valid: use letters, digits, '-' "
                             f"and '_', as in fdl.<name>.yml.")
        return selection

    @property
    def how(self) -> str:
        """How the env was selected, in a user's words: --env, @NAME, FDL_ENV or the ENV argument."""
        if self.source == "@sigil":
            return f"@{self.name}"
        if self.source == "argument":
            return "the ENV argument"
        return self.source or "nothing"


class Config:
    """The merged, validated configuration of a project under one env."""

    def __init__(self, root: Path | None, env: EnvSelection, files: list[Path], data: Data, origins: Origins):
        self.root = root
        self.env = env
        self.files = files
        self.data = data
        self.origins = origins
        self.commands: dict[str, CommandSpec] = {}
        self.cluster: ClusterSpec | None = None
        self.join: JoinDefaults | None = None
        self.publish: PublishDefaults | None = None
        self.libtorch: LibtorchDefaults | None = None
        self.warnings: list[str] = []
        self.ignored: list[KeyPath] = []  # unknown keys: warned about and not in force
        # validation errors, kept (not raised) only for load_config(keep_errors=True): (key path or None, message)
        self.errors: list[tuple[KeyPath | None, str]] = []

    @property
    def is_discovery_window(self) -> bool:
        return bool(self.cluster and self.cluster.controller.join.discovery)


def _missing_env(root: Path, name: str, needed_by: str) -> ConfigError:
    envs = available_envs(root)
    have = f"envs that exist here: {', '.join(envs)}" if envs else "no env overlays exist here"
    return ConfigError(
        f"env '{name}' ({needed_by}) has no overlay: looked for {display_path(root / f'fdl.{name}.yml')} "
        f"(also .yaml, .json); {have}. Create the file or pick an existing env."
    )


def _overlay_chain(root: Path, env: EnvSelection) -> list[Layer]:
    """The overlay for env and every overlay it inherits from, farthest ancestor first."""
    chain: list[Layer] = []
    names: list[str] = []
    name: str | None = env.name
    needed_by = f"selected by {env.how}"
    while name is not None:
        if name in names:
            cycle = " -> ".join([*names, name])
            raise ConfigError(
                f"inherit-from forms a cycle: {cycle}. An overlay may build on another, but the chain must "
                f"end at one that has no inherit-from."
            )
        path = overlay_file(root, name)
        if path is None:
            raise _missing_env(root, name, needed_by)
        layer = read_layer(path)
        names.append(name)
        chain.append(layer)
        parent = layer.data.pop(INHERIT_KEY, None)
        layer.origins.pop((INHERIT_KEY,), None)
        if parent is not None and (not isinstance(parent, str) or not _ENV_RE.fullmatch(parent)):
            origin = layer.origins.get((), None)
            raise ConfigError(
                f"{display_path(path)}: inherit-from: expected the name of another env (fdl.<name>.yml), "
                f"found {parent!r}."
                + (f" ({origin})" if origin else "")
            )
        needed_by = f"inherit-from in {display_path(path)}"
        name = parent
    return list(reversed(chain))


def load_config(cwd: Path | None = None, env: EnvSelection | None = None, *, required: bool = True,
                keep_errors: bool = False) -> Config:
    """Find, read, merge and validate the project's configuration.

    With required=False and no fdl.yml anywhere up the tree (and no env asked
    for), an empty Config is returned: commands like `fdl probe` work without one.
    keep_errors=True returns a document that reads but does not validate, its errors in `config.errors`
    (`fdl config show` prints it with them marked); a file that does not parse still raises.
    """
    env = env or EnvSelection()
    base = find_base(cwd or Path.cwd())
    if base is None:
        if env.name or required:
            where = str((cwd or Path.cwd()).resolve())
            raise ConfigError(
                f"no fdl.yml (or fdl.yaml, fdl.json) in {where} or any directory above it"
                + (f", so env '{env.name}' (selected by {env.how}) cannot be applied" if env.name else "")
                + ". Run fdl from your project directory, or create fdl.yml there."
            )
        return Config(root=None, env=env, files=[], data={}, origins={})
    root = base.parent
    layers = [read_layer(base)]
    if INHERIT_KEY in layers[0].data:
        raise ConfigError(
            f"{layers[0].origins.get((INHERIT_KEY,)) or display_path(base)}: inherit-from belongs in an env "
            f"overlay (fdl.<env>.yml), not in the base {base.name}. Remove it."
        )
    if env.name:
        layers += _overlay_chain(root, env)
    data, origins = merge_layers(layers)
    return validate(Config(root=root, env=env, files=[layer.path for layer in layers], data=data,
                           origins=origins), keep_errors=keep_errors)


def validate(config: Config, *, keep_errors: bool = False) -> Config:
    """Check the merged document and fill the typed blocks; warnings go to config.warnings.

    Every block is checked even after an error, and every error found is raised at once (with the
    warnings, which often explain an error: a mistyped key is ignored, so what it meant to set is not).
    """
    shown = {display_path(p): p for p in config.files}
    checker = Checker(config.origins, list(shown), paths=shown)
    data: Data = checker.soft({}, checker.mapping, config.data, (), TOP_KEYS)
    if data.get("cluster") is not None:
        config.cluster = checker.soft(None, check_cluster, checker, data["cluster"])
    if data.get("commands") is not None:
        config.commands = checker.soft({}, check_commands, checker, data["commands"])
    if data.get("join") is not None:
        config.join = checker.soft(None, check_join, checker, data["join"])
    if data.get("publish") is not None:
        config.publish = checker.soft(None, check_publish, checker, data["publish"])
    if data.get("libtorch") is not None:
        config.libtorch = checker.soft(None, check_libtorch_block, checker, data["libtorch"])
    config.warnings.extend(checker.warnings)
    config.ignored.extend(checker.ignored)
    if checker.errors and keep_errors:
        config.errors = [(checker.error_paths.get(error), error) for error in checker.errors]
    elif checker.errors:
        raise ConfigError.collected(checker.errors, config.warnings)
    return config
