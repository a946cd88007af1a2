"""What a message may show of a URL: never its userinfo (`https://user:password@host/...`).

`strip_userinfo(text)` replaces the userinfo of every URL in a text with `<redacted>`, except a bare login
name on a scheme that logs in with ssh (`rsync://op@host:/tree`, `ssh://`, `sftp://`, `sshfs://`,
`git+ssh://`), which is no secret and is how a worker names its door. Every error that echoes a URL a user
gave passes through it (the command boundary, fdl.cli.main, runs every message through it as well), and
`fdl config show` masks URLs with the same rule (fdl.config.masking).

Standard library only, Python 3.8 compatible: code on managed hosts may echo URLs too.
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"
# scheme://userinfo@host: the userinfo is everything up to the last '@' before the authority ends.
URL_RE = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://)([^\s/?#]*)@")
LOGIN_SCHEMES = frozenset({"ssh", "rsync", "sftp", "sshfs", "git+ssh", "ssh+git", "scp"})


def _userinfo(match: re.Match[str]) -> str:
    scheme, userinfo = match.group(1), match.group(2)
    if ":" not in userinfo and scheme[:-3].lower() in LOGIN_SCHEMES:
        return match.group(0)
    return f"{scheme}{REDACTED}@"


def strip_userinfo(text: str) -> str:
    """`text` with the userinfo of every URL in it replaced: `https://<redacted>@host/...`."""
    return URL_RE.sub(_userinfo, text) if "@" in text else text
