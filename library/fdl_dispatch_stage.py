#!/usr/bin/python
# Copyright (c) the fdl authors. MIT License.
"""Ansible module fdl_dispatch_stage: lay out one launcher run on this host in one round trip."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fdl_dispatch_stage
short_description: Lay out one fdl launcher run on this host (directories, rank supervisor, rank spec)
description:
  - Creates the launcher directory (C(root)) with C(bin/BIN_DIR/) (kept between runs, so rsync sends only what
    changed) and C(runs/RUN_ID/logs/), writes the rank supervisor to C(root/supervisor.py) when its content
    differs, and writes the host's rank spec to C(runs/RUN_ID/spec.json) (mode 0600).
  - The supervisor is fdl's own C(fdl/hostside/supervisor.py), which reaches the host inside this module's payload
    as the collection's module_utils C(supervisor) (copied from the fdl package when the collection is built);
    the layout is C(fdl/hostside/hoststage.py), module_utils C(hoststage).
  - Starts nothing. Ansible changes and stages hosts; a run's live session is ssh. C(fdl @cluster CMD) stages
    every host with this module (playbook C(flodl.fdl.dispatch)), then runs C(python3 supervisor.py spec.json)
    over one ssh session per host with its stdin held open, riding the ControlPath Ansible opened and the
    connection settings the inventory gives the host, because a task cannot stream a process's output for
    hours.
  - One module call instead of a file, copy and template task each, so staging costs one round trip per host;
    it sets the fact C(fdl_dispatch_staged) itself, so no set_fact task follows.
options:
  root:
    description: The launcher directory (C(~) is expanded).
    type: path
    default: ~/.flodl/launch
  run_id:
    description: The run id (hex), naming C(runs/RUN_ID/).
    type: str
    required: true
  bin_dir:
    description: The subdirectory of C(bin/) for the binary; empty when the ranks run a shell line.
    type: str
    default: ""
  program:
    description: The binary's file name in C(bin/BIN_DIR/) (rsync puts it there); empty for a shell line.
    type: str
    default: ""
  program_sha256:
    description: The SHA-256 of the binary fdl is about to ship; when the copy on this host has it, the result
      says C(program_current) and the rsync task is skipped (no round trip at all for an unchanged binary).
    type: str
    default: ""
  command:
    description: The rank command after the program (its args), or the whole argv of a shell line.
    type: list
    elements: str
    default: []
  ranks:
    description: One entry per rank, C({rank, env}).
    type: list
    elements: dict
    required: true
  label:
    description: The host name rank output is prefixed with.
    type: str
    required: true
  grace_s:
    description: Seconds between SIGTERM and SIGKILL when the ranks are stopped.
    type: float
    default: 10
attributes:
  check_mode:
    support: full
    description: In check mode nothing is written; the paths are returned.
author:
  - The fdl authors (@flodl)
"""

EXAMPLES = r"""
- name: Stage run 3f2a... for two CPU ranks of a shell line
  flodl.fdl.fdl_dispatch_stage:
    run_id: 3f2a9c0e7b1d4e6f
    command: [/bin/sh, -c, python3 train.py]
    ranks: [{rank: 0, env: {RANK: "0"}}, {rank: 1, env: {RANK: "1"}}]
    label: node-b
"""

RETURN = r"""
run_dir:
  description: The run's directory (the ranks' working directory).
  returned: always
  type: str
  sample: /home/op/.flodl/launch/runs/3f2a9c0e7b1d4e6f
supervisor:
  description: Where the rank supervisor is.
  returned: always
  type: str
spec:
  description: The rank spec the supervisor reads.
  returned: always
  type: str
bin_dir:
  description: The directory the binary goes to (empty for a shell line).
  returned: always
  type: str
program_current:
  description: Whether the binary on this host already has C(program_sha256).
  returned: always
  type: bool
ansible_facts:
  description: C(fdl_dispatch_staged), the paths the launcher needs (C(run_dir), C(supervisor), C(spec)), the
    binary's directory (C(bin_dir)) and whether the host's copy is current (C(program_current)).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

# The code fdl shares with its hosts, fdl/hostside/: this collection's module_utils (copied in when the
# collection is built, fdl/collection.py; the fdl package itself in a clone used in place).
from ansible_collections.flodl.fdl.plugins.module_utils import hoststage, supervisor
from ansible_collections.flodl.fdl.plugins.module_utils.fsio import atomic_write


def supervisor_source():
    """The rank supervisor's source, as shipped in this module's payload."""
    loader = getattr(supervisor, "__loader__", None)
    source = loader.get_source(supervisor.__name__) if loader is not None and hasattr(loader, "get_source") else None
    if source is None:
        with open(supervisor.__file__, encoding="utf-8") as handle:
            source = handle.read()
    return source


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="~/.flodl/launch"),
            run_id=dict(type="str", required=True),
            bin_dir=dict(type="str", default=""),
            program=dict(type="str", default=""),
            program_sha256=dict(type="str", default=""),
            command=dict(type="list", elements="str", default=[]),
            ranks=dict(type="list", elements="dict", required=True),
            label=dict(type="str", required=True),
            grace_s=dict(type="float", default=10.0),
        ),
        supports_check_mode=True,
    )
    # The layout is fdl's own (fdl/hostside/hoststage.py), shipped as module_utils.
    try:
        changed, staged = hoststage.stage(module.params, supervisor_source(), atomic_write,
                                          check_mode=module.check_mode)
    except hoststage.StageError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:  # an unwritable launcher directory: name the path and the reason, no traceback
        where = exc.filename or module.params["root"]
        module.fail_json(msg=f"cannot lay out the run: {where}: {exc.strerror or exc}")
    facts = {k: staged[k] for k in ("run_dir", "supervisor", "spec", "bin_dir", "program_current")}
    module.exit_json(changed=changed, ansible_facts={"fdl_dispatch_staged": facts}, **staged)


if __name__ == "__main__":
    main()
