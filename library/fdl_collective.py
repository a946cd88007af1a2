#!/usr/bin/python
# Copyright (c) the fdl authors. MIT License.
"""Ansible module fdl_collective: run this host's ranks of the all-reduce smoke test, all hosts at once."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fdl_collective
short_description: Run this host's ranks of fdl's all-reduce smoke test, with every other host of the play
description:
  - The interconnect check of C(fdl @cluster probe --collective) - PyTorch ranks under fdl's rank supervisor,
    an all-reduce of every message size from C(min_bytes) to C(max_bytes), then exchange rounds that time
    each rank's own traffic - started on every host of the play at once.
  - Every host gets the same C(world) - each host's offer, as the C(fdl_probe) module returns it with
    C(collective=true) - and takes its own ranks from it, numbered host by host in that order. A host that
    offers no rank (PyTorch missing) runs nothing.
  - The ranks rendezvous at C(master_addr):C(master_port) (torch.distributed's C(env://)), so every host's task
    must run at the same time. Run it with forks at least the number of hosts and no C(serial); with C(forks)
    given, a play of more hosts fails at once rather than wait out the time limit.
  - Bounded - the ranks measure within three quarters of C(time_limit_s) and stop early, together; whatever
    still runs at the limit is stopped (SIGTERM, then SIGKILL) and the result says C(abandoned).
  - The ranks run under the task's interpreter (the host's C(ansible_python_interpreter)), which must import
    PyTorch; the task's C(environment:) reaches them (C(GLOO_SOCKET_IFNAME), C(NCCL_SOCKET_IFNAME)).
options:
  host:
    description: This host's name in C(world) (the inventory name).
    type: str
    required: true
  world:
    description: Every host's offer in one order shared by all hosts - C(host), C(ranks) (how many), C(gpus) (GPU
      ids, or null for CPU ranks).
    type: list
    elements: dict
    required: true
  master_addr:
    description: The address of the first host with ranks (rank 0's), as every other host reaches it.
    type: str
    required: true
  master_port:
    description: The port rank 0 listens on for the rendezvous.
    type: int
    default: 29500
  time_limit_s:
    description: Seconds the ranks may take in all.
    type: float
    default: 120
  min_bytes:
    description: The smallest all-reduce message.
    type: int
    default: 8192
  max_bytes:
    description: The largest all-reduce message (sizes double from C(min_bytes)).
    type: int
    default: 67108864
  max_iters:
    description: The most timed iterations per message size.
    type: int
    default: 20
  exchange_bytes:
    description: What each rank sends per exchange round.
    type: int
    default: 4194304
  forks:
    description: The play's forks (C(ansible_forks)); fewer than the hosts in C(world) fails the task at once.
    type: int
attributes:
  check_mode:
    support: full
    description: The test changes nothing on the host; it runs the same in check mode.
author:
  - The fdl authors (@flodl)
"""

EXAMPLES = r"""
- name: Probe every host and say what it offers the smoke test
  fdl_probe:
    host: "{{ inventory_hostname }}"
    skip_mount: true
    local_devices: cpu:2
    collective: true
  register: probed

- name: Run the smoke test across every host at once
  fdl_collective:
    host: "{{ inventory_hostname }}"
    world: "{{ ansible_play_hosts | map('extract', hostvars, ['probed', 'offer']) | list }}"
    master_addr: "{{ hostvars[ansible_play_hosts[0]].ansible_host | default(ansible_play_hosts[0]) }}"
    forks: "{{ ansible_forks }}"
"""

RETURN = r"""
ranks:
  description: The ranks this host ran (empty when it offered none).
  returned: always
  type: list
  elements: int
events:
  description: Every C(fdl-collective) event the ranks printed (start, allreduce, exchange, done, error), which
    fdl aggregates over every host into bandwidth rows, the slowest rank and the stragglers.
  returned: always
  type: list
  elements: dict
tails:
  description: The last other output lines of each rank, by rank, for a failure's report.
  returned: always
  type: dict
codes:
  description: Each rank's exit code, by rank.
  returned: always
  type: dict
first_failure:
  description: The rank that failed first, or null.
  returned: always
  type: int
abandoned:
  description: Whether the time limit struck before the ranks ended.
  returned: always
  type: bool
elapsed_s:
  description: Seconds the ranks took.
  returned: always
  type: float
ok:
  description: Whether every rank of this host finished.
  returned: always
  type: bool
msg:
  description: This host's part in one line.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

# The code fdl shares with its hosts, fdl/hostside/: this collection's module_utils (copied in when the
# collection is built, fdl/collection.py; the fdl package itself in a clone used in place).
from ansible_collections.flodl.fdl.plugins.module_utils.collective.ranks import smoke_test


def main():
    module = AnsibleModule(
        argument_spec=dict(
            host=dict(type="str", required=True),
            world=dict(type="list", elements="dict", required=True),
            master_addr=dict(type="str", required=True),
            master_port=dict(type="int", default=29500),
            time_limit_s=dict(type="float", default=120.0),
            min_bytes=dict(type="int", default=8 << 10),
            max_bytes=dict(type="int", default=64 << 20),
            max_iters=dict(type="int", default=20),
            exchange_bytes=dict(type="int", default=4 << 20),
            forks=dict(type="int"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        result = smoke_test(params["host"], params["world"], master_addr=params["master_addr"],
                            master_port=params["master_port"], time_limit_s=params["time_limit_s"],
                            min_bytes=params["min_bytes"], max_bytes=params["max_bytes"],
                            max_iters=params["max_iters"], exchange_bytes=params["exchange_bytes"],
                            forks=params["forks"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
