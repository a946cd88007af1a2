"""YAML (or JSON) text to plain Python values plus provenance, defensively.

The reader bounds the nesting depth and the number of nodes after alias
expansion (so a "billion laughs" document is refused instead of eating the
machine), rejects duplicate keys and unsupported tags, and turns every parser
complaint into a `ConfigError` that names the file, the line and what to fix.
fdl.config.source imports this module only when a file is not in its cache,
because PyYAML's import is a large part of a short command's start-up.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from ..errors import ConfigError
from .keypath import Data, KeyPath, Origin, Origins, format_path

MAX_NODES = 100_000  # after alias expansion
MAX_DEPTH = 64

try:  # libyaml is several times faster; its nodes carry the same marks
    _Loader: type = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader

# YAML 1.1 (what PyYAML resolves) turns plain scalars like 0755 (octal), 22:17
# (base 60), 0b101, 0x1f and 1_000 into numbers. fdl reads numbers the way YAML
# 1.2's core schema writes them in decimal, and keeps every other spelling as
# the text the user wrote: a token `0755` stays "0755", and a port `22:17` is a
# string that the port check refuses with its line.
_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_DECIMAL_INT_RE = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
_DECIMAL_FLOAT_RE = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)")


def parse_text(text: str, shown: str, *, json_file: bool) -> tuple[Data, Origins]:
    """The document's data and the origin of every key path in it, or ConfigError."""
    if "\x00" in text:
        raise ConfigError(f"{shown}: the file holds NUL bytes; it is not a text configuration file.")
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        if json_file:
            return _parse_json_fallback(text, shown)
        mark = exc.problem_mark or exc.context_mark
        where = f"{shown}:{mark.line + 1}:{mark.column + 1}" if mark else shown
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        raise ConfigError(
            f"{where}: invalid {'JSON' if json_file else 'YAML'}: {what}. Fix the syntax at that spot "
            f"(common causes: a missing space after ':', a tab used for indentation, unbalanced quotes "
            f"or brackets)."
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{shown}: invalid YAML: {exc}. Fix the file's syntax.") from None
    except RecursionError:
        raise ConfigError(f"{shown}: the document is nested too deeply to read; a configuration file "
                          f"needs only a few levels.") from None
    finally:
        loader.dispose()
    if node is None:
        return {}, {}
    if not isinstance(node, yaml.MappingNode):
        kind = "a list" if isinstance(node, yaml.SequenceNode) else "a single value"
        raise ConfigError(
            f"{shown}:{node.start_mark.line + 1}: the document is {kind}, but an fdl configuration "
            f"file is a mapping of sections (cluster:, commands:, join:, libtorch:, publish:). Start the file "
            f"with a key such as 'commands:'."
        )
    builder = _Builder(shown)
    data = builder.build(node, (), 0, frozenset())
    return data, builder.origins


def _parse_json_fallback(text: str, shown: str) -> tuple[Data, Origins]:
    """A .json file YAML cannot read (tabs, say): parse it as JSON, origins at line level only."""
    import json

    def no_duplicates(pairs: list[tuple[Any, Any]]) -> Data:
        seen: Data = {}
        for key, value in pairs:
            if key in seen:
                raise ConfigError(f"{shown}: duplicate key {key!r}; each key may appear once.")
            seen[key] = value
        return seen

    try:
        data = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{shown}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}. Fix the syntax "
                          f"at that spot.") from None
    except RecursionError:
        raise ConfigError(f"{shown}: the document is nested too deeply to read.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{shown}: the document is not an object; an fdl configuration file is a "
                          f"mapping of sections.")
    origins: Origins = {}
    _stamp(data, (), Origin(shown, 0), origins)
    return data, origins


def _stamp(value: Any, path: KeyPath, origin: Origin, origins: Origins) -> None:
    origins[path] = origin
    if isinstance(value, dict):
        for k, v in value.items():
            _stamp(v, path + (k,), origin, origins)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _stamp(v, path + (i,), origin, origins)


class _Builder:
    """Turns a composed YAML node graph into plain values, with bounds and provenance."""

    def __init__(self, shown: str):
        self.shown = shown
        self.origins: Origins = {}
        self.count = 0
        self.constructor = yaml.constructor.SafeConstructor()

    def _where(self, node: yaml.Node) -> str:
        return f"{self.shown}:{node.start_mark.line + 1}"

    def build(self, node: yaml.Node, path: KeyPath, depth: int, active: frozenset[int]) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise ConfigError(
                f"{self._where(node)}: the document expands to more than {MAX_NODES:,} values once its "
                f"aliases (*name) are resolved. That is the shape of a 'billion laughs' document, not a "
                f"configuration; remove the nested aliases."
            )
        if depth > MAX_DEPTH:
            raise ConfigError(f"{self._where(node)}: values are nested more than {MAX_DEPTH} levels deep; "
                              f"a configuration file needs only a few levels.")
        if id(node) in active:
            raise ConfigError(f"{self._where(node)}: an alias refers to a value that contains it; "
                              f"recursive aliases are not allowed.")
        self.origins[path] = Origin(self.shown, node.start_mark.line + 1)
        if isinstance(node, yaml.ScalarNode):
            if not node.style and (  # plain (PyYAML: None, libyaml: "")
                    (node.tag == _INT_TAG and not _DECIMAL_INT_RE.fullmatch(node.value))
                    or (node.tag == _FLOAT_TAG and not _DECIMAL_FLOAT_RE.fullmatch(node.value))):
                return node.value  # 0755, 22:17, 0x1f, 1_000: kept as written
            try:
                return self.constructor.construct_object(node, deep=True)
            except (yaml.YAMLError, ValueError, OverflowError) as exc:
                raise ConfigError(f"{self._where(node)}: cannot read the value {node.value!r}: "
                                  f"{getattr(exc, 'problem', None) or exc}.") from None
        if node.tag not in ("tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"):
            raise ConfigError(f"{self._where(node)}: the tag {node.tag!r} is not supported; configuration files "
                              f"hold plain mappings, lists and values. Remove the tag.")
        inner = active | {id(node)}
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,), depth + 1, inner) for i, item in enumerate(node.value)]
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth, inner)
        raise ConfigError(f"{self._where(node)}: unsupported YAML node.")  # pragma: no cover

    def _mapping(self, node: yaml.MappingNode, path: KeyPath, depth: int, active: frozenset[int]) -> Data:
        result: Data = {}
        merged_defaults: Data = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`
                for source in self._merge_sources(value_node):
                    sub = self.build(source, path, depth + 1, active)
                    for k, v in sub.items():
                        merged_defaults.setdefault(k, v)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise ConfigError(f"{self._where(key_node)}: a key must be a plain name, not a list or "
                                  f"mapping.")
            try:
                key = self.constructor.construct_object(key_node)
            except (yaml.YAMLError, ValueError, OverflowError) as exc:
                raise ConfigError(f"{self._where(key_node)}: cannot read the key {key_node.value!r}: "
                                  f"{getattr(exc, 'problem', None) or exc}.") from None
            if not isinstance(key, (str, int, bool, float)) and key is not None:
                key = str(key)
            if key in result:
                raise ConfigError(
                    f"{self._where(key_node)}: duplicate key {key!r} under {format_path(path)}; each key "
                    f"may appear once (the later one would silently win). Remove one of them."
                )
            result[key] = self.build(value_node, path + (key,), depth + 1, active)
            self.origins[path + (key,)] = Origin(self.shown, key_node.start_mark.line + 1)
        for k, v in merged_defaults.items():
            result.setdefault(k, v)
        return result

    def _merge_sources(self, node: yaml.Node) -> list[yaml.Node]:
        if isinstance(node, yaml.MappingNode):
            return [node]
        if isinstance(node, yaml.SequenceNode) and all(isinstance(n, yaml.MappingNode) for n in node.value):
            return list(node.value)
        raise ConfigError(f"{self._where(node)}: '<<' merges a mapping or a list of mappings.")
