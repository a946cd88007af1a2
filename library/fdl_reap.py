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

import os
import signal
import time

from ansible.module_utils.basic import AnsibleModule


def _environ_has(pid, marker):
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return marker in handle.read().split(b"\0")
    except OSError:
        return False


def _parents():
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    stat = handle.read()
                parents[int(entry)] = int(stat[stat.rindex(b")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return parents


def find_run_processes(run_id):
    """Processes whose environment holds FDL_RUN_ID=run_id, plus all their descendants (never this one)."""
    marker = f"FDL_RUN_ID={run_id}".encode()
    me = os.getpid()
    parents = _parents()
    spared = set()
    pid = me
    while pid in parents and pid not in spared:  # this module and its ancestors
        spared.add(pid)
        pid = parents[pid]
    found = {pid for pid in parents if pid not in spared and _environ_has(pid, marker)}
    grew = True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in found and pid not in found | spared}
        grew = bool(children)
        found |= children
    return sorted(found)


def stop(pids, grace_s):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [pid for pid in alive if os.path.exists(f"/proc/{pid}")]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run_id=dict(type="str", required=True),
            grace_s=dict(type="float", default=2.0),
        ),
        supports_check_mode=True,
    )
    run_id = module.params["run_id"]
    if not run_id or not all(c in "0123456789abcdef" for c in run_id):
        module.fail_json(msg=f"run_id must be the hex id of an fdl run, got {run_id!r}")
    pids = find_run_processes(run_id)
    if pids and not module.check_mode:
        stop(pids, module.params["grace_s"])
    module.exit_json(changed=bool(pids), pids=pids)


if __name__ == "__main__":
    main()
