"""The all-reduce smoke test, before it runs: what a host offers, and the rank program.

The probe step of the fdl_probe role's collective entry point runs this on every host (module fdl_probe with
collective: true): the ranks the host offers (`offered`) and whether its Python imports PyTorch
(`TorchCheck`, the rank program's --check, started before the probe's own checks and run beside them), as
`offer`, which every host of the play then reads. The rank
program is allreduce.py beside this file; its results are `fdl-collective {json}` lines (`parse_line`).
What runs the ranks is ranks.py, kept apart so that the probe's payload carries no rank supervisor.

Standard library only (the rank program imports PyTorch itself), Python 3.8: shipped to hosts as the
collection's module_utils.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict

from ..checks.devices import Devices, parse_devices
from ..checks.probe import ProbeOptions, run_probe
from ..checks.report import HostReport
from . import allreduce

PREFIX = allreduce.PREFIX
DEFAULT_CPU_RANKS = 2  # what a host offers that declares every GPU and has none
CHECK_TIMEOUT_S = 30.0  # the PyTorch check on a host (`import torch`, slow on a loaded box)

Event = Dict[str, Any]


def parse_line(line: str) -> Event | None:
    """The event a rank printed on this line, or None for any other output."""
    text = line.strip()
    if not text.startswith(PREFIX):
        return None
    try:
        event = json.loads(text[len(PREFIX):])
    except ValueError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def program_source() -> str:
    """The rank program's source: read through its loader, so it also comes out of a module's payload."""
    loader = getattr(allreduce, "__loader__", None)
    source = loader.get_source(allreduce.__name__) if loader is not None and hasattr(loader, "get_source") else None
    if source is None:
        with open(allreduce.__file__, encoding="utf-8") as handle:
            source = handle.read()
    return str(source)


def write_program(directory: str) -> str:
    """The rank program as a file in `directory` (a private one of the caller's); returns its path."""
    path = os.path.join(directory, "allreduce.py")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(program_source())
    return path


def selected_gpus(report: dict[str, Any]) -> list[int] | None:
    """The GPU ids a probe report (dict form) selected, or None when it found no GPU."""
    gpu = next((c for c in report.get("checks", []) if c.get("name") == "gpu"), None)
    if gpu is None:
        return None
    ids = [d["index"] for d in (gpu.get("data") or {}).get("devices", []) if d.get("selected")]
    return ids or None


def offered(declared: str | None, report: dict[str, Any]) -> tuple[list[int] | None, int]:
    """(GPU ids or None for CPU ranks, rank count) a host offers the test: what it declares (cpu:N or GPU
    ids); declaring every GPU, the GPUs its probe selected, and without any GPU, DEFAULT_CPU_RANKS CPU ranks.
    Raises ValueError for a declaration that does not parse."""
    devices = parse_devices(declared) if declared not in (None, "") else Devices()
    if devices.is_cpu:
        return None, devices.count
    if devices.ids is not None:
        return list(devices.ids), len(devices.ids)
    gpus = selected_gpus(report)
    return (gpus, len(gpus)) if gpus else (None, DEFAULT_CPU_RANKS)


class TorchCheck:
    """Whether `python` imports PyTorch, asked in a child process (the rank program's --check), which runs
    while its caller does other work (the probe's own checks) until `result()`."""

    def __init__(self, python: str, program: str, *, timeout: float = CHECK_TIMEOUT_S,
                 env: dict[str, str] | None = None) -> None:
        self.python = python
        self.timeout = timeout
        self.started = time.monotonic()
        self.proc: subprocess.Popen[bytes] | None = None
        self.error: str | None = None
        try:
            # ansible-bad-function (a module should call run_command, ansible-test 2.21): run_command waits for
            # its child and has no timeout, and this check runs beside the probe's own checks, bounded by one
            self.proc = subprocess.Popen(  # pylint: disable=ansible-bad-function
                [python, program, "--check"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=env)
        except OSError as exc:
            self.error = f"cannot run {python}: {exc.strerror or exc}"

    def result(self) -> dict[str, str]:
        """{"torch": version}, {"skipped": why} when it cannot import PyTorch, {"error": why} when the check
        itself could not run (no such interpreter, no answer within the timeout)."""
        if self.proc is None:
            return {"error": self.error or f"cannot run {self.python}"}
        left = max(0.0, self.timeout - (time.monotonic() - self.started))
        try:
            out, err = self.proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return {"error": f"{self.python} did not answer the PyTorch check within {self.timeout:.0f} s"}
        for line in out.decode("utf-8", "replace").splitlines():
            event = parse_line(line)
            if event is None:
                continue
            if event.get("event") == "torch":
                return {"torch": str(event.get("version"))}
            if event.get("event") == "error" and event.get("kind") == "torch-missing":
                return {"skipped": f"{self.python}: {event.get('detail')}"}
        said = (err.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
        return {"error": f"the PyTorch check could not run with {self.python} (exit {self.proc.returncode}): {said}"}


def offer(host: str, declared: str | None, report: dict[str, Any], check: TorchCheck) -> dict[str, Any]:
    """What `host` offers the smoke test, as every host of the play reads it: {"host", "gpus", "ranks",
    and "torch" (its version), "skipped" (why not: PyTorch missing) or "error" (the check could not run)},
    from its declared devices, its probe report, and the PyTorch check started before the probe."""
    found = check.result()
    try:
        gpus, count = offered(declared, report)
    except ValueError as exc:
        return {"host": host, "gpus": None, "ranks": 0, "error": f"its devices {declared!r}: {exc}"}
    return {"host": host, "gpus": gpus, "ranks": count if "torch" in found else 0, **found}


def probe_and_offer(options: ProbeOptions, host: str | None, declared: str | None,
                    collective: bool) -> tuple[HostReport, dict[str, Any] | None]:
    """The fdl_probe module's work: the host's probe report and, with `collective`, what it offers the smoke
    test, the PyTorch check started first and run beside the probe's own checks (None without)."""
    directory = tempfile.mkdtemp(prefix="fdl-collective-") if collective else None
    check = None
    try:
        # the smoke test's PyTorch check (an `import torch`: seconds) runs beside the probe's own checks
        check = TorchCheck(sys.executable, write_program(directory)) if directory else None
        report = run_probe(options, host=host)
        return report, (offer(report.host, declared, report.to_dict(), check) if check is not None else None)
    finally:
        if check is not None and check.proc is not None and check.proc.poll() is None:
            check.proc.kill()  # the probe itself failed: the check's answer is not wanted
            check.proc.wait()
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
