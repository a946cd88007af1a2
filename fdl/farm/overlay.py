"""The farm overlay fdl.LABEL.yml: scaffold it once; afterwards it is the operator's.

The overlay names the farm's token file (`token_file: .fdl/LABEL/token`), so a rotation changes that 0600
file and never the overlay, which holds no secret and may be committed. An overlay from an fdl that wrote
the token itself into it (`token: "..."`) is moved off it once: each literal `token:` entry is replaced by
`token_file:` in place, its exact span found from the YAML parser's marks, so comments, key order, flow or
block style, CRLF endings and every other byte stay as they were. An overlay with neither line was written
by a person; fdl does not edit it and hands back a snippet to paste instead.
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


def _find(node: yaml.Node, path: tuple[str, ...]) -> tuple[yaml.ScalarNode, yaml.ScalarNode] | None:
    """(key node, value node) of the scalar at path, or None."""
    found: tuple[yaml.ScalarNode, yaml.ScalarNode] | None = None
    for key in path:
        if not isinstance(node, yaml.MappingNode):
            return None
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                found, node = (key_node, value_node), value_node
                break
        else:
            return None
    if found is None or not isinstance(found[1], yaml.ScalarNode):
        return None
    return found


def _compose(text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        problem = exc.problem if isinstance(exc, yaml.MarkedYAMLError) else None
        raise OverlayEditError(f"it does not parse as YAML ({problem or exc})") from None


def token_spans(text: str) -> list[tuple[int, int]]:
    """(start of the key, end of the value) of every literal `token:` entry the overlay holds, in character
    offsets of text (cluster.controller.join.token, join.token)."""
    root = _compose(text)
    if root is None:
        return []
    spans = []
    for path in TOKEN_PATHS:
        found = _find(root, path)
        if found is None:
            continue
        key, value = found
        chunk = text[key.start_mark.index:value.end_mark.index]
        if "\n" in chunk or value.style not in (None, '"', "'"):
            raise OverlayEditError(f"its {'.'.join(path)} value spans lines or uses a block style")
        spans.append((key.start_mark.index, value.end_mark.index))
    return spans


def token_files(text: str) -> list[str]:
    """The values of every `token_file:` the overlay sets (cluster.controller.join, join)."""
    try:
        root = _compose(text)
    except OverlayEditError:
        return []
    out = []
    for path in TOKEN_PATHS:
        found = _find(root, path[:-1] + ("token_file",)) if root is not None else None
        if found is not None and found[1].value:
            out.append(str(found[1].value))
    return out


def has_token(data: bytes) -> bool:
    """The overlay sets a token: a literal one or a token_file: (what fdl may take over from it)."""
    try:
        text = data.decode("utf-8")
        return bool(token_spans(text)) or bool(token_files(text))
    except (UnicodeDecodeError, OverlayEditError):
        return False


def point_at_token_file(data: bytes, token_file: str) -> bytes | None:
    """data with every literal `token: ...` entry replaced by `token_file: <token_file>`, byte for byte
    otherwise (comments, order, flow or block style, CRLF); None when it holds no literal token."""
    if not re.fullmatch(r"[A-Za-z0-9._/@+-]+", token_file):
        raise OverlayEditError(f"{token_file!r} is not a path fdl writes unquoted")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise OverlayEditError("it is not UTF-8") from None
    spans = token_spans(text)
    if not spans:
        return None
    out = text
    for start, end in sorted(spans, reverse=True):
        out = out[:start] + f"token_file: {token_file}" + out[end:]
    return out.encode("utf-8")
