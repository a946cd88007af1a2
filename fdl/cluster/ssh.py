"""A plain `ssh` command line for an inventory host, with the settings Ansible uses for it.

Ansible changes and stages hosts; a run's live session is ssh. The one thing
that does not fit an Ansible task is a process whose output streams back for
hours: the launcher's rank supervisor on every host, started over one ssh per
host once the dispatch playbook has staged it. That ssh, and the rsync
command the dispatch role runs for a host (its `--rsh`), are built here from
the same sources as the runner's Ansible:
the shipped ansible.cfg's `ssh_args`, the same ControlPath directory (so a
session rides the persistent master Ansible opened a moment before, and the
next Ansible run rides ours), and the host's inventory variables
(`ansible_host`, `ansible_port`, `ansible_user`,
`ansible_ssh_private_key_file`, `ansible_ssh_common_args`).

Standard library only; nothing here imports Ansible.
"""

from __future__ import annotations

import shlex

from fdl.cluster.connection import pinned_settings, ready_control_path_dir
from fdl.cluster.inventory import InventoryHost
from fdl.resources import ansible_cfg


def ssh_options() -> list[str]:
    """The options every fdl ssh carries: ansible.cfg's ssh_args, its connect timeout, the shared ControlPath."""
    pinned = pinned_settings(ansible_cfg())
    words = shlex.split(pinned.get("ANSIBLE_SSH_ARGS", ""))
    timeout = pinned.get("ANSIBLE_TIMEOUT", "10")
    cp_dir = ready_control_path_dir()
    return [*words, "-o", f"ConnectTimeout={timeout}", "-o", f"ControlPath={cp_dir}/%C"]


def ssh_argv(host: InventoryHost) -> list[str]:
    """`ssh [options] [user@]address` for one inventory host (append the remote command)."""
    v = host.vars
    argv = ["ssh", *ssh_options(), "-p", str(v.get("ansible_port", 22))]
    if v.get("ansible_ssh_private_key_file"):
        argv += ["-i", str(v["ansible_ssh_private_key_file"]), "-o", "IdentitiesOnly=yes"]
    if v.get("ansible_ssh_common_args"):
        argv += shlex.split(str(v["ansible_ssh_common_args"]))
    user = v.get("ansible_user")
    target = str(v.get("ansible_host", host.name))
    argv.append(f"{user}@{target}" if user else target)
    return argv


def login(host: InventoryHost) -> str:
    """`[user@]address` of a host, as rsync and ssh name it."""
    v = host.vars
    target = str(v.get("ansible_host", host.name))
    return f"{v['ansible_user']}@{target}" if v.get("ansible_user") else target


def rsync_rsh(host: InventoryHost) -> str:
    """The remote shell rsync should use for this host (`rsync -e RSH`): ssh_argv without the target."""
    return shlex.join(ssh_argv(host)[:-1])
