"""The farm overlay fdl.LABEL.yml: scaffold it once, afterwards touch only its token.

A re-run (or a rotation) rewrites the token value in place and nothing else:
the value's exact span is found from the YAML parser's marks and spliced, so
comments, key order, quoting style, CRLF endings and every other byte stay
as they were. An overlay with no token line was written by a person; fdl
does not edit it and hands back a snippet to paste instead.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import yaml

TOKEN_PATHS = (("cluster", "controller", "join", "token"), ("join", "token"))
_CRATE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class OverlayEditError(Exception):
    """The overlay cannot be edited safely (the message says why)."""


@dataclass(frozen=True)
class Crate:
    name: str  # the command name in commands:
    bin: str  # cargo's binary name


def read_crate(root: Path) -> Crate | None:
    """The training crate at root: its first [[bin]], else its [package] name; None when guessing."""
    try:
        doc = tomllib.loads((root / "Cargo.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    bins = doc.get("bin")
    if isinstance(bins, list):
        for entry in bins:
            name = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(name, str) and _CRATE_NAME_RE.fullmatch(name):
                return Crate(name, name)
    package = doc.get("package")
    name = package.get("name") if isinstance(package, dict) else None
    if isinstance(name, str) and _CRATE_NAME_RE.fullmatch(name):
        return Crate(name, name)
    return None


def _find(node: yaml.Node, path: tuple[str, ...]) -> yaml.ScalarNode | None:
    for key in path:
        if not isinstance(node, yaml.MappingNode):
            return None
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                node = value_node
                break
        else:
            return None
    return node if isinstance(node, yaml.ScalarNode) else None


def token_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, style) of every token value the overlay holds, in character offsets of text."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        problem = exc.problem if isinstance(exc, yaml.MarkedYAMLError) else None
        raise OverlayEditError(f"it does not parse as YAML ({problem or exc})") from None
    if root is None:
        return []
    spans = []
    for path in TOKEN_PATHS:
        node = _find(root, path)
        if node is None:
            continue
        start, end = node.start_mark.index, node.end_mark.index
        chunk = text[start:end]
        if "\n" in chunk or (node.style not in (None, '"', "'")):
            raise OverlayEditError(f"its {'.'.join(path)} value spans lines or uses a block style")
        spans.append((start, end, node.style or ""))
    return spans


def has_token(data: bytes) -> bool:
    try:
        return bool(token_spans(data.decode("utf-8")))
    except (UnicodeDecodeError, OverlayEditError):
        return False


def rewrite_token(data: bytes, token: str) -> bytes | None:
    """data with every token value replaced by token, byte for byte otherwise; None when there is none."""
    if not re.fullmatch(r"[0-9a-f]+", token):
        raise OverlayEditError("a token is hex digits only")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise OverlayEditError("it is not UTF-8") from None
    spans = token_spans(text)
    if not spans:
        return None
    out = text
    for start, end, style in sorted(spans, reverse=True):
        if start == end:  # `token:` with no value: insert one after the colon
            space = " " if start and out[start - 1] == ":" else ""
            out = out[:start] + f'{space}"{token}"' + out[end:]
            continue
        quote = style if style in ('"', "'") else ""
        value = f"{quote}{token}{quote}" if quote else f'"{token}"'
        out = out[:start] + value + out[end:]
    return out.encode("utf-8")


def current_token(data: bytes) -> str | None:
    try:
        doc = yaml.safe_load(data.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError):
        return None
    for path in TOKEN_PATHS:
        node = doc
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            return str(node)
    return None
