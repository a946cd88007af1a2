"""What the fdl_authorized_key module does: one farm door's key line put into (or taken out of) a key file.

The line is composed by doors.key_line and written by authorized_keys.install_line (every other line kept byte
for byte, the file rewritten atomically); an account named as `owner` gets the file and the directory this call
created. The same code `fdl join-config` uses, shipped to hosts as module_utils.
"""

from __future__ import annotations

import os
import pwd
from typing import Any

from .authorized_keys import check_permissions, fix_permissions, install_line, parse_public_key, remove_keys
from .doors import key_line


def put_key(path: str, public_key: str, *, door: str, label: str, controller_port: int, served: str | None,
            rrsync: str, retired_keys: list[str], create_parent: bool, mode: str, owner: str | None,
            repair: bool, state: str, check: bool) -> dict[str, Any]:
    """The module's result (changed, action, line_number, removed, line, path; permissions with `repair`).

    AuthorizedKeysError, DoorError or ValueError naming what is wrong with the input or the file; OSError when
    the account may not write there."""
    line = key_line(door, public_key, label=label, controller_port=controller_port, served=served,
                    rrsync=rrsync) if state == "present" else ""
    key = parse_public_key(public_key)
    retire = tuple(parse_public_key(k) for k in retired_keys)
    if state == "absent":
        removed = remove_keys(path, (key, *retire), check=check)
        return {"changed": removed.changed, "action": removed.action, "line_number": 0, "removed": removed.removed,
                "line": None, "path": path}
    parent = os.path.dirname(os.path.abspath(path))
    existed, parent_existed = os.path.exists(path), os.path.isdir(parent)
    extra = {}
    if repair and create_parent:
        issues = check_permissions(path, uid=os.geteuid(), manage_parent=True, home=os.path.dirname(parent))
        extra["permissions"] = [issue.to_dict() for issue in issues]
        if not check:
            fix_permissions(issues)
    result = install_line(path, line, key, retire=retire, mode=int(mode, 8) if mode else None,
                          create_parent=create_parent, check=check)
    if owner and not check:
        try:
            entry = pwd.getpwnam(owner)
        except KeyError:
            raise ValueError(f"owner {owner!r} is not an account on this host") from None
        if not existed:
            os.chown(path, entry.pw_uid, entry.pw_gid)
        if not parent_existed:
            os.chown(parent, entry.pw_uid, entry.pw_gid)
    return {"changed": result.changed, "action": result.action, "line_number": result.line_number or 0,
            "removed": result.removed, "line": line, "path": path, **extra}
