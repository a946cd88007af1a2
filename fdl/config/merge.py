"""Deep merge of configuration layers, carrying provenance along.

Rules: mappings merge key by key, recursively; scalars and lists are replaced
whole; a key set to null in the overlay deletes the key. The origin of every
surviving value is the layer that last wrote it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

from .keypath import Data, KeyPath, Origins
from .source import Layer


def _paths(value: object, path: KeyPath) -> Iterator[KeyPath]:
    """Every key path inside value, value's own first (linear in its size)."""
    yield path
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from _paths(sub, path + (key,))
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            yield from _paths(sub, path + (index,))


def _drop(origins: Origins, old: object, prefix: KeyPath) -> None:
    for path in _paths(old, prefix):
        origins.pop(path, None)


def merge_layers(layers: list[Layer]) -> tuple[Data, Origins]:
    """Merge layers in order (later ones win); return (data, origins)."""
    data: Data = {}
    origins: Origins = {}
    for layer in layers:
        _merge_into(data, origins, layer.data, layer.origins, ())
    return data, origins


def _merge_into(target: Data, origins: Origins, over: Data, over_origins: Origins, path: KeyPath) -> None:
    for key, value in over.items():
        here = path + (key,)
        if value is None:
            if key in target:
                _drop(origins, target.pop(key), here)
            continue
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            if here in over_origins:
                origins[here] = over_origins[here]
            _merge_into(target[key], origins, value, over_origins, here)
            continue
        if key in target:
            _drop(origins, target[key], here)
        target[key] = copy.deepcopy(value)
        for p in _paths(value, here):
            if p in over_origins:
                origins[p] = over_origins[p]
        _prune_nulls(target[key], origins, here)


def _prune_nulls(value: object, origins: Origins, path: KeyPath) -> None:
    """A null inside a freshly placed mapping means "absent", as it would on a merge."""
    if isinstance(value, dict):
        for key in [k for k, v in value.items() if v is None]:
            del value[key]
            origins.pop(path + (key,), None)
        for key, sub in value.items():
            _prune_nulls(sub, origins, path + (key,))
