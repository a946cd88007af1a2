"""Render a resolved configuration with the origin of every value."""

from __future__ import annotations

import re
from typing import Any

import yaml

from fdl.config.project import Config
from fdl.config.source import KeyPath, display_path, format_path


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, allow_unicode=True).strip()
    return text[:-4].rstrip() if text.endswith("\n...") else text.removesuffix("...").strip()


# Keys whose values are secrets wherever they appear (a join token, an env var
# like HF_TOKEN or DB_PASSWORD in a command's env: block), and text that is key material.
_SECRET_KEY_RE = re.compile(r"(?:^|[_-])(?:token|secret|password|passphrase|private[_-]?key|api[_-]?key)\Z",
                            re.IGNORECASE)
_KEY_MATERIAL = ("PRIVATE KEY-----", "PRIVATE KEY BLOCK-----")


def is_secret(path: KeyPath, value: Any) -> bool:
    """True for a value `config show` masks: a secret-named key, or text holding private key material."""
    if isinstance(value, (dict, list)):
        return False
    if path and isinstance(path[-1], str) and _SECRET_KEY_RE.search(path[-1]):
        return value is not None
    return isinstance(value, str) and any(mark in value for mark in _KEY_MATERIAL)


def redaction(config: Config, path: KeyPath, value: Any) -> str:
    found = config.origins.get(path)
    where = f", set in {found}" if found else ""
    return f"<redacted: {len(value if isinstance(value, str) else str(value))} chars{where}>"


def redacted_data(config: Config) -> tuple[Any, list[str]]:
    """A copy of the merged data with every secret replaced by its redaction, and the paths masked."""
    masked: list[str] = []

    def walk(value: Any, path: KeyPath) -> Any:
        if isinstance(value, dict):
            return {key: walk(sub, path + (key,)) for key, sub in value.items()}
        if isinstance(value, list):
            return [walk(sub, path + (index,)) for index, sub in enumerate(value)]
        if is_secret(path, value):
            masked.append(format_path(path))
            return redaction(config, path, value)
        return value

    return walk(config.data, ()), masked


def annotated_yaml(config: Config, header: list[str] | None = None, *, show_secrets: bool = False) -> str:
    """The merged document as YAML, each value followed by `# file:line`; secrets masked unless show_secrets;
    unknown keys (warned about, not in force) marked ignored."""
    rows: list[tuple[str, str]] = []

    ignored = set(config.ignored)

    def origin(path: KeyPath) -> str:
        found = config.origins.get(path)
        where = str(found) if found else ""
        return f"{where} (ignored: unknown key)".lstrip() if path in ignored else where

    def shown(path: KeyPath, value: Any) -> str:
        if not show_secrets and is_secret(path, value):
            return redaction(config, path, value)
        return _scalar(value)

    def walk(value: Any, path: KeyPath, indent: int) -> None:
        pad = "  " * indent
        if isinstance(value, dict):
            for key, sub in value.items():
                label = f"{pad}{_scalar(key)}:"
                if isinstance(sub, (dict, list)) and sub:
                    rows.append((label, origin(path + (key,))))
                    walk(sub, path + (key,), indent + 1)
                else:
                    rows.append((f"{label} {shown(path + (key,), sub)}", origin(path + (key,))))
        elif isinstance(value, list):
            for index, sub in enumerate(value):
                if isinstance(sub, (dict, list)) and sub:
                    rows.append((f"{pad}-", origin(path + (index,))))
                    walk(sub, path + (index,), indent + 1)
                else:
                    rows.append((f"{pad}- {shown(path + (index,), sub)}", origin(path + (index,))))

    walk(config.data, (), 0)
    width = min(max((len(text) for text, _ in rows), default=0), 58)
    lines = [f"# {line}" for line in header or []]
    for text, where in rows:
        # At least two spaces before '#': in YAML a '#' right after a value is part of the value.
        lines.append(f"{text.ljust(width)}  # {where}" if where else text)
    if not rows:
        lines.append("{}  # empty")
    return "\n".join(lines) + "\n"


def as_json(config: Config, extra: dict[str, Any] | None = None, *, show_secrets: bool = False) -> str:
    """The JSON twin: the merged data (secrets masked unless show_secrets), the files and each value's origin."""
    import json

    data, masked = (config.data, []) if show_secrets else redacted_data(config)

    origins = {format_path(path): str(o) for path, o in sorted(config.origins.items(), key=lambda kv: str(kv[0]))
               if path}
    doc = {
        "env": config.env.name,
        "env_source": config.env.source,
        "files": [display_path(p) for p in config.files],
        "config": data,
        "redacted": masked,
        "origins": origins,
        "warnings": config.warnings,
        "ignored": [format_path(path) for path in config.ignored],
    }
    doc.update(extra or {})
    return json.dumps(doc, indent=2, default=str, sort_keys=False)
