#!/usr/bin/python
"""Ansible module: move a staged NCCL build into place with one atomic rename."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fdl_nccl_install
short_description: Put a staged libnccl build in place atomically
description:
  - Checks that a staging directory holds C(lib/libnccl.so.<version>), completes the
    C(libnccl.so.2) link, writes C(fdl-nccl-build.json), syncs it all to disk and renames the
    staging directory onto O(dest) in one step. An existing O(dest) is exchanged atomically
    (renameat2 RENAME_EXCHANGE) so readers see either the old build or the new one, never a mix.
  - The staging directory must be on the same file system as O(dest); create it next to it.
options:
  staging:
    description: Directory holding C(lib/) as copied out of the build image. Not needed in check mode.
    type: path
  dest:
    description: Output directory; receives C(lib/libnccl.so.2).
    type: path
    required: true
  version:
    description: NCCL version the build must contain, e.g. C(2.27.5).
    type: str
    required: true
  manifest:
    description: Facts about the build, written to C(fdl-nccl-build.json) in O(dest).
    type: dict
    default: {}
author:
  - The fdl authors (@flodl)
"""

EXAMPLES = r"""
- name: Move the staged build into place
  flodl.fdl.fdl_nccl_install:
    staging: /srv/flodl/libtorch/nccl/builds/.v2.27.5-sm61.partial-x1y2z3
    dest: /srv/flodl/libtorch/nccl/builds/v2.27.5-sm61
    version: 2.27.5
    manifest: {tag: v2.27.5-1, archs: ["6.1"]}
"""

RETURN = r"""
library:
  description: Absolute path of the library to preload.
  returned: always
  type: str
  sample: /srv/flodl/libtorch/nccl/builds/v2.27.5-sm61/lib/libnccl.so.2
dest:
  description: Absolute path of the output directory.
  returned: always
  type: str
replaced:
  description: Whether an earlier build at O(dest) was replaced.
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule

try:  # the flodl.fdl collection: module_utils copied from the fdl package when it is built (fdl/collection.py)
    from ansible_collections.flodl.fdl.plugins.module_utils.nccl_install import planned, put_in_place
except ImportError:  # a clone used in place: ansible.cfg's module_utils = . serves the fdl package
    from ansible.module_utils.fdl.hostside.nccl_install import planned, put_in_place


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "staging": {"type": "path"},
            "dest": {"type": "path", "required": True},
            "version": {"type": "str", "required": True},
            "manifest": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    # The checks and the atomic install are fdl's own (fdl/hostside/nccl_install.py), shipped as module_utils.
    result = planned(module.params["dest"])
    if module.check_mode:
        module.exit_json(**result)
    try:
        result["replaced"] = put_in_place(module.params["staging"], result["dest"], module.params["version"],
                                          module.params["manifest"])
    except ValueError as exc:
        module.fail_json(msg=str(exc), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
