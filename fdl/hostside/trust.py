"""Whose files fdl believes: git's `safe.directory` rule, for what fdl finds by looking around rather than by
being told.

Other accounts on the same box are attackers. A file fdl finds by walking up from the working directory (a
project's fdl.yml, its env overlays, its `.fdl/`) or loads from the project (its `libtorch/`, whose libraries
`fdl probe` opens) configures, or runs code as, whoever runs fdl: root included. So such a file counts only
when nobody else can have written it or can swap it:

- the file (or directory) is owned by you or by root, and neither group nor others may write it (a group
  that is the owner's own private group, as Debian and Ubuntu make one per account and umask 002 opens to it,
  counts as nobody else);
- the directory holding it is owned by you or by root, and neither group nor others may write it, unless
  that directory is sticky (`/tmp`): there nobody can rename or remove what you own, so a file of yours in
  `/tmp` counts, and another account's does not;
- a symbolic link is judged as itself and then as what it points at.

Below a project's `libtorch/`, every directory down to the `lib/` a variant's libraries load from must be
yours or root's and closed to group and others (no sticky exception: a library anyone could add is one anyone
could have added).

"You" is the effective user; as root under sudo, the account that ran sudo too (`SUDO_UID`), as git does.

The override, for a directory you trust although another account owns it or can write it (a team's shared
checkout): list it in `$XDG_CONFIG_HOME/fdl/safe-directories` (default ~/.config/fdl/), one directory a line
(`#` comments; `DIR/*` also covers everything below DIR), a file that only you (or root) can write in a
directory that only you (or root) can write, or list it in FDL_SAFE_DIRECTORIES (separated by ':'). A listed
directory is believed whoever owns it, and so is what it holds.

A served directory (`fdl publish --to DIR`) has its own rule, `served_refusal`: workers across a fleet build
and run what it holds, so it and its parents up to your home (or up to a directory root owns; as root, up to
its home or `/`) must be yours or root's and closed to group and others; a sticky parent such as `/tmp` is
the one exception. No list overrides it.

Standard library only, Python 3.8 compatible (this runs on managed hosts too); nothing here raises: each
check returns the reason for a refusal, or None, and the caller raises its own error with it.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path
from typing import Mapping

from .envvars import FDL_SAFE_DIRECTORIES, read
from .paths import config_dir

#: the file of safe directories, in fdl's configuration directory
SAFE_FILE = "safe-directories"
MAX_SAFE_FILE = 64 * 1024


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def trusted_uids(environ: Mapping[str, str] | None = None) -> frozenset[int]:
    """The owners whose files count as this user's: the effective user and root, and under sudo as root the
    account that ran sudo (SUDO_UID), as git counts them."""
    euid = os.geteuid()
    uids = {euid, 0}
    if euid == 0:
        text = _environ(environ).get("SUDO_UID", "").strip()
        if text.isdigit():
            uids.add(int(text))
    return frozenset(uids)


def owner_name(uid: int) -> str:
    """`name (uid N)`, or `uid N` when the password database has no such account."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _not_you() -> str:
    """How a refusal says the owner is not one fdl believes: `neither you (NAME) nor root`."""
    euid = os.geteuid()
    return "not root (you)" if euid == 0 else f"neither you ({owner_name(euid)}) nor root"


def _private_group(uid: int, gid: int) -> bool:
    """Whether gid is uid's own private group (Debian's user private groups: the account's primary group, of
    the same name, with no other member), where a group-writable mode (umask 002) lets nobody else write."""
    try:
        user, group = pwd.getpwuid(uid), grp.getgrgid(gid)
    except KeyError:
        return False
    return user.pw_gid == gid and group.gr_name == user.pw_name and all(m == user.pw_name for m in group.gr_mem)


def open_bits(info: os.stat_result) -> int:
    """The write bits of info through which another account may write: the others' bit, and the group's unless
    the group is the owner's private group."""
    bits = info.st_mode & 0o002
    if info.st_mode & 0o020 and not _private_group(info.st_uid, info.st_gid):
        bits |= 0o020
    return bits


def _open_to(info: os.stat_result) -> str:
    bits = open_bits(info)
    return " and ".join(name for bit, name in ((0o020, "group"), (0o002, "others")) if bits & bit)


# --------------------------------------------------------------------------- the override


def safe_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where this user lists the directories trusted whoever owns them: $XDG_CONFIG_HOME/fdl/safe-directories."""
    return config_dir(environ) / SAFE_FILE


def _parse_entries(text: str, home: str) -> list[str]:
    entries = []
    for raw in text.splitlines():
        entry = raw.strip()
        if not entry or entry.startswith("#"):
            continue
        if entry == "~" or entry.startswith("~/"):
            entry = home + entry[1:]
        if os.path.isabs(entry):
            entries.append(entry)
    return entries


def safe_directories(environ: Mapping[str, str] | None = None) -> tuple[list[str], str | None]:
    """(the safe directories this user listed, in FDL_SAFE_DIRECTORIES and the safe file; why the file was
    ignored, or None). The file counts only when it is a regular file that neither group nor others may write,
    owned by this user (or root), in a directory of the same kind: a list another account could edit would
    be theirs."""
    env = _environ(environ)
    home = env.get("HOME") or os.path.expanduser("~")
    entries = _parse_entries(read(FDL_SAFE_DIRECTORIES, env).replace(os.pathsep, "\n"), home)
    path = safe_file(env)
    uids = trusted_uids(env)
    try:
        info, parent = os.lstat(path), os.stat(path.parent)
    except OSError:
        return entries, None
    why = None
    if not stat.S_ISREG(info.st_mode):
        why = f"{path} is not a regular file"
    else:
        for what, st in ((path, info), (path.parent, parent)):
            if st.st_uid not in uids:
                why = f"{what} is owned by {owner_name(st.st_uid)}, not by you"
            elif open_bits(st):
                why = f"{what} can be written by {_open_to(st)} (mode {stat.S_IMODE(st.st_mode):04o})"
            if why:
                break
    if why is None:
        try:
            with open(path, "rb") as handle:
                entries += _parse_entries(handle.read(MAX_SAFE_FILE).decode("utf-8", "replace"), home)
        except OSError as exc:
            why = f"{path} cannot be read ({exc.strerror})"
    return entries, why


def is_safe(directory: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> bool:
    """Whether this user listed `directory` (or a `DIR/*` above it) as safe."""
    return _listed(directory, safe_directories(environ)[0])


def _listed(directory: str | os.PathLike[str], entries: list[str]) -> bool:
    real = os.path.realpath(directory)
    for entry in entries:
        below = entry.endswith("/*")
        base = os.path.realpath(entry[:-2] or "/") if below else os.path.realpath(entry)
        if real == base or (below and real.startswith(base.rstrip("/") + "/")):
            return True
    return False


def override_hint(directory: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> str:
    """What to do about a refusal in `directory`: the command that lists it as safe, or the other ways out."""
    path = safe_file(environ)
    ignored = safe_directories(environ)[1]
    listed = f"; note that {ignored}, so fdl ignores it" if ignored else ""
    return (f"if you trust {directory}, list it as safe: `mkdir -p {path.parent} && echo {directory} >> {path}` "
            f"(a file only you can write{listed}), or set {FDL_SAFE_DIRECTORIES}={directory}; otherwise remove "
            f"what another account put there, or run fdl below a directory of your own")


# --------------------------------------------------------------------------- found files


def _entry_problem(path: str, uids: frozenset[int], depth: int = 0) -> str | None:
    parent = os.path.dirname(path) or "."
    try:
        info = os.lstat(path)
        held = os.stat(parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path} cannot be inspected ({exc.strerror})"
    if info.st_uid not in uids:
        return f"{path} is owned by {owner_name(info.st_uid)}, which is {_not_you()}"
    owned = f"{path} (owned by {owner_name(info.st_uid)})"
    if held.st_uid not in uids:
        return f"{owned} is in {parent}, a directory owned by {owner_name(held.st_uid)}, which is {_not_you()}"
    if open_bits(held) and not held.st_mode & stat.S_ISVTX:
        return (f"{owned} is in {parent}, a directory {_open_to(held)} can write (mode "
                f"{stat.S_IMODE(held.st_mode):04o}), so another account could have put it there or swapped it")
    if stat.S_ISLNK(info.st_mode):
        target = os.path.realpath(path)
        if depth > 0 or target == path:
            return None
        problem = _entry_problem(target, uids, depth + 1)
        return f"{path} links to {target}: {problem}" if problem else None
    if open_bits(info):
        return f"{path} can be written by {_open_to(info)} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def entry_refusal(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> str | None:
    """Why fdl may not believe `path` (a file or directory it found in its parent directory), or None.

    None also when the path does not exist, and when its directory is listed as safe."""
    text = os.path.abspath(os.fspath(path))
    problem = _entry_problem(text, trusted_uids(environ))
    if problem is None or is_safe(os.path.dirname(text), environ):
        return None
    return problem


def tree_refusal(top: str | os.PathLike[str], leaf: str | os.PathLike[str],
                 environ: Mapping[str, str] | None = None) -> str | None:
    """Why fdl may not load from `leaf`, a directory below `top` (a project's libtorch/), or None.

    `top` is judged as a found entry (entry_refusal); every directory below it down to `leaf`, and `leaf`
    itself, must be owned by this user or root and closed to group and others. A safe-listed directory
    holding `top` lifts all of it."""
    top_text, leaf_text = os.path.abspath(os.fspath(top)), os.path.abspath(os.fspath(leaf))
    if is_safe(os.path.dirname(top_text), environ):
        return None
    uids = trusted_uids(environ)
    problem = _entry_problem(top_text, uids)
    if problem is not None:
        return problem
    real_top = os.path.realpath(top_text)
    real_leaf = os.path.realpath(leaf_text)
    if real_leaf != real_top and not real_leaf.startswith(real_top.rstrip("/") + "/"):
        return f"{leaf_text} resolves to {real_leaf}, outside {top_text}"
    chain = []
    here = real_leaf
    while here != real_top:
        chain.append(here)
        here = os.path.dirname(here)
    for directory in reversed(chain):
        try:
            info = os.stat(directory)
        except OSError:
            return None  # nothing there to load
        if info.st_uid not in uids:
            return f"{directory} is owned by {owner_name(info.st_uid)}, which is {_not_you()}"
        if open_bits(info):
            return (f"{directory} can be written by {_open_to(info)} (mode "
                    f"{stat.S_IMODE(info.st_mode):04o})")
    return None


# --------------------------------------------------------------------------- a served directory


def served_refusal(path: str | os.PathLike[str], home: str | os.PathLike[str] | None,
                   environ: Mapping[str, str] | None = None) -> str | None:
    """Why `path` may not be served to a fleet (`fdl publish --to`), or None.

    The directory and each parent up to `home` or the first directory root owns (both included; as root, up to
    `home` or `/`) must be owned by this user or root and closed to group and others; a parent may be open only
    when it is sticky (`/tmp`), where nobody can rename what you own. Parts of `path` that do not exist yet are
    skipped (publish makes them, closed). No safe-directories entry lifts this: a served tree is what every
    worker builds and runs."""
    uids, euid = trusted_uids(environ), os.geteuid()
    served = os.path.realpath(os.fspath(path))
    stop = os.path.realpath(os.fspath(home)) if home else None
    here = served
    while True:
        try:
            info = os.stat(here)
        except FileNotFoundError:
            info = None
        except OSError as exc:
            return f"{here} cannot be inspected ({exc.strerror})"
        if info is not None:
            what = f"the served directory {here}" if here == served else \
                f"{here}, a parent of the served directory {served},"
            if info.st_uid not in uids:
                return f"{what} is owned by {owner_name(info.st_uid)}, which is {_not_you()}"
            if open_bits(info) and (here == served or not info.st_mode & stat.S_ISVTX):
                return f"{what} can be written by {_open_to(info)} (mode {stat.S_IMODE(info.st_mode):04o})"
            if here == stop or (info.st_uid == 0 and euid != 0):  # as root, a directory of root's is one's own
                return None
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent
