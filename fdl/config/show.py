"""Render a resolved configuration with the origin of every value."""

from __future__ import annotations

from typing import Any

import yaml

from .keypath import KeyPath, format_path
from .masking import Mask, find_masks
from .project import Config
from .source import display_path


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, allow_unicode=True).strip()
    return text[:-4].rstrip() if text.endswith("\n...") else text.removesuffix("...").strip()


def redaction(config: Config, path: KeyPath, value: Any) -> str:
    found = config.origins.get(path)
    where = f", set in {found}" if found else ""
    return f"<redacted: {len(value if isinstance(value, str) else str(value))} chars{where}>"


def masked_value(config: Config, path: KeyPath, mask: Mask, value: Any) -> str:
    """What is shown for a masked value (fdl.config.masking says what is masked)."""
    return redaction(config, path, value) if mask.whole or mask.shown is None else mask.shown


def redacted_data(config: Config) -> tuple[Any, list[str]]:
    """A copy of the merged data with every secret replaced by its redaction, and the paths masked."""
    masks = find_masks(config.data)
    masked: list[str] = []

    def walk(value: Any, path: KeyPath) -> Any:
        if isinstance(value, dict):
            return {key: walk(sub, path + (key,)) for key, sub in value.items()}
        if isinstance(value, list):
            return [walk(sub, path + (index,)) for index, sub in enumerate(value)]
        mask = masks.get(path)
        if mask is not None:
            masked.append(format_path(path))
            return masked_value(config, path, mask, value)
        return value

    return walk(config.data, ()), masked


def annotated_yaml(config: Config, header: list[str] | None = None, *, show_secrets: bool = False) -> str:
    """The merged document as YAML, each value followed by `# file:line`; secrets masked unless show_secrets;
    unknown keys (warned about, not in force) marked ignored."""
    rows: list[tuple[str, str]] = []
    masks = {} if show_secrets else find_masks(config.data)

    ignored = set(config.ignored)
    marks, unplaced = error_marks(config)

    def origin(path: KeyPath) -> str:
        found = config.origins.get(path)
        where = str(found) if found else ""
        if path in ignored:
            where = f"{where} (ignored: unknown key)".lstrip()
        return " ".join([where, *(f"(error: {text})" for text in marks.get(path, ()))]).strip()

    def shown(path: KeyPath, value: Any) -> str:
        mask = masks.get(path)
        if mask is None:
            return _scalar(value)
        return redaction(config, path, value) if mask.whole or mask.shown is None else _scalar(mask.shown)

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
    width = min(max((len(row[0]) for row in rows), default=0), 58)
    lines = [f"# {line}" for line in header or []]
    if config.errors:
        count = len(config.errors)
        lines.append(f"# {count} error{'s' if count != 1 else ''} in this configuration: marked (error: ...) below "
                     f"and listed on stderr; no command runs on it until {'they are' if count != 1 else 'it is'} "
                     f"fixed")
        lines += [f"# error: {text}" for text in unplaced]
    for text, where in rows:
        # At least two spaces before '#': in YAML a '#' right after a value is part of the value.
        lines.append(f"{text.ljust(width)}  # {where}" if where else text)
    if not rows:
        lines.append("{}  # empty")
    return "\n".join(lines) + "\n"


def error_marks(config: Config) -> tuple[dict[KeyPath, list[str]], list[str]]:
    """Where each validation error shows in the document: ({shown key path: [what is wrong]}, [errors about no
    key the document shows]). An error about a key that is not there (a missing host:) marks the nearest key
    above it that is."""
    present: set[KeyPath] = set()

    def collect(value: Any, path: KeyPath) -> None:
        present.add(path)
        if isinstance(value, dict):
            for key, sub in value.items():
                collect(sub, path + (key,))
        elif isinstance(value, list):
            for index, sub in enumerate(value):
                collect(sub, path + (index,))

    collect(config.data, ())
    marks: dict[KeyPath, list[str]] = {}
    unplaced: list[str] = []
    for about, message in config.errors:
        if about is None:
            unplaced.append(message)
            continue
        named = f"{format_path(about)}: "
        text = message.split(named, 1)[1] if named in message else message
        shown = about
        while shown and shown not in present:
            shown = shown[:-1]
        if shown:
            marks.setdefault(shown, []).append(text)
        else:
            unplaced.append(message)
    return marks, unplaced


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
    if config.errors:  # a configuration that does not validate, shown all the same (config show)
        doc["errors"] = [message for _path, message in config.errors]
        doc["error_paths"] = [format_path(path) if path is not None else None for path, _message in config.errors]
    doc.update(extra or {})
    return json.dumps(doc, indent=2, default=str, sort_keys=False)
