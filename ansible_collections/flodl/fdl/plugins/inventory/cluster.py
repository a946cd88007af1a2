# Copyright (c) the fdl authors. MIT License.
"""Ansible inventory plugin `fdl_cluster`: an fdl cluster file as an inventory."""

from __future__ import annotations

DOCUMENTATION = r"""
    name: fdl_cluster
    short_description: Use an fdl cluster file (fdl.cluster.yml) as an inventory
    description:
        - Reads an fdl env overlay such as C(fdl.cluster.yml) merged over its base C(fdl.yml), through fdl's own
          configuration core (the same merge, validation and error messages as the C(fdl) command).
        - Builds the groups C(fdl_workers) (every worker), C(fdl_controller) (the controller host) and one
          C(arch_<variant>) group per libtorch variant, e.g. C(arch_precompiled_cu128).
        - Each worker gets C(ansible_host), C(ansible_user), C(ansible_port), C(ansible_ssh_private_key_file),
          C(ansible_python_interpreter) (the worker's C(python:) key, default C(/usr/bin/python3)), C(fdl_arch),
          C(fdl_local_devices), C(fdl_env) and C(fdl_data_path). C(fdl_controller_host) and
          C(fdl_controller_port) are set for all hosts.
        - Claims a file named C(fdl.yml) or C(fdl.<env>.yml) (also C(.yaml), C(.json)) that has no top-level
          C(plugin:) key, and a file ending in C(fdl_cluster.yml) that names this plugin (the second form can point
          at a project elsewhere).
        - List C(fdl_cluster) before C(yaml) in C(enable_plugins), or the built-in yaml plugin misreads the file.
        - Needs the C(fdl) Python package importable by the Python that runs Ansible.
    options:
        plugin:
            description: Marks a C(*fdl_cluster.yml) file as this plugin's (only in that form).
            required: false
            choices: ['fdl_cluster']
        project_dir:
            description:
                - Directory holding the project's C(fdl.yml) (only in the C(*fdl_cluster.yml) form).
                - Relative paths are taken from the directory of the C(*fdl_cluster.yml) file.
            type: path
            required: false
        env:
            description: The env overlay to apply, as in C(fdl @ENV) (only in the C(*fdl_cluster.yml) form).
            type: str
            required: false
"""

EXAMPLES = r"""
# fdl.cluster.yml, next to the project's fdl.yml; `ansible-inventory -i fdl.cluster.yml --graph`
cluster:
  controller: {host: 10.0.0.1, port: 1337}
  ssh: {user: op, identity: ~/.ssh/id_ed25519}
  workers:
    - host: node-a
      address: 10.0.0.1
      arch: precompiled/cu128
      local_devices: [0, 1]
    - host: node-b
      address: 10.0.0.12
      arch: builds/sm61-sm120
      env: {LD_PRELOAD: /srv/flodl/libtorch/nccl/builds/v2.27.5-sm61/lib/libnccl.so.2}
      python: /usr/bin/python3.11

# prod.fdl_cluster.yml, anywhere: the cluster of another project under one of its envs
plugin: fdl_cluster
project_dir: ../training
env: cluster
"""

import os
import re
from pathlib import Path

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseFileInventoryPlugin

_DIRECT_RE = re.compile(r"^fdl(\.[A-Za-z0-9][A-Za-z0-9_-]*)?\.(yml|yaml|json)$")
_PLUGIN_KEY_RE = re.compile(rb"^[\"']?plugin[\"']?\s*:", re.MULTILINE)
_SNIFF_BYTES = 65536


class InventoryModule(BaseFileInventoryPlugin):
    """Hosts and groups from an fdl cluster file."""

    NAME = "fdl_cluster"
    trusted_by_default = True  # values come from the user's own config file, never from a remote source

    def verify_file(self, path):
        """Claim fdl.yml / fdl.<env>.yml without a plugin: key, or *fdl_cluster.yml naming this plugin."""
        if not super().verify_file(path):
            return False
        name = os.path.basename(path)
        if _DIRECT_RE.match(name):
            return not self._has_plugin_key(path)
        return name.endswith(("fdl_cluster.yml", "fdl_cluster.yaml"))

    @staticmethod
    def _has_plugin_key(path):
        try:
            with open(path, "rb") as handle:
                return bool(_PLUGIN_KEY_RE.search(handle.read(_SNIFF_BYTES)))
        except OSError:
            return False

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        direct = bool(_DIRECT_RE.match(os.path.basename(path)))
        try:
            from fdl.cluster.inventory import inventory_from_file
            from fdl.errors import FdlError
        except ImportError as exc:
            self._fail(path, f"{path}: the fdl_cluster inventory plugin needs the fdl package, which this "
                             f"Ansible's Python cannot import ({exc}). Install fdl into the environment that runs "
                             f"ansible-playbook.", direct)

        env = project_dir = None
        if direct:
            self.set_options()
        else:
            self._read_config_data(path)
            env = self.get_option("env")
            project_dir = self.get_option("project_dir")
            if project_dir is None:
                raise AnsibleParserError(f"{path}: project_dir: is required (the directory holding fdl.yml)")
            if not os.path.isabs(project_dir):
                project_dir = os.path.join(os.path.dirname(os.path.abspath(path)), project_dir)

        try:
            cluster, config = inventory_from_file(Path(path), env=env,
                                                  project_dir=Path(project_dir) if project_dir else None)
        except FdlError as exc:
            message = exc.message if str(path) in exc.message or os.path.basename(path) in exc.message \
                else f"{path}: {exc.message}"
            self._fail(path, message + (f" ({exc.hint})" if exc.hint else ""), direct)

        for warning in config.warnings:
            self.display.warning(f"fdl_cluster: {warning}")
        if not cluster.hosts:
            self.display.warning(f"fdl_cluster: {path} defines no cluster hosts (no cluster.workers); "
                                 f"the inventory is empty")
            return
        self._populate(cluster)
        self._register_module_utils()

    def _fail(self, path, message, direct):
        """Report a broken fdl file.

        For a plain fdl.<env>.yml this stops Ansible: a failed plugin makes
        Ansible try the next one, and the yaml plugin would read `cluster:` as
        an empty group, turning a config error into a run on no hosts (which a
        CI gate would count as a pass). The message is fdl's own, naming file,
        line and key.
        """
        if direct:
            self.display.error(f"fdl_cluster: {message}")
            raise SystemExit(1)
        raise AnsibleParserError(message)

    def _populate(self, cluster):
        for group in cluster.groups:
            self.inventory.add_group(group)
        for key, value in cluster.all_vars.items():
            self.inventory.set_variable("all", key, value)
        for name, host in cluster.hosts.items():
            self.inventory.add_host(name)
            for group in host.groups:
                self.inventory.add_child(group, name)
            for key, value in host.vars.items():
                self.inventory.set_variable(name, key, value)

    def _register_module_utils(self):
        """Let fdl's modules (fdl_probe, ...) find the check library they import as module_utils."""
        try:
            from fdl.cluster.modutils import register_with_ansible

            register_with_ansible()
        except OSError as exc:
            self.display.warning(f"fdl_cluster: could not prepare fdl's module_utils directory ({exc}); "
                                 f"set ANSIBLE_MODULE_UTILS to the output of `python -m fdl.cluster.modutils`")
