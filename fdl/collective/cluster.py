"""The all-reduce smoke test across a cluster (`fdl @cluster probe --collective`), through the launcher.

    per host: `python - --check` (the rank script on stdin: can PyTorch be imported?)
      -> hosts that cannot import it are left out (a warning naming them)
      -> the launcher's run, unchanged: controller in-process, the hosts join, the world forms over every
         offered device of every remaining host (nccl when every rank has a GPU, else gloo), staging over
         Ansible (rank supervisor, rank spec, the rank script as the run's program), one RemoteSession per
         host (a LocalSession for this machine's own worker)
      -> every rank's `fdl-collective` lines, read from the launcher's rank output, go to results.aggregate

The time limit bounds all of it: the check, staging, the ranks (they measure
within 3/4 of what is left when the world forms) and, if it strikes, the
launcher's own stop (the run is failed, every host's ranks are stopped and the
hosts swept), after which the result is marked abandoned.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from fdl.collective.results import CollectiveResult, aggregate, parse_line
from fdl.collective.run import (
    DEFAULT_CPU_RANKS,
    SCRIPT,
    CollectiveOptions,
    Collector,
    script_argv,
    selected_gpus,
)
from fdl.config.schema import ClusterSpec, CommandSpec, JoinPolicy, WorkerSpec
from fdl.errors import FdlError
from fdl.hostside.checks.devices import Devices
from fdl.launch.build import BuildJob
from fdl.launch.plan import plan_launch
from fdl.launch.printer import Printer
from fdl.launch.run import Launcher, RunFailed

COMMAND = "fdl-collective"  # the launcher command's name: bin/fdl-collective/ on every host
CHECK_TIMEOUT_S = 30.0
RANK_LINE = re.compile(r"^\[[^/\]]+/(\d+)\] (.*)$")  # "[host/rank] line", as the launcher prints rank output


class _RankSink(io.TextIOBase):
    """The launcher Printer's stdout: rank lines to a Collector (events and failure tails), the rest dropped."""

    def __init__(self, collector: Collector):
        self.collector = collector

    def write(self, text: str) -> int:
        for line in text.splitlines():
            match = RANK_LINE.match(line)
            if match:
                self.collector(int(match[1]), match[2])
        return len(text)


class _Null(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


def offered_devices(worker: WorkerSpec, report: dict | None) -> Devices:
    """What a worker offers the test: its local_devices; for "all GPUs", the GPUs its probe selected, and
    without any GPU, DEFAULT_CPU_RANKS CPU ranks."""
    devices = worker.local_devices
    if devices.is_cpu or devices.ids is not None:
        return devices
    gpus = selected_gpus(report or {})
    return Devices(ids=tuple(gpus)) if gpus else Devices(kind="cpu", count=DEFAULT_CPU_RANKS)


def check_torch(worker: WorkerSpec, ssh: list[str] | None, timeout: float) -> tuple[bool, str]:
    """(True, "torch VERSION") when the worker's python imports PyTorch; (False, why) otherwise.

    The rank script runs with --check from stdin (nothing is staged yet): over ssh for a remote host
    (ssh: its ssh_argv), here for this machine's own worker (ssh None). Raises FdlError when the host
    could not be asked at all (unreachable, no such interpreter, no answer in time).
    """
    command = [worker.python, "-", "--check"]
    env_words = [f"{k}={v}" for k, v in worker.env]
    if ssh is None:
        argv, env = command, {**os.environ, **dict(worker.env)}
    else:
        argv, env = [*ssh, shlex.join(["env", *env_words, *command] if env_words else command)], None
    try:
        done = subprocess.run(argv, input=SCRIPT.read_text(), capture_output=True, text=True, timeout=timeout,
                              check=False, env=env)
    except subprocess.TimeoutExpired:
        raise FdlError(f"{worker.host} did not answer the PyTorch check within {timeout:.0f} s") from None
    except OSError as exc:
        raise FdlError(f"cannot check PyTorch on {worker.host}: {exc.strerror or exc}") from None
    for line in done.stdout.splitlines():
        event = parse_line(line)
        if event is None:
            continue
        if event.get("event") == "torch":
            return True, f"torch {event.get('version')}"
        if event.get("event") == "error" and event.get("kind") == "torch-missing":
            return False, f"{worker.python}: {event.get('detail')}"
    said = (done.stderr.strip().splitlines() or ["no output"])[-1]
    raise FdlError(f"the PyTorch check could not run on {worker.host} with {worker.python} "
                   f"(exit {done.returncode}): {said}")


def _checks(cluster: ClusterSpec, root: Path | None, timeout: float) -> tuple[list[WorkerSpec], dict, list[str]]:
    """Every worker's PyTorch check at once: (workers that have it, {host: why not}, [failures])."""
    from fdl.cluster.inventory import build_inventory, is_this_machine
    from fdl.cluster.ssh import ssh_argv

    inventory = build_inventory(cluster, root)
    answers: dict[str, tuple[bool, str] | FdlError] = {}

    def ask(worker: WorkerSpec) -> None:
        local = is_this_machine(worker.address, worker.port)
        try:
            answers[worker.host] = check_torch(worker, None if local else ssh_argv(inventory.hosts[worker.host]),
                                               timeout)
        except FdlError as exc:
            answers[worker.host] = exc

    threads = [threading.Thread(target=ask, args=(w,), daemon=True) for w in cluster.workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    kept, skipped, failures = [], {}, []
    for worker in cluster.workers:
        answer = answers.get(worker.host)
        if isinstance(answer, FdlError) or answer is None:
            failures.append(str(answer.message if answer is not None else f"{worker.host}: no answer"))
        elif answer[0]:
            kept.append(worker)
        else:
            skipped[worker.host] = answer[1]
    return kept, skipped, failures


def _shebanged(directory: Path, host: str, python: str) -> Path:
    """The rank script as one host's program: its python on the #! line, executable (rsync keeps the mode)."""
    path = directory / host / SCRIPT.name
    path.parent.mkdir(parents=True)
    path.write_text(f"#!{python}\n" + SCRIPT.read_text())
    path.chmod(0o755)
    return path


def run_cluster(config, options: CollectiveOptions, reports: dict[str, dict] | None = None, *,
                notes: bool = True, progress: bool | None = None) -> CollectiveResult:
    """The smoke test over every offered device of every worker of config.cluster whose python has PyTorch.

    reports: each host's probe report (dict form) by host name, to resolve workers offering "all" GPUs.
    notes: the launcher's notes on stderr (False: silent).
    """
    started = time.monotonic()
    limit = options.time_limit_s
    cluster: ClusterSpec = config.cluster
    root = Path(config.root) if getattr(config, "root", None) is not None else Path.cwd()
    workers = tuple(w._replace(local_devices=offered_devices(w, (reports or {}).get(w.host)))
                    for w in cluster.workers)
    cluster = cluster._replace(workers=workers)
    kept, skipped, failures = _checks(cluster, root, min(CHECK_TIMEOUT_S, limit / 2))
    if failures:
        result = aggregate([], skipped_hosts=skipped, time_limit_s=limit,
                           elapsed_s=round(time.monotonic() - started, 3))
        result.failure = "; ".join(failures)
        return result
    if not kept:
        return aggregate([], skipped_hosts=skipped, time_limit_s=limit,
                         elapsed_s=round(time.monotonic() - started, 3))

    # The probe's own window: every kept worker on the roster, the world forms as soon as they are in.
    ctl = cluster.controller
    cluster = cluster._replace(workers=tuple(kept), controller=ctl._replace(join=JoinPolicy()))
    left = max(1.0, limit - (time.monotonic() - started))
    args = script_argv(replace(options, time_limit_s=left))[2:]  # the program is the shipped script itself
    spec = CommandSpec(name=COMMAND, cluster=True, bin=str(SCRIPT), args=tuple(args))
    plan = plan_launch(spec, (), cluster, root)
    assert plan is not None
    collector = Collector()
    launcher = _CollectiveLauncher(plan, collector, notes=notes, progress=progress)
    timer = threading.Timer(max(0.0, limit - (time.monotonic() - started)), launcher.abandon)
    timer.daemon = True
    timer.start()
    failure = None
    try:
        launcher.run()
    except FdlError as exc:
        failure = exc.message
    except OSError as exc:  # the controller could not bind its port
        failure = f"the probe's controller could not start on {plan.bind}:{plan.port}: {exc.strerror or exc}"
    finally:
        timer.cancel()
        launcher.cleanup()
    result = aggregate(collector.events, skipped_hosts=skipped, abandoned=launcher.abandoned.is_set(),
                       time_limit_s=limit, elapsed_s=round(time.monotonic() - started, 3))
    if failure and not result.finished and not result.errors and not result.abandoned:
        named = re.search(r"rank (\d+)", failure)
        lines = collector.tails.get(int(named[1])) if named else None
        said = f" (it said: {lines[-1]})" if lines else ""
        result.failure = failure.split(". Controller state")[0].rstrip(".") + said
    return result


class _CollectiveLauncher(Launcher):
    """The launcher with the rank script as every host's program (nothing to build) and a time limit."""

    def __init__(self, plan, collector: Collector, *, notes: bool, progress: bool | None):
        super().__init__(plan, printer=Printer(out=_RankSink(collector), err=None if notes else _Null()),
                         progress=progress)
        self.abandoned = threading.Event()
        self.scripts = Path(tempfile.mkdtemp(prefix="fdl-collective-"))

    def abandon(self) -> None:
        """The time limit: fail the run, so the launcher stops every host's ranks (and sweeps if it must)."""
        self.abandoned.set()
        self.printer.note("the smoke test's time limit struck: stopping every rank")
        self._fail("abandoned: the smoke test's time limit struck")

    def cleanup(self) -> None:
        shutil.rmtree(self.scripts, ignore_errors=True)

    def _build(self) -> dict[str, BuildJob]:
        jobs = {}
        for host in self.plan.hosts:
            script = _shebanged(self.scripts, host.name, host.python)
            jobs[host.name] = BuildJob(host=host.name, arch=host.arch, recipe=None, target_dir=None, env={},
                                       log=self.scripts / f"{host.name}.log", artifact=script, libtorch=None)
        return jobs

    def _sessions(self, jobs, specs):
        if self.abandoned.is_set():
            raise RunFailed("abandoned before any rank started")
        sessions = super()._sessions(jobs, specs)
        if self.abandoned.is_set():  # the limit struck while staging: start nothing
            raise RunFailed("abandoned before any rank started")
        return sessions
