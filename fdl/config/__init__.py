"""Configuration: fdl.yml discovery, env overlays, deep merge, provenance, schema.

Attributes load lazily: `from fdl.config import find_base` costs no YAML import.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Config": "project", "EnvSelection": "project", "load_config": "project",
    "available_envs": "discover", "find_base": "discover",
    "ClusterSpec": "schema", "CommandSpec": "schema", "ControllerSpec": "schema", "Devices": "schema",
    "JoinPolicy": "schema", "PublishDefaults": "schema", "WorkerSpec": "schema", "parse_devices": "schema",
    "JoinDefaults": "join_fields", "split_host_port": "parse",
    "Origin": "source", "format_path": "source",
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605 (a lazy module: the names are _EXPORTS' keys)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fdl.config' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"fdl.config.{module}"), name)
    globals()[name] = value
    return value
