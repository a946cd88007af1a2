"""What the fdl_join_door_plan module reports: a door's sshd drop-in planned from the host's own sshd configuration.

Reads sshd's configuration (scan), computes the drop-in's values with the code `fdl join-config` uses
(doors.dropin_vars), and reads the configuration again with the planned drop-in in place, to say whether sshd
would read it and which earlier settings would win over its Match block. Changes nothing.
"""

from __future__ import annotations

import os
from typing import Any

from .doors import DoorError, dropin_name, dropin_vars, port_lines
from .sshd_config import scan


def plan(sshd_config: str, dropin_dir: str, *, label: str, door: str, door_port: int, controller_port: int,
         jail_base: str) -> dict[str, Any]:
    """The module's result (less `changed`): dropin_path, dropin, read_by_sshd, shadowing, explicit_ports.

    DoorError (a ValueError) naming what is wrong: no sshd configuration, a bad label, port or door."""
    if not os.path.isfile(sshd_config):
        raise DoorError(f"{sshd_config} does not exist: is the OpenSSH server installed?")
    path = os.path.join(os.path.abspath(dropin_dir), dropin_name(label))
    explicit = scan(sshd_config).ports(exclude=(path,))
    values = dropin_vars(door, label=label, door_port=door_port, controller_port=controller_port,
                         explicit_ports=explicit, jail_base=jail_base)
    lines = [f"Port {line.port}" for line in port_lines(int(door_port), explicit)] + [f"Match LocalPort {door_port}"]
    virtual = scan(sshd_config, virtual=(path, lines))
    return {"dropin_path": path, "dropin": values, "read_by_sshd": virtual.virtual_read,
            "shadowing": [f"{d.file}:{d.line} {d.keyword} {d.value}" for d in virtual.shadowing(path)],
            "explicit_ports": explicit}
