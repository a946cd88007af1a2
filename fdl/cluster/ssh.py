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

A host behind an execution node (`via:` in the cluster file) is reached the
same way through OpenSSH's ProxyJump: `ssh -F CONF -J fdl-node-NODE ...`,
where CONF is a file fdl writes that says how this machine reaches the node
(and the node's own via: chain), with the same options and ControlPath, so
the hop rides the master the node's job stream opened (fdl.cluster.nodes).
ProxyJump only carries the TCP stream: this machine's ssh authenticates to
the host end to end (cluster.ssh's identity and known_hosts,
`InventoryHost.session`). The rsync a via host's staging runs happens on the
node, so its remote shell is the node's (`rsync_rsh`).

Standard library only; nothing here imports Ansible.
"""

from __future__ import annotations

import hashlib
import itertools
import shlex
from pathlib import Path

from fdl.cluster.connection import pinned_settings, ready_control_path_dir
from fdl.cluster.inventory import InventoryHost
from fdl.hostside.fsio import atomic_write
from fdl.hostside.paths import cache_dir
from fdl.resources import ansible_cfg

NODE_ALIAS_PREFIX = "fdl-node-"  # the Host names of fdl's ssh configuration for execution nodes
# On an execution node: where the playbooks' ssh masters live (ANSIBLE_SSH_CONTROL_PATH_DIR there), so the rsync a
# staging runs there rides them too. ssh expands the ~ itself, as Ansible does.
NODE_CONTROL_PATH_DIR = "~/.cache/fdl/cp"


def ssh_options() -> list[str]:
    """The options every fdl ssh carries: ansible.cfg's ssh_args, its connect timeout, the shared ControlPath."""
    pinned = pinned_settings(ansible_cfg())
    words = shlex.split(pinned.get("ANSIBLE_SSH_ARGS", ""))
    timeout = pinned.get("ANSIBLE_TIMEOUT", "10")
    cp_dir = ready_control_path_dir()
    return [*words, "-o", f"ConnectTimeout={timeout}", "-o", f"ControlPath={cp_dir}/%C"]


def ssh_argv(host: InventoryHost) -> list[str]:
    """`ssh [options] [user@]address` for one inventory host (append the remote command); a host behind an
    execution node through ProxyJump, authenticated with this machine's own settings (its `session`)."""
    v = host.vars
    argv = ["ssh", *ssh_options(), "-p", str(v.get("ansible_port", 22))]
    auth = v
    if host.via is not None:
        config = node_ssh_config(host.via)
        argv += ["-F", str(config), "-J", node_alias(host.via)]
        auth = host.session
    if auth.get("ansible_ssh_private_key_file"):
        argv += ["-i", str(auth["ansible_ssh_private_key_file"]), "-o", "IdentitiesOnly=yes"]
    if auth.get("ansible_ssh_common_args"):
        argv += shlex.split(str(auth["ansible_ssh_common_args"]))
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
    """The remote shell rsync should use for this host (`rsync -e RSH`): ssh_argv without the target. For a host
    behind an execution node the rsync runs on that node, so this is the node's ssh to the host: the same
    options, the node's ControlPath directory, the host's identity there (if any)."""
    if host.via is None:
        return shlex.join(ssh_argv(host)[:-1])
    pinned = pinned_settings(ansible_cfg())
    v = host.vars
    argv = ["ssh", *shlex.split(pinned.get("ANSIBLE_SSH_ARGS", "")),
            "-o", f"ConnectTimeout={pinned.get('ANSIBLE_TIMEOUT', '10')}",
            "-o", f"ControlPath={NODE_CONTROL_PATH_DIR}/%C", "-p", str(v.get("ansible_port", 22))]
    if v.get("ansible_ssh_private_key_file"):
        argv += ["-i", str(v["ansible_ssh_private_key_file"]), "-o", "IdentitiesOnly=yes"]
    return shlex.join(argv)


def node_alias(node: InventoryHost) -> str:
    """The Host name fdl's ssh configuration gives an execution node."""
    return NODE_ALIAS_PREFIX + node.name


def node_ssh_argv(node: InventoryHost) -> list[str]:
    """`ssh -F CONF fdl-node-NODE`: how fdl reaches an execution node (append the remote command). Every
    setting is in CONF, so the hop of a ProxyJump through the node, which reads CONF alone, gets the same."""
    return ["ssh", "-F", str(node_ssh_config(node)), node_alias(node)]


def node_ssh_config(node: InventoryHost) -> Path:
    """fdl's ssh configuration for an execution node and the nodes of its via: chain, written once (0600, under
    the cache) and named by its content: one `Host fdl-node-NAME` block per node with its address, user, port,
    key and known_hosts, ProxyJump to the next node, and the options and ControlPath of every fdl ssh."""
    blocks = []
    hop: InventoryHost | None = node
    seen: set[str] = set()
    while hop is not None and hop.name not in seen:  # the schema refuses cycles; this only bounds the walk
        seen.add(hop.name)
        blocks.append(_node_block(hop))
        hop = hop.via
    text = ("# Written by fdl: how this machine reaches its execution nodes (ssh -F); rewritten as the cluster "
            "file changes.\n" + "".join(blocks))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = cache_dir() / "ssh" / f"nodes-{digest}.conf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(path, text, mode=0o600)
    return path


def _node_block(node: InventoryHost) -> str:
    v = node.vars
    lines = [f"Host {node_alias(node)}", f"HostName {v.get('ansible_host', node.name)}",
             f"Port {v.get('ansible_port', 22)}"]
    if v.get("ansible_user"):
        lines.append(f"User {v['ansible_user']}")
    auth = node.session if node.via is not None else v
    if auth.get("ansible_ssh_private_key_file"):
        lines += [f"IdentityFile {_quoted(str(auth['ansible_ssh_private_key_file']))}", "IdentitiesOnly yes"]
    if node.via is not None:
        lines.append(f"ProxyJump {node_alias(node.via)}")
    words = [*ssh_options(), *shlex.split(str(auth.get("ansible_ssh_common_args") or ""))]
    lines += _config_lines(words)
    return "\n    ".join(lines) + "\n"


def _config_lines(words: list[str]) -> list[str]:
    """`-o Key=Value` command-line options as ssh_config lines (the form fdl's settings take)."""
    out = []
    for flag, option in itertools.pairwise(words):
        if flag == "-o" and "=" in option:
            key, _, value = option.partition("=")
            out.append(f"{key} {_quoted(value)}")
    return out


def _quoted(value: str) -> str:
    return f'"{value}"' if any(c.isspace() for c in value) else value
