"""One host's readiness probe: the single entry point every caller uses.

    report = run_probe(ProbeOptions(data_path="/flodl/data", docker="cuda"))
    report.ok, report.to_dict()   # JSON-ready, schema in docs/probe.md

The local `fdl probe` calls it, and so does the Ansible probe module on each
cluster host (`run_probe(ProbeOptions(**params))`, returning `to_dict()`), so
ProbeOptions holds plain JSON values only and run_probe never raises for
anything it finds on the host: every finding is a CheckResult. A check that
crashes becomes an error result naming the crash.

A host whose declared devices are CPU ranks (`local_devices="cpu:N"`) is
judged as a CPU host: the checks that only matter to GPU ranks (gpu, NCCL,
GPU health, the GPU software stack) are skipped, each saying so in one line
and carrying `data.cpu_host`, and libtorch and the data path decide.

Host-side (fdl/hostside/: runs in fdl and on managed hosts): standard library
(+ pynvml, inside the GPU check), relative imports.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, TypeVar

from ..envvars import FDL_PROBE_ROOT, read
from ..libtorch.variants import Libtorch
from ..paths import DEFAULT_DATA_PATH
from .data import check_data_path
from .devices import parse_devices
from .gpu import check_gpu
from .health import (
    GPU_CHECKS,
    check_ecc,
    check_gpu_count,
    check_mig,
    check_pcie,
    check_persistence,
    check_retired_memory,
    check_throttle,
    expects_whole_gpus,
    selected_devices,
)
from .libtorch import check_libtorch
from .nccl import NcclLibrary, check_nccl
from .report import ERROR, SKIPPED, CheckResult, HostReport
from .stack import STACK_CHECKS, check_cuda_driver, check_device_nodes, check_nouveau

CORE_CHECKS = ("gpu", "libtorch", "nccl", "data")
CHECK_NAMES = CORE_CHECKS + GPU_CHECKS + STACK_CHECKS


@dataclass
class ProbeOptions:
    """What to probe and where; every field is a plain JSON value (Ansible module parameters).

    data_path     shared dataset root ranks use (--data-path)
    skip_mount    skip the shared-data check (--skip-mount)
    libtorch_path explicit libtorch location (--libtorch-path); None: LIBTORCH, LIBTORCH_PATH,
                  <project_root>/libtorch, ~/.flodl/libtorch
    docker        compose service whose image provides NCCL (--docker); skips the host NCCL check
    project_root  directory holding fdl.yml (its libtorch/ tree; docker compose runs there)
    gpus          GPU selection: a list of indices or "all"/"0,1"; None: local_devices, then
                  CUDA_VISIBLE_DEVICES, else all
    local_devices the devices this host is declared to offer (a cluster worker's local_devices:
                  [0, 1], "0,1", or "cpu:N" for CPU ranks; `fdl probe --devices`/`--cpu`); a
                  declared GPU that is missing is an error (gpu_count); "cpu:N" makes this a
                  CPU host, whose GPU, NCCL, GPU health and stack checks are skipped
    whole_gpus    whether ranks get whole GPUs, so MIG mode on a selected GPU is an error;
                  None: yes, unless the ranks are CPU ranks or CUDA_VISIBLE_DEVICES names MIG
                  instances
    interpreter_setting  where the Python this probe runs under is configured, named in the hint
                  when libtorch is found nowhere (the fdl_probe module: a worker's `python:`);
                  None: nothing to name (fdl probe runs under fdl's own Python)
    """

    data_path: str = DEFAULT_DATA_PATH
    skip_mount: bool = False
    libtorch_path: str | None = None
    docker: str | None = None
    project_root: str | None = None
    gpus: list[int] | str | None = None
    local_devices: list[int] | str | None = None
    whole_gpus: bool | None = None
    interpreter_setting: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


A = TypeVar("A")
B = TypeVar("B")


def _guarded(name: str, run: Callable[[], tuple[CheckResult, A | None, B | None]]
             ) -> tuple[CheckResult, A | None, B | None]:
    """Run one check; a crash inside it becomes that check's error instead of losing the report."""
    try:
        return run()
    except Exception as exc:  # a probe reports; it must not die half-way through a host
        return (CheckResult(name, ERROR, f"The {name} check crashed: {type(exc).__name__}: {exc}.",
                            hint="this is a bug in fdl; rerun with --debug and report it",
                            data={"exception": type(exc).__name__}), None, None)


def run_probe(options: ProbeOptions | None = None, host: str | None = None,
              environ: Mapping[str, str] | None = None) -> HostReport:
    """Probe this host: GPU, libtorch, NCCL, shared data, then GPU health and the software stack.

    Later checks use earlier findings (the NVML inventory, the libtorch found);
    the order is CHECK_NAMES. The report's `time` is this host's wall clock
    when the probe started (the cluster probe compares clocks with it).
    """
    options = options or ProbeOptions()
    environ = os.environ if environ is None else environ
    root = read(FDL_PROBE_ROOT, environ) or "/"
    report = HostReport(host=host or socket.gethostname(), time=time.time())

    cpu = cpu_ranks(options.local_devices)
    if cpu is not None:
        return _cpu_host(report, options, cpu, environ)

    gpu, inventory, selection = _guarded("gpu", lambda: check_gpu(options.gpus, environ, options.local_devices))
    report.checks.append(gpu)

    def libtorch_check() -> tuple[CheckResult, Libtorch | None, None]:
        result, info = check_libtorch(options.libtorch_path, environ, options.project_root,
                                      inventory=inventory, selection=selection)
        return with_interpreter(result, options.interpreter_setting), info, None

    libtorch, info, _unused = _guarded("libtorch", libtorch_check)
    report.checks.append(libtorch)

    def nccl_check() -> tuple[CheckResult, NcclLibrary | None, None]:
        result, library = check_nccl(info, options.docker, options.project_root, environ)
        return result, library, None

    report.checks.append(_guarded("nccl", nccl_check)[0])
    report.checks.append(_single("data", lambda: check_data_path(options.data_path, options.skip_mount)))

    whole = expects_whole_gpus(options.whole_gpus, selection, options.local_devices)
    depth = (
        ("gpu_count", lambda: check_gpu_count(inventory, options.local_devices)),
        ("gpu_persistence", lambda: check_persistence(inventory, selection)),
        ("gpu_ecc", lambda: check_ecc(inventory, selection)),
        ("gpu_retired_memory", lambda: check_retired_memory(inventory, selection)),
        ("gpu_pcie", lambda: check_pcie(inventory, selection)),
        ("gpu_throttle", lambda: check_throttle(inventory, selection)),
        ("gpu_mig", lambda: check_mig(inventory, selection, whole)),
        ("nouveau", lambda: check_nouveau(root)),
        ("device_nodes", lambda: check_device_nodes(root, selected_devices(inventory, selection))),
        ("cuda_driver", lambda: check_cuda_driver(inventory, info)),
    )
    for name, run in depth:
        report.checks.append(_single(name, run))
    return report


def with_interpreter(result: CheckResult, setting: str | None = None) -> CheckResult:
    """Name the Python the probe ran under: the last place libtorch is looked for is that Python's PyTorch.

    A cluster worker is probed under its `python:` over SSH, and under fdl's own
    Python when it is this machine, so on one machine the two can see different
    PyTorch installs; the report says which interpreter each verdict is about,
    and, where `setting` says how that interpreter is chosen (a worker's
    `python:`), the hint names it.
    """
    result.data.setdefault("python", sys.executable)
    if result.status == ERROR and "tried" in result.data:  # nothing found anywhere, that Python's PyTorch included
        result.message += f" (The Python this probe ran under: {sys.executable}.)"
        if setting:
            named = (f"set {setting} to the interpreter of an environment that has PyTorch (its torch/lib is a "
                     f"libtorch), e.g. python: /path/to/venv/bin/python")
            result.hint = f"{result.hint}; or {named}" if result.hint else named
    return result


def cpu_ranks(local_devices: object) -> str | None:
    """"cpu:N" when the declared devices are CPU ranks (the host is then judged as a CPU host), else None."""
    if local_devices is None:
        return None
    try:
        devices = parse_devices(local_devices)
    except ValueError:  # not a device spec this probe can read; the GPU checks judge the host
        return None
    return str(devices) if devices.is_cpu else None


def _cpu_host(report: HostReport, options: ProbeOptions, cpu: str, environ: Mapping[str, str]) -> HostReport:
    """A CPU host: libtorch (no GPUs to cover) and the data path decide; every GPU-only check is skipped."""
    data = {"cpu_host": True, "declared": cpu}
    report.checks.append(CheckResult("gpu", SKIPPED, f"Not checked: this host runs CPU ranks ({cpu}), which "
                                                     f"need no GPU or NVIDIA driver.", data=dict(data)))
    report.checks.append(_single("libtorch", lambda: with_interpreter(
        check_libtorch(options.libtorch_path, environ, options.project_root)[0], options.interpreter_setting)))
    report.checks.append(CheckResult("nccl", SKIPPED, "Not checked: CPU ranks talk over gloo; NCCL is not used.",
                                     data=dict(data)))
    report.checks.append(_single("data", lambda: check_data_path(options.data_path, options.skip_mount)))
    for name in GPU_CHECKS + STACK_CHECKS:
        report.checks.append(CheckResult(name, SKIPPED, f"Not checked: a CPU host ({cpu}) uses no GPU.",
                                         data=dict(data)))
    return report


def _single(name: str, run: Callable[[], CheckResult]) -> CheckResult:
    return _guarded(name, lambda: (run(), None, None))[0]
