"""One host's readiness probe: the single entry point every caller uses.

    report = run_probe(ProbeOptions(data_path="/flodl/data", docker="cuda"))
    report.ok, report.to_dict()   # JSON-ready, schema in docs/probe.md

The local `fdl probe` calls it, and so does the Ansible probe module on each
cluster host (`run_probe(ProbeOptions(**params))`, returning `to_dict()`), so
ProbeOptions holds plain JSON values only and run_probe never raises for
anything it finds on the host: every finding is a CheckResult. A check that
crashes becomes an error result naming the crash.

Standard library (+ pynvml, inside the GPU check) only; sibling imports
relative, so this package doubles as Ansible module_utils.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass

from .data import DEFAULT_DATA_PATH, check_data_path
from .gpu import check_gpu
from .libtorch import check_libtorch
from .nccl import check_nccl
from .report import ERROR, CheckResult, HostReport

CHECK_NAMES = ("gpu", "libtorch", "nccl", "data")


@dataclass
class ProbeOptions:
    """What to probe and where; every field is a plain JSON value (Ansible module parameters).

    data_path     shared dataset root ranks use (--data-path)
    skip_mount    skip the shared-data check (--skip-mount)
    libtorch_path explicit libtorch location (--libtorch-path); None: LIBTORCH, LIBTORCH_PATH,
                  <project_root>/libtorch, ~/.flodl/libtorch
    docker        compose service whose image provides NCCL (--docker); skips the host NCCL check
    project_root  directory holding fdl.yml (its libtorch/ tree; docker compose runs there)
    gpus          GPU selection: a list of indices or "all"/"0,1"; None: CUDA_VISIBLE_DEVICES, else all
    """

    data_path: str = DEFAULT_DATA_PATH
    skip_mount: bool = False
    libtorch_path: str | None = None
    docker: str | None = None
    project_root: str | None = None
    gpus: list[int] | str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _guarded(name: str, run):
    """Run one check; a crash inside it becomes that check's error instead of losing the report."""
    try:
        return run()
    except Exception as exc:  # a probe reports; it must not die half-way through a host
        return (CheckResult(name, ERROR, f"The {name} check crashed: {type(exc).__name__}: {exc}.",
                            hint="this is a bug in fdl; rerun with --debug and report it",
                            data={"exception": type(exc).__name__}), None, None)


def run_probe(options: ProbeOptions | None = None, host: str | None = None, environ=None) -> HostReport:
    """Probe this host: GPU, libtorch, NCCL, shared data, in that order (later checks use earlier findings)."""
    options = options or ProbeOptions()
    environ = os.environ if environ is None else environ
    report = HostReport(host=host or socket.gethostname())

    gpu, inventory, selection = _guarded("gpu", lambda: check_gpu(options.gpus, environ))
    report.checks.append(gpu)

    def libtorch_check():
        result, info = check_libtorch(options.libtorch_path, environ, options.project_root,
                                      inventory=inventory, selection=selection)
        return result, info, None

    libtorch, info, _ = _guarded("libtorch", libtorch_check)
    report.checks.append(libtorch)

    def nccl_check():
        result, library = check_nccl(info, options.docker, options.project_root, environ)
        return result, library, None

    report.checks.append(_guarded("nccl", nccl_check)[0])
    report.checks.append(_guarded("data", lambda: (check_data_path(options.data_path, options.skip_mount),
                                                   None, None))[0])
    return report
