"""Configuration: fdl.yml discovery, env overlays, deep merge, provenance, schema.

Attributes load lazily: `from fdl.config import find_base` costs no YAML import.

This package, fdl.cluster.inventory and what they import (fdl.errors, fdl.fsio, fdl.checks.devices) are
the configuration reader the flodl.fdl collection's inventory plugin carries (fdl/collection.py,
READER): they import one another relatively and need nothing beyond the standard library and PyYAML.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Config": "project", "EnvSelection": "project", "load_config": "project",
    "available_envs": "discover", "find_base": "discover",
    "ClusterSpec": "schema", "CommandSpec": "schema", "ControllerSpec": "schema", "Devices": "schema",
    "JoinDefaults": "schema", "JoinPolicy": "schema", "PublishDefaults": "schema", "WorkerSpec": "schema",
    "parse_devices": "schema", "split_host_port": "schema",
    "Origin": "source", "format_path": "source",
}

__all__ = list(sorted(_EXPORTS))


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fdl.config' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
