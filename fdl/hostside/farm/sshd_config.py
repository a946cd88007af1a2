"""Read an sshd configuration the way sshd does, as far as a farm door cares.

Shared by the host doctor and the `fdl_join_door` role, which runs it on the
host: host-side (fdl/hostside/), standard library only. It never needs root and never runs sshd: it follows
`Include` globs (sorted, relative to the main file's directory, as sshd
does), tracks `Match` context per file (a Match block ends with the file that
opened it), and records, in the order sshd reads them, the top-level
directives the door depends on.

`virtual` lets a caller ask "what if my drop-in were installed at PATH with
these lines?": the file is read in at its sorted place wherever an Include
glob matches PATH, which is also how we learn whether sshd would read it at all.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from dataclasses import dataclass, field

MAX_DEPTH = 16
_LINE_RE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9]*)(?:\s*=\s*|\s+)(.*?)\s*$")
# Keywords the door's Match block sets: a top-level value read before it wins (sshd keeps the first).
DOOR_KEYWORDS = ("passwordauthentication", "kbdinteractiveauthentication", "authenticationmethods",
                 "allowtcpforwarding", "permitopen", "allowstreamlocalforwarding", "gatewayports",
                 "permittunnel", "x11forwarding", "allowagentforwarding", "permittty", "permituserrc",
                 "forcecommand", "disableforwarding")
# The host keys sshd loads when the configuration names none (sshd_config(5), HostKey).
DEFAULT_HOST_KEYS = ("/etc/ssh/ssh_host_rsa_key", "/etc/ssh/ssh_host_ecdsa_key", "/etc/ssh/ssh_host_ed25519_key")


@dataclass(frozen=True)
class Directive:
    keyword: str  # lower case
    value: str
    file: str
    line: int
    in_match: bool


@dataclass
class SshdConfigScan:
    main: str
    directives: list[Directive] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    virtual_read: bool = False  # the virtual file was reached through an Include

    def top(self, keyword: str, *, exclude: tuple[str, ...] = ()) -> list[Directive]:
        return [d for d in self.directives
                if d.keyword == keyword and not d.in_match and d.file not in exclude]

    def ports(self, *, exclude: tuple[str, ...] = ()) -> list[int]:
        out: list[int] = []
        for d in self.top("port", exclude=exclude):
            if d.value.isascii() and d.value.isdigit() and int(d.value) not in out:
                out.append(int(d.value))
        return out

    def subsystem(self, name: str) -> str | None:
        for d in self.top("subsystem"):
            parts = d.value.split()
            if parts and parts[0] == name:
                return " ".join(parts[1:]) or None
        return None

    def authorized_keys_files(self) -> list[str] | None:
        found = self.top("authorizedkeysfile")
        return found[0].value.split() if found else None

    def host_key_files(self) -> list[str]:
        """The private host key files sshd serves (HostKey lines, else sshd's defaults), absolute."""
        found = [d.value for d in self.top("hostkey") if d.value]
        if not found:
            return list(DEFAULT_HOST_KEYS)
        base = os.path.dirname(self.main)
        return [os.path.join(base, os.path.expanduser(p)) for p in found]

    def public_host_keys(self) -> list[str]:
        """`TYPE BLOB` of each host key sshd serves, read from its `.pub` beside it (world-readable, unlike the
        private key); keys whose public half cannot be read are left out."""
        out = []
        for path in self.host_key_files():
            try:
                with open(path + ".pub", encoding="ascii") as handle:
                    fields = handle.read(16384).split()
            except (OSError, UnicodeDecodeError):
                continue
            if len(fields) >= 2 and fields[0].startswith(("ssh-", "ecdsa-", "sk-")):
                key = f"{fields[0]} {fields[1]}"
                if key not in out:
                    out.append(key)
        return out

    def shadowing(self, path: str) -> list[Directive]:
        """Top-level door keywords read before the file at path: sshd keeps them over its Match block."""
        out = []
        for d in self.directives:
            if d.file == path:
                break
            if not d.in_match and d.keyword in DOOR_KEYWORDS:
                out.append(d)
        return out


def _directive(raw: str) -> tuple[str, str] | None:
    text = raw.strip()
    if not text or text.startswith("#"):
        return None
    m = _LINE_RE.match(text)
    if not m:
        return None
    value = m.group(2)
    if " #" in value:  # sshd allows trailing comments after arguments
        value = value.split(" #", 1)[0].rstrip()
    return m.group(1).lower(), value.strip()


def scan(main: str, *, virtual: tuple[str, list[str]] | None = None, replace: bool = True) -> SshdConfigScan:
    """Scan main and everything it includes.

    virtual=(PATH, LINES): treat PATH as existing with LINES (an installed
    copy of it on disk is ignored when replace is true).
    """
    result = SshdConfigScan(main=os.path.abspath(main))
    base = os.path.dirname(result.main)
    vpath = os.path.abspath(virtual[0]) if virtual else None

    def read(path: str) -> list[str] | None:
        if vpath is not None and path == vpath:
            result.virtual_read = True
            return list(virtual[1])  # type: ignore[index]
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                return handle.read().splitlines()
        except OSError:
            result.unreadable.append(path)
            return None

    def expand(pattern: str) -> list[str]:
        pattern = os.path.expanduser(pattern)
        if not os.path.isabs(pattern):
            pattern = os.path.join(base, pattern)
        paths = set(glob.glob(pattern))
        if vpath is not None:
            if replace:
                paths.discard(vpath)
            if fnmatch.fnmatchcase(vpath, pattern):
                paths.add(vpath)
        return sorted(paths)

    def walk(path: str, depth: int, in_match: bool) -> None:
        lines = read(path)
        if lines is None:
            return
        result.files.append(path)
        matched = in_match
        for number, raw in enumerate(lines, start=1):
            parsed = _directive(raw)
            if parsed is None:
                continue
            keyword, value = parsed
            if keyword == "match":  # recorded too, so a file of Match blocks still has a place in the order
                result.directives.append(Directive(keyword, value, path, number, in_match))
                matched = value.lower() != "all" or in_match
                continue
            if keyword == "include":
                if depth >= MAX_DEPTH:
                    continue
                for pattern in value.split():
                    for included in expand(pattern):
                        walk(included, depth + 1, matched)
                continue
            result.directives.append(Directive(keyword, value, path, number, matched))

    walk(result.main, 0, False)
    return result
