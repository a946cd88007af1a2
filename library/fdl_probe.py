#!/usr/bin/python
# Copyright (c) the fdl authors. MIT License.
"""Ansible module fdl_probe: fdl's readiness probe (GPU health, software stack, libtorch, NCCL, shared data)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fdl_probe
short_description: Audit this host's readiness for an fdl training run
description:
  - Runs the same checks as a local C(fdl probe) (the fdl check library, shipped to the host as the collection's
    module_utils C(checks)) on the GPUs through NVML, the libtorch variant, NCCL, and the shared data path.
  - Returns the host's report in the JSON schema of C(fdl probe --json).
  - The host needs only Python 3.8 or newer; fdl ships pynvml along with the checks.
  - Scripted or fake NVML libraries are reached through the task's C(environment:) (for example
    C(LD_LIBRARY_PATH)), as the worker's C(env:) in fdl.cluster.yml provides.
options:
  host:
    description: The host name to put in the report (the inventory name); default the machine's hostname.
    type: str
  data_path:
    description: Shared dataset root the ranks read (C(--data-path)).
    type: str
    default: /flodl/data
  skip_mount:
    description: Skip the shared-data check (C(--skip-mount)).
    type: bool
    default: false
  libtorch_path:
    description: Explicit libtorch directory (C(--libtorch-path)); default the host's own resolution.
    type: str
  docker:
    description: Compose service whose image provides NCCL (C(--docker)); skips the host NCCL check.
    type: str
  project_root:
    description: Project directory on this host (its libtorch/ tree), if it has one.
    type: str
  gpus:
    description: GPUs the ranks will use, C(all) or ids like C(0,1); default the declared C(local_devices),
      then CUDA_VISIBLE_DEVICES, else all.
    type: str
  local_devices:
    description:
      - What the worker declares it offers (its C(local_devices) in fdl.cluster.yml) - GPU ids like C(0,1),
        C(all), or C(cpu:N) for CPU ranks.
      - A declared GPU that is missing is an error (check C(gpu_count)); declared ids also select the GPUs
        the health checks judge.
      - C(cpu:N) makes the host a CPU host - the GPU, NCCL, GPU health and GPU stack checks are skipped with
        the reason, and libtorch and the data path decide the verdict.
      - Read as C(fdl probe --devices) reads it; a value it refuses (C(cpu:two)) fails the task, naming it.
    type: str
  whole_gpus:
    description: Whether ranks get whole GPUs, so MIG mode on a selected GPU is an error; default yes, unless
      the worker offers CPU ranks or CUDA_VISIBLE_DEVICES names MIG instances.
    type: bool
  fail_on_error:
    description: Fail the task when any check is an error (the report is returned either way).
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    description: The probe only reads; it runs the same in check mode.
author:
  - The fdl authors (@flodl)
"""

EXAMPLES = r"""
- name: Probe a worker with its cluster settings
  flodl.fdl.fdl_probe:
    host: "{{ inventory_hostname }}"
    data_path: "{{ fdl_data_path }}"
    local_devices: "{{ fdl_local_devices }}"
  environment: "{{ fdl_env }}"

- name: Probe without the shared-data check, NCCL from a compose service
  flodl.fdl.fdl_probe:
    skip_mount: true
    docker: cuda
"""

RETURN = r"""
report:
  description: The host's probe report (schema of C(fdl probe --json)).
  returned: always
  type: dict
  sample:
    schema_version: 2
    host: node-b
    ok: true
    checks:
      - {name: gpu, status: ok, message: "2 GPUs: ...", hint: null, data: {}}
ok:
  description: True when no check is an error (warnings do not count).
  returned: always
  type: bool
verdict:
  description: The host in one line, as C(fdl probe) prints it - ready with what was found, or NOT READY with
    every error and warning named.
  returned: always
  type: str
  sample: "node-b: ready: 2 GPUs (sm_86), libtorch 2.10.0 cu128, NCCL 2.27.5, data /flodl/data"
"""

from ansible.module_utils.basic import AnsibleModule

# The code fdl shares with its hosts, fdl/hostside/: this collection's module_utils (copied in when the
# collection is built, fdl/collection.py; the fdl package itself in a clone used in place).
from ansible_collections.flodl.fdl.plugins.module_utils.checks.devices import (
    DEVICE_FORMS,
    parse_declared,
    probe_declaration,
)
from ansible_collections.flodl.fdl.plugins.module_utils.checks.probe import ProbeOptions, run_probe
from ansible_collections.flodl.fdl.plugins.module_utils.checks.verdict import verdict


def main():
    module = AnsibleModule(
        argument_spec=dict(
            host=dict(type="str"),
            data_path=dict(type="str", default="/flodl/data"),
            skip_mount=dict(type="bool", default=False),
            libtorch_path=dict(type="str"),
            docker=dict(type="str"),
            project_root=dict(type="str"),
            gpus=dict(type="str"),
            local_devices=dict(type="str"),
            whole_gpus=dict(type="bool"),
            fail_on_error=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    gpus = params["gpus"]
    if gpus is not None and (gpus.startswith("cpu:") or not gpus.strip()):
        gpus = None  # a CPU-rank worker offers no GPU ids: probe what is there
    declared = params["local_devices"]
    if declared is not None and not declared.strip():
        declared = None  # nothing declared: every GPU there is
    elif declared is not None:
        try:  # read exactly as `fdl probe --devices` reads it: a declaration it refuses fails the task
            declared = probe_declaration(parse_declared(declared, "local_devices (fdl_probe_devices)"))
        except ValueError as exc:
            module.fail_json(msg=f"{exc}. Name {DEVICE_FORMS}.")
    options = ProbeOptions(data_path=params["data_path"], skip_mount=params["skip_mount"],
                           libtorch_path=params["libtorch_path"], docker=params["docker"],
                           project_root=params["project_root"], gpus=gpus, local_devices=declared,
                           whole_gpus=params["whole_gpus"],
                           interpreter_setting="this worker's python: (in fdl.cluster.yml; ansible_python_interpreter "
                                               "in an inventory of your own)")
    report = run_probe(options, host=params["host"])
    result = dict(changed=False, report=report.to_dict(), ok=report.ok, verdict=verdict(report))
    if params["fail_on_error"] and not report.ok:
        failed = ", ".join(f"{c.name}: {c.message}" for c in report.errors)
        module.fail_json(msg=f"probe found {len(report.errors)} error(s): {failed}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
