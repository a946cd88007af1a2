"""The sshd drop-in as the fdl_join_door role renders it (its render entry point, through the same play
`fdl join-config` runs), for the tests that read a door's drop-in: nothing renders it but Ansible."""

from __future__ import annotations

import tempfile
from pathlib import Path

from fdl.farm.render import DOOR, DROPIN_MANAGED, render


def rendered_dropin(door: str, *, label: str, door_port: int, controller_port: int, explicit_ports: list[int],
                    jail_base: str = "/var/lib/fdl-doors", managed: str = DROPIN_MANAGED) -> str:
    """The drop-in the role would install on a host whose sshd configuration has `explicit_ports`."""
    with tempfile.TemporaryDirectory(prefix="fdl-dropin-") as tmp:
        config = Path(tmp) / "sshd_config"
        config.write_text("".join(f"Port {port}\n" for port in explicit_ports))
        done = render({"fdl_join_door_label": label, "fdl_join_door_door": door, "fdl_join_door_port": door_port,
                       "fdl_join_door_controller_port": controller_port, "fdl_join_door_jail_base": jail_base,
                       "fdl_join_door_sshd_config": str(config),
                       "fdl_join_door_sshd_config_dir": str(Path(tmp) / "sshd_config.d"),
                       "fdl_join_door_managed": managed}, Path(tmp), parts=(DOOR,))
        assert done.dropin is not None
        return done.dropin
