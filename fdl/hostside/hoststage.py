"""Lay out one launcher run on a host: the host-side half of staging.

Host-side (fdl/hostside/), and only there: it runs on the managed host, never on the launching machine.
The Ansible module flodl.fdl.fdl_dispatch_stage calls `stage()` for the flodl.fdl.dispatch playbook, the
way `fdl @cluster CMD` stages every remote host (fdl/launch/dispatch.py) and the way an Ansible user
stages one.

The layout, under `root` (always given: the module's default is fdl.hostside.paths.LAUNCH_IN_HOME, ~/.flodl/launch):
`supervisor.py` (rewritten only when its content differs), `bin/BIN_DIR/` (kept between runs: rsync then
sends only what changed) and `runs/RUN_ID/` with the host's rank spec `spec.json` (0600) and `logs/`. It
starts nothing: the run's live session is ssh.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from . import supervisor
from .fsio import atomic_write

FIELDS = ("run_id", "bin_dir", "program")  # plain names: never a path that could leave the root


class StageError(Exception):
    """The inputs cannot be staged (a name that is a path, nothing to run)."""


def file_sha256(path: str) -> str | None:
    """The hex SHA-256 of a file, or None when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def plan(params: dict[str, Any]) -> dict[str, Any]:
    """Where everything goes and the spec the supervisor reads, from the inputs (nothing written)."""
    for name in FIELDS:
        value = params.get(name) or ""
        if "/" in value or value in (".", ".."):
            raise StageError(f"{name} must be a plain name, got {value!r}")
    if not params.get("root"):
        raise StageError("root is required: the directory to lay the run out under")
    root = os.path.abspath(os.path.expanduser(params["root"]))
    run_dir = os.path.join(root, "runs", params["run_id"])
    bin_dir = os.path.join(root, "bin", params["bin_dir"]) if params.get("bin_dir") else ""
    program = params.get("program") or ""
    argv = ([os.path.join(bin_dir, program)] if program else []) + [str(w) for w in params.get("command") or []]
    if not argv:
        raise StageError("nothing to run: give program or command")
    spec = {"argv": argv, "cwd": run_dir, "log_dir": os.path.join(run_dir, "logs"), "label": params["label"],
            "grace_s": float(params.get("grace_s", 10.0)), "watch_stdin": True,
            "ranks": [{"rank": int(r["rank"]), "env": {str(k): str(v) for k, v in (r.get("env") or {}).items()}}
                      for r in params["ranks"]]}
    return {"root": root, "run_dir": run_dir, "bin_dir": bin_dir, "supervisor": os.path.join(root, "supervisor.py"),
            "spec_path": os.path.join(run_dir, "spec.json"), "program": program, "spec": spec}


def supervisor_source() -> str:
    """The rank supervisor's source, as this process has it (inside an Ansible module: from its payload)."""
    loader = getattr(supervisor, "__loader__", None)
    source = loader.get_source(supervisor.__name__) if loader is not None and hasattr(loader, "get_source") else None
    if source is None:
        with open(supervisor.__file__, encoding="utf-8") as handle:
            source = handle.read()
    return str(source)


def stage(params: dict[str, Any], check_mode: bool = False) -> tuple[bool, dict[str, Any]]:
    """Write the layout; returns (changed, {run_dir, supervisor, spec, bin_dir, program_current})."""
    where = plan(params)
    changed = False
    if not check_mode:
        source = supervisor_source()
        for directory, mode in ((os.path.join(where["run_dir"], "logs"), 0o700), (where["bin_dir"], 0o755)):
            if directory and not os.path.isdir(directory):
                os.makedirs(directory, mode=mode, exist_ok=True)
                changed = True
        try:
            with open(where["supervisor"], encoding="utf-8") as handle:
                current = handle.read()
        except OSError:
            current = None
        if current != source:
            atomic_write(where["supervisor"], source.encode("utf-8"), 0o644)
            changed = True
        atomic_write(where["spec_path"], (json.dumps(where["spec"], indent=1) + "\n").encode("utf-8"), 0o600)
    wanted = params.get("program_sha256") or ""
    program_current = bool(where["program"] and wanted) and \
        file_sha256(os.path.join(where["bin_dir"], where["program"])) == wanted
    return changed, {"run_dir": where["run_dir"], "supervisor": where["supervisor"], "spec": where["spec_path"],
                     "bin_dir": where["bin_dir"], "program_current": program_current}
