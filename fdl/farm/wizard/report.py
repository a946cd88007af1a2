"""Report: what the wizard did, as typed records. The CLI renders them for a person; `to_dict()` is the JSON
twin, carrying the same data (secrets as file paths, never their contents)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from fdl.farm.wizard.shape import Origins, Shape
from fdl.hostside.checks.report import CheckResult
from fdl.hostside.farm.authorized_keys import PermissionIssue
from fdl.hostside.farm.doors import TITLES


def spell_path(path: Path | str, cwd: Path) -> str:
    """How a path is spelled for a person: relative to where they stand when it is below it."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(cwd.resolve()))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Files:
    """The paths of what the wizard wrote (cloud_init and overlay_snippet: only when written)."""

    farm_dir: str
    key: str
    public_key: str
    token: str
    worker_yml: str
    dropin: str
    authorized_keys_line: str
    selftest: str
    gitignore: str
    overlay: str
    join_door_vars: str  # the fdl_join_door role's variables for the privileged step
    cloud_init: str | None = None
    overlay_snippet: str | None = None
    known_hosts: str | None = None  # the door's host keys, for the worker's join.known_hosts

    def to_dict(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {
            "farm_dir": self.farm_dir, "key": self.key, "public_key": self.public_key, "token": self.token,
            "worker_yml": self.worker_yml, "dropin": self.dropin, "authorized_keys_line": self.authorized_keys_line,
            "selftest": self.selftest, "gitignore": self.gitignore, "join_door_vars": self.join_door_vars,
            "cloud_init": self.cloud_init, "overlay": self.overlay, "known_hosts": self.known_hosts}
        if self.overlay_snippet is not None:
            out["overlay_snippet"] = self.overlay_snippet
        return out


class CredentialAction(StrEnum):
    CREATED = "created"
    REUSED = "reused"
    ROTATED = "rotated"


@dataclass(frozen=True)
class CredentialsReport:
    action: CredentialAction
    fingerprint: str
    key: str
    public_key: str
    token: str  # the token file's path

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action.value, "fingerprint": self.fingerprint, "key": self.key,
                "public_key": self.public_key, "token": self.token}


class OverlayAction(StrEnum):
    CREATED = "created"  # a new fdl.LABEL.yml
    UNCHANGED = "unchanged"  # it already names a token file
    TOKEN_REWRITTEN = "token-rewritten"  # its literal token: line became token_file: (nothing else changed)
    SNIPPET = "snippet"  # left alone; the snippet to paste was written beside the farm


@dataclass(frozen=True)
class OverlayReport:
    path: str
    action: OverlayAction
    message: str
    command: str | None = None  # created: the cluster command named after the crate
    snippet: str | None = None  # snippet: where it was written
    snippet_text: str | None = None  # snippet: its text (it names the token file; no secret)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "action": self.action.value}
        if self.action == OverlayAction.CREATED:
            out["command"] = self.command
        elif self.action == OverlayAction.SNIPPET:
            out.update(snippet=self.snippet, snippet_text=self.snippet_text)
        out["message"] = self.message
        return out


class KeyAction(StrEnum):
    NOT_INSTALLED = "not-installed"
    ALREADY_PRESENT = "already-present"  # not asked to install, and the exact line is there
    OUTDATED = "outdated"  # not asked to install, and the farm key is there with other options
    ADDED = "added"
    REPLACED = "replaced"
    UNCHANGED = "unchanged"  # installed, and the file already held exactly that line
    JAILED = "jailed"  # door a: the line goes to the jailed account's own file (a setup step)

    @property
    def written(self) -> bool:
        """This run installed the line (so the JSON says how many old lines went)."""
        return self in (KeyAction.ADDED, KeyAction.REPLACED, KeyAction.UNCHANGED)


@dataclass(frozen=True)
class Listening:
    """What a TCP connect to the door found after the line went in."""

    host: str
    port: int
    answering: bool
    banner: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "answering": self.answering, "banner": self.banner}


@dataclass(frozen=True)
class Unconfined:
    """Door a: the farm key line removed from the controller account's key file."""

    path: str
    line: int
    removed: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "removed": self.removed}


@dataclass(frozen=True)
class AuthorizedKeysReport:
    path: str
    action: KeyAction
    installed: bool  # the farm key is in the file (this run or before)
    line: int | None = None
    permissions: tuple[PermissionIssue, ...] = ()
    permissions_fixed: bool = False
    listening: Listening | None = None
    removed_old: int = 0  # written: other lines of ours that went (duplicates, the rotated-out key)
    removed_unconfined: Unconfined | None = None  # jailed only

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path, "installed": self.installed, "action": self.action.value, "line": self.line,
            "permissions": [i.to_dict() for i in self.permissions], "permissions_fixed": self.permissions_fixed,
            "listening": self.listening.to_dict() if self.listening else None}
        if self.action.written:
            out["removed_old"] = self.removed_old
        if self.action == KeyAction.JAILED:
            out["removed_unconfined"] = self.removed_unconfined.to_dict() if self.removed_unconfined else None
        return out


@dataclass(frozen=True)
class Step:
    """One setup step on the controller box: a title and the command to type (done: already carried out)."""

    n: int
    title: str
    command: str | None = None
    done: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "title": self.title, "command": self.command, "done": self.done}


@dataclass(frozen=True)
class FarmReport:
    """What the wizard did: the human report and its JSON twin carry the same data."""

    label: str
    shape: Shape
    shape_from: Origins
    farm_dir: Path
    files: Files
    credentials: CredentialsReport
    overlay: OverlayReport
    authorized_keys: AuthorizedKeysReport
    doctor: tuple[CheckResult, ...]
    steps: tuple[Step, ...]
    worker_steps: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def door(self) -> str:
        return self.shape.door

    def to_dict(self) -> dict[str, Any]:
        shape = self.shape
        return {
            "label": self.label,
            "door": shape.door,
            "door_title": TITLES[shape.door],
            "controller": {"user": shape.user, "host": shape.host, "door_port": shape.door_port,
                           "training_port": shape.controller_port, "ssh": shape.controller},
            "served": shape.served,
            "shape_from": self.shape_from.to_dict(),
            "farm_dir": str(self.farm_dir),
            "files": self.files.to_dict(),
            "credentials": self.credentials.to_dict(),
            "overlay": self.overlay.to_dict(),
            "authorized_keys": self.authorized_keys.to_dict(),
            "doctor": [{"name": c.name, "status": c.status, "message": c.message, "hint": c.hint}
                       for c in self.doctor],
            "steps": [s.to_dict() for s in self.steps],
            "worker_steps": list(self.worker_steps),
            "notes": list(self.notes),
        }
