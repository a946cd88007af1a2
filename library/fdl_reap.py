#!/usr/bin/python
# Copyright (c) the fdl authors. MIT License.
"""Ansible module fdl_reap: stop the processes a canceled fdl run left on this host."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fdl_reap
short_description: Stop every process of one fdl run on this host
description:
  - fdl's playbooks export C(FDL_RUN_ID) to everything they start (a play-level C(environment:)). After a run is
    canceled, this module finds the login user's processes whose environment carries that run id, and their
    descendants, and stops them (SIGTERM, then SIGKILL after a grace period).
  - Only processes the login user may signal are considered; the module itself is never a target.
options:
  run_id:
    description: The run id to sweep (the C(fdl_run_id) of the canceled run).
    type: str
    required: true
  grace_s:
    description: Seconds between SIGTERM and SIGKILL.
    type: float
    default: 2.0
attributes:
  check_mode:
    support: full
    description: In check mode the processes are listed, not signalled.
author:
  - The fdl authors (@flodl)
"""

EXAMPLES = r"""
- name: Stop what run 3f2a... left behind
  flodl.fdl.fdl_reap:
    run_id: 3f2a9c0e7b1d4e6f8a5b2c1d0e9f8a7b
"""

RETURN = r"""
pids:
  description: The processes that belonged to the run (and were signalled unless in check mode).
  returned: always
  type: list
  elements: int
  sample: [4242, 4250]
"""

from ansible.module_utils.basic import AnsibleModule

try:  # the flodl.fdl collection: module_utils copied from the fdl package when it is built (fdl/collection.py)
    from ansible_collections.flodl.fdl.plugins.module_utils.reap import reap
except ImportError:  # a clone used in place: ansible.cfg's module_utils = . serves the fdl package
    from ansible.module_utils.fdl.hostside.reap import reap


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run_id=dict(type="str", required=True),
            grace_s=dict(type="float", default=2.0),
        ),
        supports_check_mode=True,
    )
    # The finding and the stopping are fdl's one process sweep (fdl/hostside/reap.py), shipped as module_utils.
    try:
        pids = reap(module.params["run_id"], module.params["grace_s"], check_mode=module.check_mode)
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=bool(pids), pids=pids)


if __name__ == "__main__":
    main()
