"""Admission tokens in configuration: token files, strength, and literal tokens in files people commit.

A token is the one shared secret of a run (docs/controller.md). It belongs in a 0600 file, named by
`token_file:` (in `cluster.controller.join` or the `join:` block; a relative path resolves against the file
that sets it), rather than written into fdl.yml or an overlay, which people commit and copy. So:

- a token file is read only when it is a regular file owned by this user or root that neither group nor
  others may read or write (sshd's rule for keys), holding one token on one line;
- a token of fewer than 128 bits is refused, wherever it comes from, with the command that mints a good one;
- a configuration file that holds a literal token draws a warning when git tracks it (`git ls-files
  --error-unmatch`, read by its exit status) or when group or others may read it.

Standard library only: the inventory plugin carries fdl's configuration reader into the collection.
"""

from __future__ import annotations

import math
import os
import shutil
import stat
import subprocess
from pathlib import Path

MIN_BITS = 128
MINT_COMMAND = "python3 -c 'import secrets; print(secrets.token_hex(32))'"
MAX_TOKEN_FILE = 4096
_HEX = frozenset("0123456789abcdefABCDEF")


def _period(token: str) -> int:
    """The length of the shortest pattern `token` repeats (its own length when it repeats none)."""
    for size in range(1, len(token)):
        if token == (token[:size] * (len(token) // size + 1))[:len(token)]:
            return size
    return len(token)


def estimated_bits(token: str) -> float:
    """An upper bound on the entropy of `token`: its length, or the length of the pattern it repeats, times log2
    of the alphabet its characters suggest (hex digits 16; otherwise the union of the classes present: lower
    case 26, upper case 26, digits 10, the rest 33). A person's password reaches it only by being long; OS
    entropy written as hex or base64 reaches it exactly."""
    if not token:
        return 0.0
    if all(c in _HEX for c in token) and not (any(c.islower() for c in token) and any(c.isupper() for c in token)):
        size = 16
    else:
        size = (26 * any(c.islower() for c in token) + 26 * any(c.isupper() for c in token)
                + 10 * any(c.isdigit() for c in token) + 33 * any(not c.isalnum() for c in token))
    return _period(token) * math.log2(max(size, 2))


def strength_problem(token: str) -> str | None:
    """Why a token is too weak to admit anyone with (None: strong enough)."""
    bits = estimated_bits(token)
    if bits >= MIN_BITS:
        return None
    return (f"a {len(token)}-character token carries at most {int(bits)} bits, and fdl needs at least {MIN_BITS} "
            f"(32 hex digits of OS entropy; mint one with: {MINT_COMMAND})")


def read_token_file(path: Path) -> str:
    """The token in a file `token_file:` names. Raises ValueError saying what is wrong and how to mend it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ValueError(f"the token file {path} cannot be opened ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"the token file {path} is not a regular file")
        me = os.getuid()
        if info.st_uid not in (me, 0):
            raise ValueError(f"the token file {path} belongs to uid {info.st_uid}, not to you (uid {me}) or root: "
                             f"whoever owns it chooses the token")
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise ValueError(f"the token file {path} is {stat.S_IMODE(info.st_mode):04o}: group or others may "
                             f"read or change it (chmod 600 {path}, and mint a new token if others could read it)")
        raw = handle.read(MAX_TOKEN_FILE + 1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"the token file {path} does not hold text") from None
    token = text.strip()
    if not token or len(raw) > MAX_TOKEN_FILE or any(c.isspace() for c in token):
        raise ValueError(f"the token file {path} does not hold one token (one line, no spaces)")
    return token


def tracked_by_git(path: Path) -> bool:
    """Whether git tracks `path` in the repository around it, by `git ls-files --error-unmatch`'s exit status
    (0: tracked; anything else: not tracked, no repository, or no git). The repository's fsmonitor hook is off
    (a cloned repository's configuration is not ours to run), and the caller's GIT_DIR and friends are ignored."""
    git = shutil.which("git")
    if git is None:
        return False
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    try:
        done = subprocess.run([git, "-c", "core.fsmonitor=false", "-C", str(path.parent), "ls-files",
                               "--error-unmatch", "--", path.name], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def literal_token_warning(path: Path, shown: str) -> str | None:
    """A warning for a configuration file that holds a literal token and is tracked by git or readable by
    group or others (None: neither)."""
    problems = []
    if tracked_by_git(path):
        problems.append("git tracks it, so every clone and its history carry the token")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0
    if mode & 0o044:
        problems.append(f"it is {mode:04o}, so other accounts on this box can read the token")
    if not problems:
        return None
    return (f"{shown} holds a literal join token and {' and '.join(problems)}. Move the token into a 0600 file "
            f"and name it with token_file: instead of token: (fdl join-config writes a farm's to "
            f".fdl/LABEL/token), then mint a new one if it was exposed.")
