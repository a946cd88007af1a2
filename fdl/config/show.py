"""Render a resolved configuration with the origin of every value."""

from __future__ import annotations

from typing import Any

import yaml

from fdl.config.project import Config
from fdl.config.source import display_path, format_path


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, allow_unicode=True).strip()
    return text[:-4].rstrip() if text.endswith("\n...") else text.removesuffix("...").strip()


def annotated_yaml(config: Config, header: list[str] | None = None) -> str:
    """The merged document as YAML, each value followed by `# file:line`."""
    rows: list[tuple[str, str]] = []

    def origin(path: tuple) -> str:
        found = config.origins.get(path)
        return str(found) if found else ""

    def walk(value: Any, path: tuple, indent: int) -> None:
        pad = "  " * indent
        if isinstance(value, dict):
            for key, sub in value.items():
                label = f"{pad}{_scalar(key)}:"
                if isinstance(sub, (dict, list)) and sub:
                    rows.append((label, origin(path + (key,))))
                    walk(sub, path + (key,), indent + 1)
                else:
                    rows.append((f"{label} {_scalar(sub)}", origin(path + (key,))))
        elif isinstance(value, list):
            for index, sub in enumerate(value):
                if isinstance(sub, (dict, list)) and sub:
                    rows.append((f"{pad}-", origin(path + (index,))))
                    walk(sub, path + (index,), indent + 1)
                else:
                    rows.append((f"{pad}- {_scalar(sub)}", origin(path + (index,))))

    walk(config.data, (), 0)
    width = min(max((len(text) for text, _ in rows), default=0), 58)
    lines = [f"# {line}" for line in header or []]
    for text, where in rows:
        # At least two spaces before '#': in YAML a '#' right after a value is part of the value.
        lines.append(f"{text.ljust(width)}  # {where}" if where else text)
    if not rows:
        lines.append("{}  # empty")
    return "\n".join(lines) + "\n"


def as_json(config: Config, extra: dict | None = None) -> str:
    """The JSON twin: the merged data, the files in merge order and each value's origin."""
    import json

    origins = {format_path(path): str(o) for path, o in sorted(config.origins.items(), key=lambda kv: str(kv[0]))
               if path}
    doc = {
        "env": config.env.name,
        "env_source": config.env.source,
        "files": [display_path(p) for p in config.files],
        "config": config.data,
        "origins": origins,
        "warnings": config.warnings,
    }
    doc.update(extra or {})
    return json.dumps(doc, indent=2, default=str, sort_keys=False)
