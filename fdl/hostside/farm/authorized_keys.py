"""Edit one line of an authorized_keys file and leave every other byte alone.

Shared by `fdl join-config` and the `fdl_authorized_key` Ansible module, which
runs it on the host: host-side (fdl/hostside/), standard library and ..fsio.

The rules:

- A line's identity is its public key material (key type + base64 blob);
  options and comments do not count. "Our" lines are the ones carrying the
  farm's key (or a key being retired by a rotation); every other line is
  foreign and is kept byte for byte: comments, options, blank lines, CRLF
  endings, odd whitespace, lines fdl cannot parse, a missing final newline.
- Our line is replaced where it stands; a new one is appended (after adding
  the file's own line ending to a last line that lacks one).
- The file is rewritten atomically (..fsio.atomic_write): a temp file in the
  same directory, written, mode (and owner) set, fsynced, renamed over
  the old one, and the directory fsynced. A crash leaves the old file or the
  new one, never a mix.
- Nothing under /etc/ssh is edited, by name or through a symlink.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field

from ..fsio import atomic_write

FORBIDDEN_ROOT = "/etc/ssh"
_KEY_TYPE_RE = re.compile(rb"(?:ssh|ecdsa|sk)-[A-Za-z0-9@._-]+")
_BLOB_RE = re.compile(rb"[A-Za-z0-9+/]+={0,3}")


class AuthorizedKeysError(Exception):
    """An authorized_keys edit that must not happen (the message says why and what to do)."""


@dataclass(frozen=True)
class KeyIdentity:
    """The public key material of a line: what makes it 'the same key'."""

    type: str
    blob: str

    def __str__(self) -> str:
        return f"{self.type} {self.blob[:12]}...{self.blob[-8:]}"


# --------------------------------------------------------------------------- parsing


def parse_public_key(text: str) -> KeyIdentity:
    """Identity of a public key as ssh-keygen writes it (`TYPE BLOB [COMMENT]`), or of a full key line."""
    identity = line_identity(text.strip().encode("utf-8", "surrogateescape"))
    if identity is None:
        raise AuthorizedKeysError(f"not an OpenSSH public key: {text[:40]!r}")
    return identity


def _is_type(token: bytes) -> bool:
    return bool(_KEY_TYPE_RE.fullmatch(token))


def _split_options(rest: bytes) -> tuple[bytes, bytes]:
    """Split `OPTIONS REST` at the first unquoted blank (quotes may hold blanks and \\")."""
    quoted = False
    i = 0
    while i < len(rest):
        ch = rest[i:i + 1]
        if quoted and ch == b"\\" and i + 1 < len(rest):
            i += 2
            continue
        if ch == b'"':
            quoted = not quoted
        elif not quoted and ch in (b" ", b"\t"):
            return rest[:i], rest[i:]
        i += 1
    return rest, b""


def line_identity(content: bytes) -> KeyIdentity | None:
    """The key a line (without its line ending) carries, or None for comments, blanks and noise."""
    text = content.lstrip(b" \t")
    if not text or text.startswith(b"#"):
        return None
    fields = text.split(None, 2)
    if len(fields) >= 2 and _is_type(fields[0]):
        key_type, blob = fields[0], fields[1]
    else:
        _options, rest = _split_options(text)
        fields = rest.split(None, 2)
        if len(fields) < 2 or not _is_type(fields[0]):
            return None
        key_type, blob = fields[0], fields[1]
    if not _BLOB_RE.fullmatch(blob):
        return None
    return KeyIdentity(key_type.decode("ascii"), blob.decode("ascii"))


@dataclass(frozen=True)
class Line:
    content: bytes  # without the line ending
    eol: bytes  # b"\n", b"\r\n" or b"" (last line without a newline)

    @property
    def raw(self) -> bytes:
        return self.content + self.eol


def split_lines(data: bytes) -> list[Line]:
    """The lines of a file, each with its own ending; joining their raw bytes gives data back.

    Only \n ends a line (as for sshd); a \r before it makes a CRLF ending, a lone \r is content.
    """
    parts = data.split(b"\n")
    out = [Line(part[:-1], b"\r\n") if part.endswith(b"\r") else Line(part, b"\n") for part in parts[:-1]]
    if parts[-1]:
        out.append(Line(parts[-1], b""))
    return out


def file_eol(lines: list[Line]) -> bytes:
    """The file's own line ending: CRLF when most of its lines use it, else LF."""
    crlf = sum(1 for line in lines if line.eol == b"\r\n")
    lf = sum(1 for line in lines if line.eol == b"\n")
    return b"\r\n" if crlf > lf else b"\n"


# --------------------------------------------------------------------------- planning (pure)


@dataclass(frozen=True)
class Edit:
    """The outcome of planning an edit: the new bytes and what happened."""

    data: bytes
    action: str  # "added" | "replaced" | "unchanged" | "removed" | "absent"
    removed: int = 0  # how many of our other lines (duplicates, retired keys) went away


def plan_install(data: bytes, line: str, key: KeyIdentity, retire: tuple[KeyIdentity, ...] = ()) -> Edit:
    """Put `line` (carrying `key`) into the file content `data`, retiring lines of `retire` keys."""
    new = line.encode("utf-8", "surrogateescape")
    if b"\n" in new or b"\r" in new:
        raise AuthorizedKeysError("an authorized_keys line cannot contain a line break")
    if line_identity(new) != key:
        raise AuthorizedKeysError(f"the line to install does not carry the key {key}")
    lines = split_lines(data)
    ours = [i for i, ln in enumerate(lines) if line_identity(ln.content) == key]
    retired = [i for i, ln in enumerate(lines) if line_identity(ln.content) in retire and i not in ours]
    slot = ours[0] if ours else (retired[0] if retired else None)
    drop = set(ours[1:] if ours else []) | set(retired)
    if slot is not None:
        drop.discard(slot)
        out = []
        for i, ln in enumerate(lines):
            if i == slot:
                out.append(new + ln.eol)
            elif i not in drop:
                out.append(ln.raw)
        result = b"".join(out)
        action = "unchanged" if result == data else "replaced"
        return Edit(result, action, removed=len(drop))
    eol = file_eol(lines)
    prefix = data if not lines or lines[-1].eol else data + eol
    return Edit(prefix + new + eol, "added")


def plan_remove(data: bytes, keys: tuple[KeyIdentity, ...]) -> Edit:
    """Take every line carrying one of `keys` out of `data`; nothing else changes."""
    lines = split_lines(data)
    keep = [ln.raw for ln in lines if line_identity(ln.content) not in keys]
    result = b"".join(keep)
    if result == data:
        return Edit(data, "absent")
    return Edit(result, "removed", removed=len(lines) - len(keep))


def find_key(data: bytes, key: KeyIdentity) -> int | None:
    """1-based line number of the first line carrying key, or None."""
    for number, ln in enumerate(split_lines(data), start=1):
        if line_identity(ln.content) == key:
            return number
    return None


# --------------------------------------------------------------------------- paths and permissions


def under_forbidden_root(path: str) -> bool:
    """True when path (as written, or after resolving symlinks) lies under /etc/ssh."""
    spelled = os.path.normpath(os.path.abspath(os.path.expanduser(path)))
    resolved = os.path.realpath(spelled)
    return any(p == FORBIDDEN_ROOT or p.startswith(FORBIDDEN_ROOT + "/") for p in (spelled, resolved))


def refuse_forbidden(path: str) -> None:
    if under_forbidden_root(path):
        raise AuthorizedKeysError(
            f"{path} is under /etc/ssh, which fdl never edits: files there belong to the system's sshd "
            f"configuration and its package. Install the line with your configuration management, or point "
            f"AuthorizedKeysFile at a file the account owns."
        )


@dataclass
class PermissionIssue:
    """One path whose owner or mode sshd (StrictModes) or good practice objects to."""

    path: str
    mode: int
    want: int | None  # the mode to set, or None when chmod cannot help
    problem: str
    blocking: bool  # sshd refuses the key file while this stands
    fixable: bool  # this process can fix it
    command: str  # the exact fix a person would type

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "mode": f"{self.mode:04o}", "want": None if self.want is None else
                f"{self.want:04o}", "problem": self.problem, "blocking": self.blocking, "fixable": self.fixable,
                "command": self.command}


def _can_chmod(st: os.stat_result) -> bool:
    return os.geteuid() == 0 or st.st_uid == os.geteuid()


def _owner_ok(st: os.stat_result, uid: int) -> bool:
    return st.st_uid in (0, uid)


def check_permissions(path: str, *, uid: int, manage_parent: bool, home: str | None = None) -> list[PermissionIssue]:
    """What sshd would object to along path (the key file, its directory, the home above it).

    With manage_parent=False (an explicitly named key file) only the file itself
    is judged: its directory belongs to a layout the operator owns.
    """
    issues: list[PermissionIssue] = []
    checks: list[tuple[str, int, int, bool]] = [(path, 0o600, 0o077, False)]
    parent = os.path.dirname(os.path.abspath(path))
    if manage_parent:
        checks.append((parent, 0o700, 0o077, True))
        if home and os.path.abspath(home) != parent:
            checks.append((os.path.abspath(home), -1, 0o022, True))
    for where, want, loose_bits, is_dir in checks:
        try:
            st = os.stat(where)
        except FileNotFoundError:
            continue
        mode = stat.S_IMODE(st.st_mode)
        if not _owner_ok(st, uid):
            issues.append(PermissionIssue(
                where, mode, None, f"owned by uid {st.st_uid}, not by the account (uid {uid}) or root",
                blocking=True, fixable=False, command=f"sudo chown {uid} {where}"))
            continue
        if mode & loose_bits:
            writable = bool(mode & 0o022)
            target = (mode & ~0o022) if want == -1 else want
            spelled = "go-w" if want == -1 else f"{target:o}"
            problem = ("group- or world-writable: sshd ignores the key file" if writable else
                       "readable by others: keys stay private" if not is_dir else "open to others")
            issues.append(PermissionIssue(where, mode, target, problem, blocking=writable,
                                          fixable=_can_chmod(st), command=f"chmod {spelled} {where}"))
    return issues


def fix_permissions(issues: list[PermissionIssue]) -> None:
    """chmod what can be chmodded (directories now; the key file gets its mode at the rewrite)."""
    for issue in issues:
        if issue.fixable and issue.want is not None and os.path.isdir(issue.path):
            os.chmod(issue.path, issue.want)


# --------------------------------------------------------------------------- writing


@dataclass
class InstallResult:
    path: str
    action: str  # added | replaced | unchanged | removed | absent
    changed: bool
    line_number: int | None = None
    removed: int = 0
    created_parent: bool = False
    notes: list[str] = field(default_factory=list)


def _read(path: str) -> tuple[bytes, os.stat_result | None]:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise AuthorizedKeysError(f"{path} is not a regular file; refusing to replace it")
    except FileNotFoundError:
        return b"", None
    try:
        with open(path, "rb") as handle:
            st = os.fstat(handle.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise AuthorizedKeysError(f"{path} is not a regular file; refusing to replace it")
            return handle.read(), st
    except FileNotFoundError:
        return b"", None


def install_line(path: str, line: str, key: KeyIdentity, *, retire: tuple[KeyIdentity, ...] = (),
                 mode: int | None = 0o600, create_parent: bool = True, check: bool = False) -> InstallResult:
    """Install `line` into the authorized_keys file at path, touching only lines of key (and retire).

    mode: the file's mode after the rewrite; None keeps the existing mode (0600 for a new file).
    create_parent: create a missing parent directory (0700); when False a missing one is an error
    and the existing one is left exactly as found.
    check: plan only, write nothing.
    """
    refuse_forbidden(path)
    if os.path.islink(path):  # a key file kept elsewhere (dotfiles): edit the file, keep the link
        path = os.path.realpath(path)
    parent = os.path.dirname(os.path.abspath(path))
    created_parent = False
    if not os.path.isdir(parent):
        if not create_parent:
            raise AuthorizedKeysError(
                f"the directory {parent} does not exist; with an explicitly named key file fdl leaves that "
                f"directory to you. Create it (with the owner and mode your sshd expects), then run again.")
        if not check:
            os.makedirs(parent, mode=0o700, exist_ok=True)
            os.chmod(parent, 0o700)
        created_parent = True
    data, st = _read(path)
    edit = plan_install(data, line, key, retire)
    result = InstallResult(path, edit.action, edit.action != "unchanged", removed=edit.removed,
                           created_parent=created_parent)
    new_mode = mode if mode is not None else (stat.S_IMODE(st.st_mode) if st else 0o600)
    mode_change = st is not None and stat.S_IMODE(st.st_mode) != new_mode
    if (result.changed or mode_change) and not check:
        owner = (st.st_uid, st.st_gid) if st is not None else None
        atomic_write(path, edit.data, new_mode, owner)
    result.changed = result.changed or mode_change
    result.line_number = find_key(edit.data, key)
    return result


def remove_keys(path: str, keys: tuple[KeyIdentity, ...], *, check: bool = False) -> InstallResult:
    """Take the lines of keys out of path (absent file: nothing to do)."""
    refuse_forbidden(path)
    if os.path.islink(path):
        path = os.path.realpath(path)
    data, st = _read(path)
    edit = plan_remove(data, keys)
    result = InstallResult(path, edit.action, edit.action == "removed", removed=edit.removed)
    if result.changed and not check and st is not None:
        atomic_write(path, edit.data, stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid))
    return result
