#!/usr/bin/python
"""Ansible module: read a host's sshd configuration and plan a farm door's drop-in (changes nothing)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fdl_join_door_plan
short_description: Plan an fdl farm door's sshd drop-in from the host's own sshd configuration
description:
  - Reads the sshd configuration (following Include globs, as sshd does) and returns what the drop-in
    template needs, computed by the same code C(fdl join-config) uses (fdl.hostside.farm.doors.dropin_vars) -
    notably which Port lines keep sshd on its current ports while adding the door port.
  - Also says whether sshd would read a drop-in at I(dropin_dir) at all, and which settings read before it
    would win over its Match block. Changes nothing.
  - The privileged part of the C(fdl_join_door) role starts here, the part C(fdl join-config) prints as one
    C(ansible-playbook ... --become) line for the operator to run, so the wizard and an Ansible user apply
    the same tasks (Ansible changes the host; the wizard decides and asks).
options:
  sshd_config:
    description: The main sshd configuration file.
    type: path
    default: /etc/ssh/sshd_config
  dropin_dir:
    description: Where the drop-in goes.
    type: path
    default: /etc/ssh/sshd_config.d
  label:
    description: The farm label.
    type: str
    required: true
  door:
    description: Which door.
    type: str
    choices: [a, b, tunnel-only]
    required: true
  door_port:
    description: The door's port.
    type: int
    required: true
  controller_port:
    description: The training port of the one permitted forward.
    type: int
    default: 1337
  jail_base:
    description: Door a, where the jailed account's home (BASE/LABEL) and chroot (BASE/LABEL/jail) go.
    type: str
    default: /var/lib/fdl-doors
  config_required:
    description:
      - Fail when I(sshd_config) does not exist. False plans the drop-in as for a host with no Port lines of
        its own (the role's render entry point, which writes a review copy on a box that may not run sshd yet).
    type: bool
    default: true
author:
  - The fdl authors (@flodl)
"""

EXAMPLES = r"""
- name: Plan the drop-in of farm b300
  flodl.fdl.fdl_join_door_plan:
    label: b300
    door: b
    door_port: 2222
  register: plan
"""

RETURN = r"""
dropin_path:
  description: Where the drop-in is installed.
  returned: always
  type: str
dropin:
  description: The template variables (label, door, door_title, door_port, controller_host, controller_port,
    ports, force_command).
  returned: always
  type: dict
read_by_sshd:
  description: Whether an Include of the main configuration reaches the drop-in's path.
  returned: always
  type: bool
shadowing:
  description: Settings read before the drop-in that win over its Match block (file:line keyword value).
  returned: always
  type: list
  elements: str
explicit_ports:
  description: Port lines found outside the drop-in.
  returned: always
  type: list
  elements: int
"""

import os

from ansible.module_utils.basic import AnsibleModule

# The code fdl shares with its hosts, fdl/hostside/: this collection's module_utils (copied in when the
# collection is built, fdl/collection.py; the fdl package itself in a clone used in place).
from ansible_collections.flodl.fdl.plugins.module_utils.farm.doors import (
    DoorError,
    dropin_name,
    dropin_scan_lines,
    dropin_vars,
)
from ansible_collections.flodl.fdl.plugins.module_utils.farm.sshd_config import scan


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            sshd_config=dict(type="path", default="/etc/ssh/sshd_config"),
            dropin_dir=dict(type="path", default="/etc/ssh/sshd_config.d"),
            label=dict(type="str", required=True),
            door=dict(type="str", required=True, choices=["a", "b", "tunnel-only"]),
            door_port=dict(type="int", required=True),
            controller_port=dict(type="int", default=1337),
            jail_base=dict(type="str", default="/var/lib/fdl-doors"),
            config_required=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    present = os.path.isfile(p["sshd_config"])
    if not present and p["config_required"]:
        module.fail_json(msg=f"{p['sshd_config']} does not exist: is the OpenSSH server installed?")
    try:
        path = os.path.join(os.path.abspath(p["dropin_dir"]), dropin_name(p["label"]))
        explicit = scan(p["sshd_config"]).ports(exclude=(path,)) if present else []
        values = dropin_vars(p["door"], label=p["label"], door_port=p["door_port"],
                             controller_port=p["controller_port"], explicit_ports=explicit,
                             jail_base=p["jail_base"])
    except DoorError as exc:
        module.fail_json(msg=str(exc))
    virtual = scan(p["sshd_config"], virtual=(path, dropin_scan_lines(values)))
    module.exit_json(
        changed=False, dropin_path=path, dropin=values, read_by_sshd=virtual.virtual_read,
        shadowing=[f"{d.file}:{d.line} {d.keyword} {d.value}" for d in virtual.shadowing(path)],
        explicit_ports=explicit,
    )


if __name__ == "__main__":
    main()
