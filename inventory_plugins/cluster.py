# Copyright (c) the fdl authors. MIT License.
"""Ansible inventory plugin flodl.fdl.cluster: an fdl project's cluster as an inventory.

It is always loaded as the collection's plugin, flodl.fdl.cluster: from the installed collection
(plugins/inventory/cluster.py, assembled from this file by fdl/collection.py), or from a clone used in place,
whose ansible.cfg puts the repository's ansible_collections/ on the collections path (a tree of links to these
directories). Either way it reads the project with fdl's own configuration reader, the collection's
plugins/plugin_utils/fdl/ (a copy of the fdl package's reader in the built collection; the clone's fdl package
itself in place).
"""

from __future__ import annotations

DOCUMENTATION = r"""
    name: cluster
    short_description: Use an fdl project's cluster (fdl.yml and its env overlay) as an inventory
    description:
        - Reads an fdl project's configuration, its base C(fdl.yml) merged with an env overlay such as
          C(fdl.cluster.yml), through fdl's own configuration core (the same merge, validation and error messages
          as the C(fdl) command).
        - Builds the groups C(fdl_workers) (every worker), C(fdl_controller) (the controller host) and one
          C(arch_<variant>) group per libtorch variant, e.g. C(arch_precompiled_cu128).
        - Each worker gets C(ansible_host), C(ansible_user), C(ansible_port), C(ansible_ssh_private_key_file),
          C(ansible_python_interpreter) (the worker's C(python:) key, default C(/usr/bin/python3)), C(fdl_arch),
          C(fdl_local_devices), C(fdl_env) and C(fdl_data_path). C(fdl_controller_host) and
          C(fdl_controller_port) are set for all hosts.
        - A worker that is the machine running Ansible (one of its own addresses, or a loopback address on port
          22) gets C(ansible_connection=local), as the C(fdl) command reaches it without ssh.
        - The inventory source is a YAML file whose name ends in C(fdl.yml) or C(fdl.yaml) (for example
          C(hosts.fdl.yml)) whose C(plugin) key names C(flodl.fdl.cluster). Ansible's default C(auto) inventory plugin
          enables it; no C(ansible.cfg) is needed.
        - A broken fdl configuration fails the source with fdl's message (file, line and key). Ansible reports a
          source no plugin could read as a warning and carries on with the hosts it has, unless told otherwise
          (C(unparsed_is_failed) or C(any_unparsed_is_failed) in the C([inventory]) section of C(ansible.cfg),
          as the fdl repository's own ansible.cfg sets); a CI gate should set one of them.
        - Needs nothing beyond ansible-core - the collection carries the configuration reader it uses (fdl's
          own, with PyYAML, which ansible-core requires); in a clone it reads with the clone's fdl package.
    extends_documentation_fragment:
        - constructed
    options:
        plugin:
            description: The name of this plugin; marks the file as its source.
            required: true
            type: str
            choices: ['flodl.fdl.cluster']
        project_dir:
            description:
                - The fdl project directory, the one holding C(fdl.yml).
                - A relative path is taken from the directory of the source file; the default is that directory.
            type: path
        env:
            description:
                - The env overlay to apply, as in C(fdl @ENV); the default C(cluster) reads C(fdl.cluster.yml),
                  the overlay C(fdl @cluster ...) uses.
                - An empty string reads the base C(fdl.yml) alone.
            type: str
            default: cluster
"""

EXAMPLES = r"""
# hosts.fdl.yml, next to the project's fdl.yml and fdl.cluster.yml:
#   ansible-inventory -i hosts.fdl.yml --graph
plugin: flodl.fdl.cluster

---
# prod.fdl.yml, anywhere: another project's cluster under its env "prod", with constructed variables and groups
plugin: flodl.fdl.cluster
project_dir: ../training
env: prod
compose:
  gpu_count: fdl_local_devices.split(',') | length
groups:
  cuda_13: fdl_arch is not none and 'cu13' in fdl_arch
keyed_groups:
  - key: fdl_data_path
    prefix: data
"""

import os
from pathlib import Path

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin, Constructable

try:
    from ansible_collections.flodl.fdl.plugins.plugin_utils.fdl.cluster.inventory import inventory_from_file
    from ansible_collections.flodl.fdl.plugins.plugin_utils.fdl.errors import FdlError
except ImportError as exc:  # a broken install: the parse names it for the source, never a traceback at load
    READER_ERROR = exc
else:
    READER_ERROR = None

_SUFFIXES = ("fdl.yml", "fdl.yaml")


class InventoryModule(BaseInventoryPlugin, Constructable):
    """Hosts and groups from an fdl project's cluster configuration."""

    NAME = "flodl.fdl.cluster"
    trusted_by_default = True  # values come from the user's own config files, never from a remote source

    def verify_file(self, path):
        """Claim a YAML source whose name ends in fdl.yml or fdl.yaml (hosts.fdl.yml)."""
        return super().verify_file(path) and os.path.basename(path).endswith(_SUFFIXES)

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        if READER_ERROR is not None:
            raise AnsibleParserError(
                f"{path}: the flodl.fdl.cluster inventory plugin could not load fdl's configuration reader "
                f"({READER_ERROR}). Reinstall the flodl.fdl collection (it carries the reader), or use a complete "
                f"clone of fdl") from READER_ERROR

        source_dir = os.path.dirname(os.path.abspath(path))
        project_dir = self.get_option("project_dir") or source_dir
        if not os.path.isabs(project_dir):
            project_dir = os.path.join(source_dir, project_dir)
        env = self.get_option("env") or None
        try:
            project = Path(project_dir)
            cluster, config = inventory_from_file(project / "fdl.yml", env=env, project_dir=project)
        except FdlError as exc:
            raise AnsibleParserError(f"{path}: {exc.message}" + (f" ({exc.hint})" if exc.hint else "")) from exc

        for warning in config.warnings:
            self.display.warning(f"flodl.fdl.cluster: {warning}")
        if not cluster.hosts:
            self.display.warning(f"flodl.fdl.cluster: the project in {project_dir} defines no cluster hosts "
                                 f"(no cluster.workers{' in env ' + env if env else ''}); the inventory is empty")
        self._populate(cluster)

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
        strict = self.get_option("strict")
        for name in cluster.hosts:
            # the host's variables over the all-hosts ones (Constructable adds the extra vars under use_extra_vars,
            # and what compose set before it forms the groups)
            hostvars = {**cluster.all_vars, **self.inventory.get_host(name).get_vars()}
            self._set_composite_vars(self.get_option("compose"), hostvars, name, strict=strict)
            self._add_host_to_composed_groups(self.get_option("groups"), hostvars, name, strict=strict)
            self._add_host_to_keyed_groups(self.get_option("keyed_groups"), hostvars, name, strict=strict)
