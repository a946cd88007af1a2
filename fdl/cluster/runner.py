"""The one place fdl drives ansible-runner: every playbook fdl runs starts here.

The probe, the pre-flight build, the NCCL build and the sweep after a canceled
run are playbooks of the flodl.fdl collection run through `run_playbook()`
(those are the playbooks under playbooks/, the ones an Ansible user runs). What
else reaches a host goes over plain ssh with this module's SSH settings
(fdl.cluster.ssh: the same ControlPath, so it rides the masters Ansible opened):
a run's live rank sessions, which stream output for hours (fdl.launch.dispatch,
which also says how a run is staged), and the all-reduce smoke test's PyTorch
check (fdl.collective.cluster). A worker that is this machine is reached
without ssh (its inventory entry has `ansible_connection: local`).

    result = run_playbook(playbook("probe.yml"), inventory, extravars={...})
    for host in result.hosts.values():
        host.status, host.res, host.message      # ok | failed | unreachable | skipped | missing

What it settles once for every caller:

- ansible-playbook is the one installed next to fdl (this environment's
  scripts directory goes first on PATH); the playbooks, roles and modules
  are the flodl.fdl collection fdl ships (ANSIBLE_COLLECTIONS_PATH points at
  it, fdl.resources), with its own module_utils only; the shipped ansible.cfg
  is the configuration, and the settings that matter are pinned in the environment
  so a stray ANSIBLE_* variable cannot undo them: pipelining on, facts off,
  host keys checked by ssh (`StrictHostKeyChecking=accept-new`: learn a new
  host once, refuse a changed key), persistent SSH masters under a short,
  stable control path so the next run reuses them.
- forks = the number of hosts; every host's interpreter comes from the
  inventory (`ansible_python_interpreter`), never from discovery.
- A private data directory per inventory under the cache
  (`~/.cache/fdl/runner/<hash>`), artifacts rotated, no env files written
  (extra variables reach ansible-playbook through a 0600 file, never argv).
- Per-host results parsed live from runner events; an optional rich display
  of per-host progress on a terminal.
- Cancellation: Ctrl-C (or `cancel.set()`) stops ansible-playbook within a
  fraction of a second, then every host that was started is swept for
  processes of this run (they carry FDL_RUN_ID in their environment, set by
  each playbook's play-level `environment:`), so nothing is left running
  remotely.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import shlex
import stat
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fdl.cluster.inventory import ClusterInventory
from fdl.collection import RELATIVE
from fdl.errors import FdlError, RemoteError
from fdl.fsio import atomic_write
from fdl.paths import cache_dir, runtime_dir
from fdl.progress import HostsProgress
from fdl.resources import ansible_cfg, collections_path
from fdl.resources import playbook as shipped_playbook
from fdl.signals import Interrupts

RUN_ID_VAR = "fdl_run_id"  # extra variable every playbook exports as FDL_RUN_ID (play-level environment:)
KEEP_ARTIFACTS = 5
VALIDATION_TAG = "always"  # the tag Ansible gives a role's argument-validation task (no fdl task uses it)
PEXPECT_TIMEOUT = 0.2  # how often ansible-runner polls the cancel flag
REAP_TIMEOUT = 30.0
_MAX_SOCKET_PATH = 104  # sun_path is 108 bytes; ssh appends ".XXXXXXXXXXXXXXXX" while it binds

# ansible.cfg key -> the environment variable that would override it (pinned from the shipped file)
_PINNED = {
    ("defaults", "gathering"): "ANSIBLE_GATHERING",
    ("defaults", "host_key_checking"): "ANSIBLE_HOST_KEY_CHECKING",
    ("defaults", "interpreter_python"): "ANSIBLE_PYTHON_INTERPRETER",
    ("defaults", "retry_files_enabled"): "ANSIBLE_RETRY_FILES_ENABLED",
    ("ssh_connection", "pipelining"): "ANSIBLE_PIPELINING",
    ("ssh_connection", "ssh_args"): "ANSIBLE_SSH_ARGS",
    ("ssh_connection", "control_path"): "ANSIBLE_SSH_CONTROL_PATH",
    ("ssh_connection", "timeout"): "ANSIBLE_TIMEOUT",
}

OK, FAILED, UNREACHABLE, SKIPPED, PENDING, RUNNING, MISSING = (
    "ok", "failed", "unreachable", "skipped", "pending", "running", "missing")


@dataclass
class TaskOutcome:
    """One task's result on one host; `res` is the module's return (None for skipped tasks)."""

    task: str
    status: str
    res: dict[str, Any] | None = None
    duration: float | None = None


@dataclass
class HostResult:
    """Everything one host did in a run.

    status: pending (nothing yet), running, ok, failed, unreachable, skipped
    (every task skipped) or missing (the playbook never ran on it).
    """

    host: str
    status: str = PENDING
    tasks: list[TaskOutcome] = field(default_factory=list)
    message: str | None = None  # why it failed or was unreachable, as Ansible/SSH said it
    current_task: str | None = None
    started: float | None = None
    finished: float | None = None

    @property
    def res(self) -> dict[str, Any] | None:
        """The last module return this host produced (the playbook's answer for one-task playbooks)."""
        for outcome in reversed(self.tasks):
            if outcome.res is not None:
                return outcome.res
        return None


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


@dataclass(frozen=True)
class RunnerEvent:
    """A runner event, trimmed to what callers use; `raw` is the full event."""

    kind: str  # runner event name without the prefix: on_start, on_ok, on_failed, ...
    host: str | None
    task: str | None
    res: dict[str, Any] | None
    raw: dict[str, Any] = field(repr=False, default_factory=dict)


# --------------------------------------------------------------------------- environment


def ansible_bin_dir() -> Path:
    """The scripts directory of fdl's own environment, which must hold ansible-playbook."""
    scripts = Path(sysconfig.get_path("scripts"))
    if not (scripts / "ansible-playbook").exists():
        alt = Path(sys.executable).parent  # a venv's bin when sysconfig points elsewhere
        if (alt / "ansible-playbook").exists():
            return alt
        raise FdlError(
            f"ansible-playbook is not installed next to fdl (looked in {scripts}). fdl runs the Ansible that is "
            f"installed with it (ansible-core is one of its dependencies).",
            hint="reinstall fdl into this environment: pip install --force-reinstall fdl")
    return scripts


def _fits(directory: Path) -> bool:
    return len(str(directory)) + 1 + 40 + 17 <= _MAX_SOCKET_PATH


def control_path_dir() -> Path:
    """Where persistent SSH masters live: private, short and stable, so later runs find them.

    $XDG_RUNTIME_DIR/fdl-cp first (a per-user tmpfs the system made 0700),
    then ~/.cache/fdl/cp, then /tmp/fdl-cp-<uid> when both paths are too long
    for a socket. `ready_control_path_dir` checks it before use.
    """
    runtime = runtime_dir()
    if runtime is not None and _fits(runtime / "fdl-cp"):
        return runtime / "fdl-cp"
    preferred = cache_dir() / "cp"
    if _fits(preferred):
        return preferred
    return Path(tempfile.gettempdir()) / f"fdl-cp-{os.getuid()}"


def ready_control_path_dir() -> Path:
    """The ControlPath directory, created 0700 and checked: a real directory, owned by this user, private.

    Anyone who can write there can swap a master socket for their own and sit
    in the middle of every multiplexed ssh session Ansible and dispatch open,
    so a directory that fails any check is refused, never used or repaired.
    """
    directory = control_path_dir()
    try:
        directory.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise FdlError(f"cannot create the ssh ControlPath directory {directory}: {exc.strerror}.",
                       hint="Set XDG_RUNTIME_DIR or XDG_CACHE_HOME to a private directory of yours.") from None
    try:
        st = os.lstat(directory)
    except OSError as exc:
        raise FdlError(f"cannot inspect the ssh ControlPath directory {directory}: {exc.strerror}.") from None
    problems = []
    if stat.S_ISLNK(st.st_mode):
        problems.append("it is a symbolic link")
    elif not stat.S_ISDIR(st.st_mode):
        problems.append("it is not a directory")
    if st.st_uid != os.getuid():
        problems.append(f"it belongs to uid {st.st_uid}, not to you (uid {os.getuid()})")
    if st.st_mode & 0o077:
        problems.append(f"its mode is {stat.S_IMODE(st.st_mode):04o}, not 0700")
    if problems:
        raise FdlError(
            f"the ssh ControlPath directory {directory} is not private: {'; '.join(problems)}. Whoever can write "
            f"there can take over the multiplexed ssh sessions fdl's Ansible and dispatch ride on, so fdl does "
            f"not use it.",
            hint=f"If it is yours, `rm -rf {directory}` and run again; if another user made it, ask an "
                 f"administrator to remove it, or set XDG_RUNTIME_DIR (or a shorter XDG_CACHE_HOME) so fdl uses "
                 f"a directory of your own.")
    return directory


def _pinned_settings(cfg: Path) -> dict[str, str]:
    parser = configparser.RawConfigParser()
    parser.read(cfg)
    pinned = {}
    for (section, key), var in _PINNED.items():
        if parser.has_option(section, key):
            pinned[var] = parser.get(section, key)
    return pinned


def ansible_environment(forks: int) -> dict[str, str]:
    """Environment overrides for an ansible-playbook started by fdl."""
    cfg = ansible_cfg()
    cp_dir = ready_control_path_dir()
    collections = collections_path()
    env = _pinned_settings(cfg)
    env.update({
        "ANSIBLE_CONFIG": str(cfg),
        # The flodl.fdl collection fdl ships (the wheel's, or a clone's built into the cache), and no other.
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        # A clone's ansible.cfg serves the fdl package as module_utils for Ansible users in place; fdl's runs use
        # the collection's copies of that code alone (else AnsiballZ would bundle both into every module).
        "ANSIBLE_MODULE_UTILS": str(collections / RELATIVE / "plugins" / "module_utils"),
        "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "False",
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(cp_dir),
        "ANSIBLE_FORKS": str(forks),
        # fdl hands ansible-playbook a JSON inventory: loading the other inventory plugins (and parsing their
        # documentation) would cost a third of a second per run.
        "ANSIBLE_INVENTORY_ENABLED": "yaml",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "PATH": os.pathsep.join([str(ansible_bin_dir()), os.environ.get("PATH", os.defpath)]),
    })
    return env


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


# --------------------------------------------------------------------------- events


class _Collector:
    """Turns runner events into HostResults (called live from ansible-runner's loop; keep it fast)."""

    def __init__(self, hosts: Sequence[str], on_event: Callable[[RunnerEvent], None] | None,
                 progress: HostsProgress | None):
        self.hosts = {name: HostResult(host=name) for name in hosts}
        self.on_event = on_event
        self.progress = progress
        self.errors: list[str] = []
        self.stats = threading.Event()  # the play's final stats arrived: every host's result is in

    def _host(self, name: str) -> HostResult:
        if name not in self.hosts:  # a host the play added (add_host, delegate_to): track it too
            self.hosts[name] = HostResult(host=name)
        return self.hosts[name]

    def __call__(self, event: dict[str, Any]) -> bool:
        name = event.get("event", "")
        data = event.get("event_data") or {}
        host_name = data.get("host")
        task = data.get("task")
        res = data.get("res") if isinstance(data.get("res"), dict) else None
        if name.startswith("runner_") and host_name:
            host = self._host(host_name)
            kind = name[len("runner_"):]
            if kind == "on_start":
                host.status = RUNNING if host.status == PENDING else host.status
                host.current_task = task
                host.started = host.started or time.monotonic()
            elif kind in ("on_ok", "on_failed", "on_unreachable", "on_skipped"):
                status = {"on_ok": OK, "on_failed": FAILED, "on_unreachable": UNREACHABLE,
                          "on_skipped": SKIPPED}[kind]
                if kind == "on_failed" and data.get("ignore_errors"):
                    status = OK
                host.tasks.append(TaskOutcome(task=task or "", status=status, res=res,
                                              duration=data.get("duration")))
                host.finished = time.monotonic()
                if status in (FAILED, UNREACHABLE):
                    host.status = status
                    host.message = _reason(res)
                elif host.status in (PENDING, RUNNING, SKIPPED):
                    host.status = OK if status == OK else SKIPPED
                host.current_task = None
        elif name == "error" or (name == "verbose" and "ERROR!" in (event.get("stdout") or "")):
            self.errors.append(event.get("stdout") or "")
        elif name == "playbook_on_stats":
            self.stats.set()
        if self.progress is not None:
            self.progress.update(self.hosts)
        if self.on_event is not None:
            kind = name[len("runner_"):] if name.startswith("runner_") else name
            self.on_event(RunnerEvent(kind=kind, host=host_name, task=task, res=res, raw=event))
        return _keep(event)


def _reason(res: dict[str, Any] | None) -> str | None:
    if not res:
        return None
    message = res.get("msg")
    if isinstance(message, str) and message.strip():
        return message.strip()
    for key in ("stderr", "module_stderr", "exception"):
        if isinstance(res.get(key), str) and res[key].strip():
            return str(res[key]).strip().splitlines()[-1]
    return None


# --------------------------------------------------------------------------- running


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
    skip_validation: bool = False,
    skip_tags: Sequence[str] = (),
    return_at_stats: bool = False,
) -> RunResult:
    """Run a playbook against the inventory's hosts (or `limit`) and return per-host results.

    playbook: a path, or the file name of one of the collection's playbooks ("probe.yml").
    limit: host names to run on (default: every host in the inventory).
    on_event: called for every runner event (from ansible-runner's loop: keep it quick).
    progress: live per-host progress on stderr (default: when stderr is a terminal).
    cancel: set it from another thread to stop the run; Ctrl-C does the same in the main thread.
    timeout: seconds before the run is stopped (status "timeout").
    skip_validation: leave out the roles' argument validation (a task of its own on every host, which Ansible
    tags `always`), for callers whose variables come from fdl's checked configuration; the modules still check
    their own arguments.
    skip_tags: more tags whose tasks fdl does not need (a role's message for people, when fdl renders its own).
    return_at_stats: return as soon as the play's final stats arrive (every host's result is in then), while
    ansible-playbook and ansible-runner wind down in the background (the interpreter's exit, the artifacts: a
    few tenths of a second); the next run_playbook call, and the end of the process, wait for that. For a
    caller whose next step is on the critical path (the launcher's rank sessions). The result's status is then
    "successful" or "failed" from the hosts, and its rc 0 or 2.

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
    collector = _Collector(hosts, on_event, display)
    try:
        with Interrupts(cancel) as interrupts:
            if display is not None:
                display.start()
            def start() -> Any:
                return _invoke(pdd, run_id, path, inventory_file, vars_file, len(hosts), timeout=timeout,
                               event_handler=collector, cancel_callback=cancel.is_set,
                               skip_tags=((VALIDATION_TAG,) if skip_validation else ()) + tuple(skip_tags))

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


def _until_stats(start: Callable[[], Any], collector: _Collector) -> Any | None:
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
    """After a cancel: stop every process of this run left on the hosts (best effort, bounded)."""
    if not hosts:
        return
    sub = inventory.subset(hosts)
    pdd = private_data_dir(sub)
    inventory_file = _write_private(pdd / "inventory" / "hosts.json", json.dumps(sub.to_ansible()))
    reap_id = uuid.uuid4().hex
    vars_file = _write_private(pdd / "tmp" / f"{reap_id}.json",
                               json.dumps({"fdl_reap_run_id": run_id, RUN_ID_VAR: reap_id}))
    deadline = time.monotonic() + REAP_TIMEOUT
    try:
        _invoke(pdd, reap_id, shipped_playbook("reap.yml"), inventory_file, vars_file, len(hosts),
                timeout=REAP_TIMEOUT, event_handler=None, cancel_callback=lambda: time.monotonic() > deadline)
    finally:
        vars_file.unlink(missing_ok=True)


def _invoke(pdd: Path, ident: str, playbook: Path, inventory_file: Path, vars_file: Path, forks: int, *,
            timeout: float | None, event_handler: Callable[[dict[str, Any]], bool] | None,
            cancel_callback: Callable[[], bool], skip_tags: Sequence[str] = ()) -> Any:
    """The one ansible_runner.run call: fdl's environment, extra variables from a 0600 file, quiet, rotated."""
    import ansible_runner

    cmdline = f"-e @{shlex.quote(str(vars_file))}"
    if skip_tags:
        cmdline += f" --skip-tags {shlex.quote(','.join(skip_tags))}"

    return ansible_runner.run(
        private_data_dir=str(pdd), ident=ident, playbook=str(playbook), inventory=str(inventory_file),
        cmdline=cmdline, envvars=ansible_environment(forks), forks=forks,
        quiet=True, rotate_artifacts=KEEP_ARTIFACTS, suppress_env_files=True,
        settings={"pexpect_timeout": PEXPECT_TIMEOUT, "suppress_ansible_output": True},
        timeout=int(timeout) if timeout else None, event_handler=event_handler or _keep,
        cancel_callback=cancel_callback)


def _keep(event: dict[str, Any]) -> bool:
    """Whether ansible-runner writes the event into the artifacts: only the play-level ones (a handful per run,
    whatever the host count: enough to see where a run's time went). Per-host events are read live, and
    writing each as a file cost the controller CPU on every host."""
    return str(event.get("event", "")).startswith("playbook_on_")
