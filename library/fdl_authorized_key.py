#!/usr/bin/python
"""Ansible module: put an fdl farm door's key line into an authorized_keys file."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fdl_authorized_key
short_description: Install an fdl farm door's key line, leaving every other line byte for byte
description:
  - Composes the authorized_keys line that confines a farm key to its door (a, b or tunnel-only) and puts it
    into the key file. Only lines carrying the farm's key (or a key listed in I(retired_keys)) are touched;
    comments, options, blank lines, CRLF endings and a missing final newline of every other line stay exactly
    as they were.
  - The file is rewritten atomically (temp file in the same directory, mode set, fsync, rename).
  - Paths under /etc/ssh are refused, as by C(fdl join-config).
  - Shares its code with C(fdl join-config) (fdl.hostside.farm.authorized_keys and fdl.hostside.farm.doors,
    the collection's module_utils C(farm)), and is how the wizard installs its line - Ansible changes hosts, the wizard
    decides and asks - C(fdl join-config --install-key) runs the C(fdl_join_door) role's key part through
    ansible-playbook on its own box (local connection), as the invoking account.
options:
  path:
    description: The key file. C(~) and C(~user) are expanded on the host.
    type: path
    required: true
  public_key:
    description: The farm's public key, as in C(.fdl/LABEL/key.pub).
    type: str
    required: true
  door:
    description: Which door the key opens.
    type: str
    choices: [a, b, tunnel-only]
    required: true
  label:
    description: The farm label (the line's comment reads fdl-farm-LABEL).
    type: str
    required: true
  controller_port:
    description: The training port the one permitted forward reaches on the host's loopback.
    type: int
    default: 1337
  served:
    description: Doors a and b, the directory served (a, sftp start directory; b, rrsync root).
    type: path
  rrsync:
    description: The rrsync door b's key runs.
    type: str
    default: rrsync
  retired_keys:
    description: Public keys being rotated out; their lines are removed.
    type: list
    elements: str
    default: []
  create_parent:
    description: Create a missing parent directory (mode 0700). When false the directory must exist and is
      left exactly as found.
    type: bool
    default: true
  mode:
    description: The key file's mode after the rewrite (octal string). Empty keeps the existing mode.
    type: str
    default: "0600"
  owner:
    description: Owner for a file (and directory) this module creates; an existing file keeps its owner.
    type: str
  fix_permissions:
    description: Fix what sshd's StrictModes refuses on the way to the key file - its directory to 0700 and no
      group or other write on the home above it. Only with I(create_parent) (a directory the module may manage);
      the file itself gets I(mode) at the rewrite.
    type: bool
    default: false
  state:
    description: C(present) puts the line in; C(absent) takes every line of the key (and I(retired_keys)) out.
    type: str
    choices: [present, absent]
    default: present
author:
  - The fdl authors (@flodl)
"""

EXAMPLES = r"""
- name: Open door b of farm b300 for the farm key
  flodl.fdl.fdl_authorized_key:
    path: ~op/.ssh/authorized_keys
    public_key: "{{ lookup('ansible.builtin.file', '.fdl/b300/key.pub') }}"
    door: b
    label: b300
    served: /home/op/.flodl/run
    rrsync: /usr/bin/rrsync
"""

RETURN = r"""
action:
  description: added, replaced or unchanged.
  returned: always
  type: str
line_number:
  description: The line the farm key is on afterwards (1-based).
  returned: always
  type: int
removed:
  description: How many other lines of ours (duplicates, retired keys) went away.
  returned: always
  type: int
line:
  description: The key line (public material only).
  returned: always
  type: str
permissions:
  description: What sshd would object to along the path before this run (path, mode, want, problem, command).
  returned: when fix_permissions
  type: list
  elements: dict
"""

import os
import pwd

from ansible.module_utils.basic import AnsibleModule

# The code fdl shares with its hosts, fdl/hostside/: this collection's module_utils (copied in when the
# collection is built, fdl/collection.py; the fdl package itself in a clone used in place).
from ansible_collections.flodl.fdl.plugins.module_utils.farm.authorized_keys import (
    AuthorizedKeysError,
    check_permissions,
    fix_permissions,
    install_line,
    parse_public_key,
    remove_keys,
)
from ansible_collections.flodl.fdl.plugins.module_utils.farm.doors import DoorError, key_line


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            public_key=dict(type="str", required=True),
            door=dict(type="str", required=True, choices=["a", "b", "tunnel-only"]),
            label=dict(type="str", required=True),
            controller_port=dict(type="int", default=1337),
            served=dict(type="path"),
            rrsync=dict(type="str", default="rrsync"),
            retired_keys=dict(type="list", elements="str", default=[], no_log=False),
            create_parent=dict(type="bool", default=True),
            mode=dict(type="str", default="0600"),
            owner=dict(type="str"),
            fix_permissions=dict(type="bool", default=False),
            state=dict(type="str", default="present", choices=["present", "absent"]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    path = p["path"]  # type=path: ~ and ~user already expanded
    try:
        line = key_line(p["door"], p["public_key"], label=p["label"], controller_port=p["controller_port"],
                        served=p["served"], rrsync=p["rrsync"]) if p["state"] == "present" else ""
        key = parse_public_key(p["public_key"])
        retire = tuple(parse_public_key(k) for k in p["retired_keys"])
        existed = os.path.exists(path)
        parent_existed = os.path.isdir(os.path.dirname(os.path.abspath(path)))
        mode = int(p["mode"], 8) if p["mode"] else None
        if p["state"] == "absent":
            result = remove_keys(path, (key, *retire), check=module.check_mode)
            module.exit_json(changed=result.changed, action=result.action, line_number=0, removed=result.removed,
                             line=None, path=path)
        extra = {}
        if p["fix_permissions"] and p["create_parent"]:
            parent = os.path.dirname(os.path.abspath(path))
            issues = check_permissions(path, uid=os.geteuid(), manage_parent=True, home=os.path.dirname(parent))
            extra["permissions"] = [issue.to_dict() for issue in issues]
            if not module.check_mode:
                fix_permissions(issues)
        result = install_line(path, line, key, retire=retire, mode=mode, create_parent=p["create_parent"],
                              check=module.check_mode)
    except (AuthorizedKeysError, DoorError, ValueError) as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:  # the account may not write there: say where and why, no traceback
        module.fail_json(msg=f"cannot write {exc.filename or path}: {exc.strerror or exc}", errno=exc.errno)
    if p["owner"] and not module.check_mode:
        try:
            entry = pwd.getpwnam(p["owner"])
        except KeyError:
            module.fail_json(msg=f"owner {p['owner']!r} is not an account on this host")
        if not existed:
            os.chown(path, entry.pw_uid, entry.pw_gid)
        if not parent_existed:
            os.chown(os.path.dirname(os.path.abspath(path)), entry.pw_uid, entry.pw_gid)
    module.exit_json(changed=result.changed, action=result.action, line_number=result.line_number or 0,
                     removed=result.removed, line=line, path=path, **extra)


if __name__ == "__main__":
    main()
