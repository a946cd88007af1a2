"""The one place fdl drives ansible-runner: every playbook fdl runs starts here.

The probe, the pre-flight build, the NCCL build and the sweep after a canceled
run are playbooks of the flodl.fdl collection run through `run_playbook()`
(those are the playbooks under playbooks/, the ones an Ansible user runs). What
else reaches a host goes over plain ssh with the same SSH settings
(fdl.cluster.ssh: the same ControlPath, so it rides the masters Ansible opened):
a run's live rank sessions, which stream output for hours (fdl.launch.dispatch,
which also says how a run is staged). A worker that is this machine goes through
the same playbooks without ssh (its inventory entry has `ansible_connection: local`).

    result = run_playbook(playbook("probe.yml"), inventory, extravars={...})
    for host in result.hosts.values():
        host.status, host.res, host.message      # ok | failed | unreachable | skipped | missing

What it settles once for every caller (the environment ansible-playbook runs
in, with its pinned settings and private ControlPath, is fdl.cluster.connection;
the per-host results read from runner events are fdl.cluster.events):

- A private data directory per inventory under the cache
  (`~/.cache/fdl/runner/<hash>`), artifacts rotated, no env files written
  (extra variables reach ansible-playbook through a 0600 file, never argv).
- Per-host results parsed live from runner events (fdl.cluster.events); an
  optional rich display of per-host progress on a terminal.
- Cancellation: Ctrl-C (or `cancel.set()`) stops ansible-playbook within a
  fraction of a second, then every host that was started is swept for
  processes of this run (they carry FDL_RUN_ID in their environment, set by
  each playbook's play-level `environment:`), so nothing is left running
  remotely.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fdl.cluster.connection import ansible_environment
from fdl.cluster.events import MISSING, OK, PENDING, RUNNING, SKIPPED, Collector, HostResult, RunnerEvent, keep_event
from fdl.cluster.inventory import ClusterInventory
from fdl.cluster.nodes import split
from fdl.errors import FdlError, RemoteError
from fdl.hostside.fsio import atomic_write
from fdl.hostside.paths import cache_dir
from fdl.progress import HostsProgress
from fdl.resources import playbook as shipped_playbook
from fdl.signals import Interrupts

RUN_ID_VAR = "fdl_run_id"  # extra variable every playbook exports as FDL_RUN_ID (play-level environment:)
KEEP_ARTIFACTS = 5
PEXPECT_TIMEOUT = 0.2  # how often ansible-runner polls the cancel flag
REAP_TIMEOUT = 30.0


@dataclass
class RunResult:
    """A finished playbook run: runner status and rc, and per-host results."""

    status: str  # successful | failed | canceled | timeout
    rc: int
    hosts: dict[str, HostResult]
    artifact_dir: Path
    run_id: str

    @property
    def ok(self) -> bool:
        return all(h.status in (OK, SKIPPED) for h in self.hosts.values())


def private_data_dir(inventory: ClusterInventory) -> Path:
    """~/.cache/fdl/runner/<hash of the inventory>: one per cluster, so concurrent clusters never share one."""
    digest = hashlib.sha256(json.dumps(inventory.to_ansible(), sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / "runner" / digest
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _write_private(path: Path, text: str) -> Path:
    """Write text to path atomically with mode 0600 (kept as it is when it already holds text)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        if path.read_text() == text:
            return path
    except (OSError, UnicodeDecodeError):
        pass
    atomic_write(path, text, mode=0o600)
    return path


def run_playbook(
    playbook: str | Path,
    inventory: ClusterInventory,
    *,
    extravars: dict[str, Any] | None = None,
    limit: Sequence[str] | None = None,
    on_event: Callable[[RunnerEvent], None] | None = None,
    progress: bool | None = None,
    cancel: threading.Event | None = None,
    timeout: float | None = None,
    title: str | None = None,
    return_at_stats: bool = False,
    ship: dict[str, dict[str, Path]] | None = None,
) -> RunResult:
    """Run a playbook against the inventory's hosts (or `limit`) and return per-host results.

    playbook: a path, or the file name of one of the collection's playbooks ("probe.yml").
    limit: host names to run on (default: every host in the inventory).
    on_event: called for every runner event (from ansible-runner's loop: keep it quick).
    progress: live per-host progress on stderr (default: when stderr is a terminal).
    cancel: set it from another thread to stop the run; Ctrl-C does the same in the main thread.
    timeout: seconds before the run is stopped (status "timeout").
    return_at_stats: return as soon as the play's final stats arrive (every host's result is in then), while
    ansible-playbook and ansible-runner wind down in the background (the interpreter's exit, the artifacts: a
    few tenths of a second); the next run_playbook call, and the end of the process, wait for that. For a
    caller whose next step is on the critical path (the launcher's rank sessions). The result's status is then
    "successful" or "failed" from the hosts, and its rc 0 or 2.
    ship: files a playbook reads on the machine that runs it, for hosts behind execution nodes: {host: {path
    relative to the playbook's directory: the file here}}; they travel in the job stream of the host's node (once
    per node), and a local task's command there runs in the playbook's directory, so those hosts' variables name
    them by the relative path (direct hosts' name the files here).

    Raises RemoteError when ansible-playbook itself fails before any host ran
    (a playbook or inventory it cannot read), and KeyboardInterrupt after a
    Ctrl-C, once the hosts have been swept.
    """
    path = Path(playbook)
    if not path.is_absolute() and not path.exists():
        path = shipped_playbook(str(playbook))
    if not path.is_file():
        raise FdlError(f"playbook {path} does not exist", hint="reinstall fdl if this is a shipped playbook")
    if limit is not None:
        unknown = [h for h in limit if h not in inventory.hosts]
        if unknown:
            raise FdlError(f"host(s) not in the cluster inventory: {', '.join(unknown)}; known hosts: "
                           f"{', '.join(inventory.hosts) or 'none'}")
        inventory = inventory.subset(list(limit))
    hosts = list(inventory.hosts)
    if not hosts:
        raise FdlError("there are no hosts to run on: the cluster has no workers",
                       hint="list them under cluster.workers in fdl.cluster.yml")

    settle()
    run_id = uuid.uuid4().hex
    pdd = private_data_dir(inventory)
    inventory_file = _write_private(pdd / "inventory" / "hosts.json", json.dumps(inventory.to_ansible()))
    variables = dict(extravars or {})
    variables[RUN_ID_VAR] = run_id
    vars_file = _write_private(pdd / "tmp" / f"{run_id}.json", json.dumps(variables))
    cancel = cancel or threading.Event()
    show = sys.stderr.isatty() if progress is None else progress
    display = HostsProgress(title or path.stem, hosts) if show else None
    collector = Collector(hosts, on_event, display)
    try:
        with Interrupts(cancel) as interrupts:
            if display is not None:
                display.start()
            def start() -> Any:
                direct, by_node = split(inventory, hosts)
                if by_node:  # some hosts are driven from execution nodes: a run in parts
                    return _run_split(inventory, direct, by_node, path, run_id, variables, vars_file, collector,
                                      cancel.is_set, timeout, ship)
                return _invoke(pdd, run_id, path, inventory_file, vars_file, len(hosts), timeout=timeout,
                               event_handler=collector, cancel_callback=cancel.is_set)

            try:
                runner = _until_stats(start, collector) if return_at_stats else start()
            finally:
                if display is not None:
                    display.stop()
            if runner is None:  # every host's result is in; the run winds down in the background
                ok = all(h.status in (OK, SKIPPED) for h in collector.hosts.values())
                result = RunResult(status="successful" if ok else "failed", rc=0 if ok else 2,
                                   hosts=collector.hosts, artifact_dir=pdd / "artifacts" / run_id, run_id=run_id)
            else:
                result = RunResult(status=runner.status, rc=int(runner.rc if runner.rc is not None else -1),
                                   hosts=collector.hosts, artifact_dir=Path(runner.config.artifact_dir),
                                   run_id=run_id)
            if result.status in ("canceled", "timeout"):
                started = [h.host for h in result.hosts.values() if h.status != PENDING]
                _sweep(inventory, started, run_id)
            if interrupts.signal is not None:
                raise KeyboardInterrupt
    finally:
        vars_file.unlink(missing_ok=True)
    for host in result.hosts.values():
        if host.status == PENDING:
            host.status = MISSING
            host.message = "the playbook did not run on this host"
        elif host.status == RUNNING:
            host.status = MISSING
            host.message = "the run stopped before this host finished"
    if result.status == "failed" and all(h.status == MISSING for h in result.hosts.values()):
        raise RemoteError(f"ansible-playbook failed before reaching any host (rc {result.rc}): "
                          f"{_stdout_tail(result.artifact_dir, collector.errors)}")
    return result


_winding_down: list[threading.Thread] = []  # runs returned at their final stats, still finishing


def _until_stats(start: Callable[[], Any], collector: Collector) -> Any | None:
    """Run start() (the ansible-runner call) in a thread of its own: its runner when it ends first, or None as soon
    as the play's final stats arrive, leaving the thread to finish (settle() waits for it). Ctrl-C and `cancel`
    work as inline: the runner polls the cancel flag and ends the thread."""
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(start())
        except BaseException as exc:  # handed to the caller while it waits; after the stats, the outcome is in
            box.append(exc)

    thread = threading.Thread(target=target, name="fdl-ansible-run")
    thread.start()
    while thread.is_alive():
        if collector.stats.wait(0.05):
            _winding_down.append(thread)
            return None
    thread.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def settle() -> None:
    """Wait for every run that returned at its final stats to finish (its process exit, its artifacts)."""
    while _winding_down:
        _winding_down.pop().join()


def _stdout_tail(artifact_dir: Path, errors: list[str], lines: int = 8) -> str:
    text = "\n".join(errors).strip()
    if not text:
        try:
            text = (artifact_dir / "stdout").read_text(errors="replace").strip()
        except OSError:
            text = ""
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(tail) or "no output (see the artifacts in " + str(artifact_dir) + ")"


def _sweep(inventory: ClusterInventory, hosts: list[str], run_id: str) -> None:
    """After a cancel: stop every process of this run left on the hosts (best effort, bounded); hosts behind an
    execution node are swept from it."""
    if not hosts:
        return
    sub = inventory.subset(hosts)
    pdd = private_data_dir(sub)
    inventory_file = _write_private(pdd / "inventory" / "hosts.json", json.dumps(sub.to_ansible()))
    reap_id = uuid.uuid4().hex
    variables = {"fdl_reap_run_id": run_id, RUN_ID_VAR: reap_id}
    vars_file = _write_private(pdd / "tmp" / f"{reap_id}.json", json.dumps(variables))
    deadline = time.monotonic() + REAP_TIMEOUT
    try:
        direct, by_node = split(sub, list(sub.hosts))
        if by_node:
            _run_split(sub, direct, by_node, shipped_playbook("reap.yml"), reap_id, variables, vars_file,
                       Collector(list(sub.hosts), None, None), lambda: time.monotonic() > deadline, REAP_TIMEOUT,
                       None)
        else:
            _invoke(pdd, reap_id, shipped_playbook("reap.yml"), inventory_file, vars_file, len(hosts),
                    timeout=REAP_TIMEOUT, event_handler=None, cancel_callback=lambda: time.monotonic() > deadline)
    finally:
        vars_file.unlink(missing_ok=True)


def _run_split(inventory: ClusterInventory, direct: list[str], by_node: dict[str, list[str]], playbook: Path,
               run_id: str, variables: dict[str, Any], vars_file: Path, collector: Collector,
               cancel_callback: Callable[[], bool], timeout: float | None,
               ship: dict[str, dict[str, Path]] | None) -> Any:
    """One run in parts, all at once into `collector`: the direct hosts through ansible-playbook here, and each
    execution node's hosts through ansible-runner's worker on that node (fdl.cluster.nodes)."""
    from fdl.cluster import nodes

    parts: list[nodes.Part] = []
    if direct:
        sub = inventory.subset(direct)
        direct_pdd = private_data_dir(sub)
        direct_inventory = _write_private(direct_pdd / "inventory" / "hosts.json", json.dumps(sub.to_ansible()))

        def run_direct(handler: Callable[[dict[str, Any]], bool]) -> Any:
            return _invoke(direct_pdd, run_id, playbook, direct_inventory, vars_file, len(direct), timeout=timeout,
                           event_handler=handler, cancel_callback=cancel_callback)

        parts.append(nodes.Part(name="", hosts=direct, direct=run_direct))
    try:
        variables_json = json.dumps(variables)
        for node, names in by_node.items():
            sub = inventory.subset(names)
            node_pdd = private_data_dir(sub)
            _rotate(node_pdd / "artifacts", KEEP_ARTIFACTS - 1)
            files = {rel: path for name in names for rel, path in (ship or {}).get(name, {}).items()}
            parts.append(nodes.node_part(inventory, node, names, node_pdd, run_id, playbook,
                                         json.dumps(sub.to_ansible()), variables_json, files))
        return nodes.run_parts(parts, run_id=run_id, collector=collector, cancel=cancel_callback, timeout=timeout)
    finally:
        for part in parts:
            nodes.remove_job(part)


def _rotate(artifacts: Path, keep: int) -> None:
    """Keep the newest `keep` run directories under artifacts/ (ansible-runner rotates a direct run's itself)."""
    try:
        runs = sorted((p for p in artifacts.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    except OSError:
        return
    for old in runs[:-keep] if keep > 0 else runs:
        shutil.rmtree(old, ignore_errors=True)


def _invoke(pdd: Path, ident: str, playbook: Path, inventory_file: Path, vars_file: Path, forks: int, *,
            timeout: float | None, event_handler: Callable[[dict[str, Any]], bool] | None,
            cancel_callback: Callable[[], bool]) -> Any:
    """The one ansible_runner.run call: fdl's environment, extra variables from a 0600 file, quiet, rotated."""
    import ansible_runner

    cmdline = f"-e @{shlex.quote(str(vars_file))}"
    return ansible_runner.run(
        private_data_dir=str(pdd), ident=ident, playbook=str(playbook), inventory=str(inventory_file),
        cmdline=cmdline, envvars=ansible_environment(forks), forks=forks,
        quiet=True, rotate_artifacts=KEEP_ARTIFACTS, suppress_env_files=True,
        settings={"pexpect_timeout": PEXPECT_TIMEOUT, "suppress_ansible_output": True},
        timeout=int(timeout) if timeout else None, event_handler=event_handler or keep_event,
        cancel_callback=cancel_callback)


def prepare_nodes(inventory: ClusterInventory, names: Sequence[str] | None = None, *, wheelhouse: Path | None = None,
                  progress: bool | None = None) -> Any:
    """Run the flodl.fdl.execution_node playbook on the cluster's execution nodes (or `names`): the virtualenv with
    this environment's ansible-core and ansible-runner, from the index or from `wheelhouse` (a directory of wheels
    here, copied over). Returns the run's RunResult: each node's report is its
    `fdl_execution_node_report` fact."""
    from fdl.cluster import nodes
    from fdl.cluster.inventory import NODES_GROUP

    targets = list(names) if names is not None else list(inventory.groups.get(NODES_GROUP, []))
    extravars: dict[str, Any] = {"fdl_execution_node_packages": nodes.pinned_packages(),
                                 "fdl_execution_node_constraints": nodes.constraint_lines(),
                                 "fdl_execution_node_wheelhouse": str(wheelhouse) if wheelhouse else ""}
    return run_playbook(nodes.PREPARE_PLAYBOOK, inventory, extravars=extravars, limit=targets, progress=progress,
                        title="execution nodes")
