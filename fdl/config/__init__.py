"""Configuration: fdl.yml discovery, env overlays, deep merge, provenance, schema."""

from fdl.config.project import Config, EnvSelection, available_envs, find_base, load_config
from fdl.config.schema import (
    ClusterSpec,
    CommandSpec,
    ControllerSpec,
    Devices,
    JoinDefaults,
    JoinPolicy,
    PublishDefaults,
    WorkerSpec,
    parse_devices,
    split_host_port,
)
from fdl.config.source import Origin, format_path

__all__ = [
    "ClusterSpec", "CommandSpec", "Config", "ControllerSpec", "Devices", "EnvSelection", "JoinDefaults",
    "JoinPolicy", "Origin", "PublishDefaults", "WorkerSpec", "available_envs", "find_base", "format_path",
    "load_config", "parse_devices", "split_host_port",
]
