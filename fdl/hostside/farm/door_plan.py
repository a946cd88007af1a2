"""What the fdl_join_door_plan module reports: a door's sshd drop-in planned from the host's own sshd configuration.

Reads sshd's configuration (scan), computes the drop-in's values with the code `fdl join-config` uses
(doors.dropin_vars), and reads the configuration again with the planned drop-in in place, to say whether sshd
would read it and which earlier settings would win over its Match block. Changes nothing.
"""

from __future__ import annotations

import os
from typing import Any

from .doors import DoorError, dropin_name, dropin_scan_lines, dropin_vars
from .sshd_config import scan


def plan(sshd_config: str, dropin_dir: str, *, label: str, door: str, door_port: int, controller_port: int,
         jail_base: str, config_required: bool = True) -> dict[str, Any]:
    """The module's result (less `changed`): dropin_path, dropin, read_by_sshd, shadowing, explicit_ports.

    config_required=False plans for a box with no sshd configuration yet as for one without Port lines of its
    own (the role's render entry point, a review copy). DoorError (a ValueError) naming what is wrong: no sshd
    configuration where one is required, a bad label, port or door."""
    present = os.path.isfile(sshd_config)
    if not present and config_required:
        raise DoorError(f"{sshd_config} does not exist: is the OpenSSH server installed?")
    path = os.path.join(os.path.abspath(dropin_dir), dropin_name(label))
    explicit = scan(sshd_config).ports(exclude=(path,)) if present else []
    values = dropin_vars(door, label=label, door_port=door_port, controller_port=controller_port,
                         explicit_ports=explicit, jail_base=jail_base)
    virtual = scan(sshd_config, virtual=(path, dropin_scan_lines(values)))
    return {"dropin_path": path, "dropin": values, "read_by_sshd": virtual.virtual_read,
            "shadowing": [f"{d.file}:{d.line} {d.keyword} {d.value}" for d in virtual.shadowing(path)],
            "explicit_ports": explicit}
