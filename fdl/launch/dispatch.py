"""Dispatch: stage a run on every remote host with Ansible, then run each host's ranks over ssh.

The rule: Ansible changes and stages hosts; a run's live session is ssh. Ansible cannot carry a process whose
output must stream back for hours (a task's output arrives when it ends, async tasks are polled, and a
canceled play leaves its children behind), so dispatch has two halves:

1. **Staging** is the flodl.fdl.dispatch playbook (role fdl_dispatch), run through fdl.cluster.runner, every
   host at once: the fdl_dispatch_stage module lays out `~/.flodl/launch/` on the host (the rank supervisor,
   fdl/hostside/supervisor.py shipped as it is in the module's payload, so a host needs no fdl install, and the
   host's rank spec: world environment per rank, the worker's `env:`, the args), and the built binary goes
   over rsync only where the host's copy has another SHA-256.
2. **Running** is one `ssh` per host (fdl.cluster.ssh: the inventory's connection settings for that host and
   the runner's ControlPath, so it rides the master Ansible just opened) that starts the supervisor with its
   stdin held open by the launcher. Its stdout, every rank's lines prefixed `[host/rank]`, streams back live;
   its last line is the group's result. When the launcher goes away (Ctrl-C, a crash, a lost link) the
   supervisor sees EOF on stdin and takes its ranks down.

A host behind an execution node (`via:`) is staged from that node, by the same playbook (fdl.cluster.nodes): the
binary travels in the node's job stream once and the node rsyncs it to its hosts; its rank session is the same ssh
through the node (ProxyJump, fdl.cluster.ssh).

A host that is this machine (or a single-host run) needs neither: its supervisor runs in-process
(`Supervisor`, the same class), its ranks in the project root.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from fdl.errors import RemoteError
from fdl.hostside.envvars import FDL_RUN_ID, without_secrets
from fdl.hostside.paths import LAUNCH_IN_HOME
from fdl.hostside.supervisor import NOTE_PREFIX, RESULT_PREFIX, GroupResult, Supervisor, signal_processes
from fdl.launch.build import BuildJob
from fdl.launch.plan import LaunchHost, LaunchPlan
from fdl.launch.printer import Printer

if TYPE_CHECKING:
    from fdl.cluster.events import HostResult, TaskOutcome
    from fdl.cluster.inventory import ClusterInventory

GRACE_S = 10.0


@dataclass
class HostOutcome:
    """How one host's ranks ended."""

    host: str
    code: int  # 0 when every rank exited 0
    codes: dict[int, int]  # rank -> exit code (empty when the supervisor never reported)
    first_rank: int | None  # this host's first failing rank
    detail: str | None  # for state.json and the final message


def rank_specs(plan: LaunchPlan, host: LaunchHost, assignment: dict[str, Any]) -> list[dict[str, Any]]:
    """Each rank's entry for the supervisor: the world's rank environment over the worker's env: over the
    command's env: (a host's own setting is more specific than the job's).

    FDL_RUN_ID is the cohort's run id; a discovery cohort without one gets the launch's own, so every process
    of the run carries an id the sweep (roles/fdl_reap) can find.
    """
    out = []
    for rank in assignment.get("ranks") or []:
        world = {str(k): str(v) for k, v in (rank.get("env") or {}).items()}
        env = {**plan.command.env_dict, **host.env, **world}
        if not env.get(FDL_RUN_ID):
            env[FDL_RUN_ID] = plan.run_id
        out.append({"rank": int(rank["rank"]), "env": env})
    return out


def stage_remote(plan: LaunchPlan, inventory: ClusterInventory, jobs: dict[str, BuildJob],
                 specs: dict[str, list[dict[str, Any]]], *, progress: bool | None = None) -> dict[str, dict[str, Any]]:
    """Stage every remote host through the flodl.fdl.dispatch playbook; returns {host: staged paths}.

    One ansible-playbook run (fdl.cluster.runner: the role's argument validation, then one module call per
    host; the validation runs on the controller, with no round trip to the host): the fdl_dispatch_stage module lays out
    the run on each host in one round trip (the hoststage code, the supervisor and the rank spec travel in its
    payload), and rsync ships the binary only to the hosts whose copy has another SHA-256. The ssh sessions
    Ansible opens stay up as persistent masters that the rank sessions ride next (fdl.cluster.ssh). It returns
    at the play's final stats, when every host's result is in: ansible-playbook's own exit and the runner's
    artifacts finish in the background while the rank sessions start.
    """
    from fdl.cluster.events import OK
    from fdl.cluster.runner import run_playbook
    from fdl.cluster.ssh import login, rsync_rsh

    hosts = [h.name for h in plan.remote]
    digests: dict[str, str] = {}
    dispatch_plan: dict[str, dict[str, Any]] = {}
    ship: dict[str, dict[str, Path]] = {}  # {host: binary}: it travels in its node's job, the node rsyncs it
    for name in hosts:
        job = jobs.get(name)
        artifact = str(job.artifact) if job is not None and job.artifact is not None else ""
        if artifact and artifact not in digests:
            digests[artifact] = _sha256(artifact)
        inv_host = inventory.hosts[name]
        if artifact and inv_host.via is not None:  # staged from the node: the binary's path in the job there
            from fdl.cluster.nodes import SHIP_DIR

            relative = f"{SHIP_DIR}/{digests[artifact][:16]}/{Path(artifact).name}"
            ship[name] = {relative: Path(artifact)}
        dispatch_plan[name] = {
            "run_id": plan.run_id, "root": LAUNCH_IN_HOME,
            "artifact": relative if artifact and inv_host.via is not None else artifact,
            "artifact_sha256": digests.get(artifact, ""), "bin_dir": plan.command.name,
            "rsh": rsync_rsh(inv_host), "login": login(inv_host),
            "command": list(plan.args) if plan.command.bin is not None else plan.rank_argv(None),
            "ranks": specs[name], "label": name, "grace_s": GRACE_S}
    result = run_playbook("dispatch.yml", inventory, extravars={"fdl_dispatch_plan": dispatch_plan}, limit=hosts,
                          progress=progress, title="dispatch", return_at_stats=True, ship=ship or None)
    staged: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    for name in hosts:
        outcome = result.hosts[name]
        paths = staged_paths(outcome.tasks)
        if outcome.status != OK or paths is None:
            failures.append(f"{name}: {_why(outcome)}")
        else:
            staged[name] = paths
    if failures:
        raise RemoteError(f"staging the run failed on {len(failures)} host(s), so no rank was started: "
                          + "; ".join(failures),
                          hint="Each host needs python3 and rsync, and must be reachable over ssh as its user "
                               "(fdl @cluster probe checks the rest).")
    return staged


def _why(outcome: HostResult) -> str:
    """Why a host was not staged: the failed task and what it said (a command's exit status and last line)."""
    failed = next((t for t in reversed(outcome.tasks) if t.status in ("failed", "unreachable")), None)
    if failed is None:
        return outcome.message or outcome.status
    res = failed.res or {}
    if isinstance(res.get("rc"), int) and res.get("cmd"):  # the rsync: its exit status, then its last words
        lines = [line for line in str(res.get("stderr") or "").splitlines() if line.strip()]
        return f"{failed.task}: exited {res['rc']}: {lines[-1].strip() if lines else 'no output'}"
    return f"{failed.task}: {outcome.message or failed.status}"


def staged_paths(tasks: list[TaskOutcome]) -> dict[str, Any] | None:
    """Where the fdl_dispatch_stage module put the run on a host (its fact fdl_dispatch_staged), or None."""
    for outcome in tasks:
        facts = (outcome.res or {}).get("ansible_facts") or {}
        paths = facts.get("fdl_dispatch_staged")
        if isinstance(paths, dict) and all(isinstance(paths.get(k), str) for k in ("run_dir", "supervisor", "spec")):
            return {k: paths[k] for k in ("run_dir", "supervisor", "spec")}
    return None


def _sha256(path: str) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Session:
    """One host's ranks while they run."""

    host: str
    # Set when the session ends, so the launcher's supervision loop wakes at once instead of at its next poll.
    ended: threading.Event | None = None

    def _ended(self) -> None:
        if self.ended is not None:
            self.ended.set()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Ask the host's ranks to end (idempotent)."""
        raise NotImplementedError

    def kill(self) -> None:
        """The last resort after stop() did not end the session in time."""

    @property
    def done(self) -> bool:
        raise NotImplementedError

    def outcome(self) -> HostOutcome:
        raise NotImplementedError


def _outcome(host: str, result: dict[str, Any] | None, code: int, fallback: str | None) -> HostOutcome:
    if result is None:
        return HostOutcome(host=host, code=code or 1, codes={}, first_rank=None,
                           detail=fallback or f"the rank supervisor ended without a result (exit {code})")
    codes = {int(k): v for k, v in (result.get("codes") or {}).items()}
    first = result.get("first_failure")
    exit_code = int(result.get("exit_code", code))
    detail = None
    if first is not None:
        detail = f"rank {first} exited {codes.get(int(first))}"
    elif exit_code != 0:
        detail = f"ranks {result.get('reason', 'failed')}"
    return HostOutcome(host=host, code=exit_code, codes=codes, first_rank=None if first is None else int(first),
                       detail=detail)


class LocalSession(Session):
    """This machine's ranks: the rank supervisor in-process, its ranks in the project root."""

    def __init__(self, host: LaunchHost, argv: list[str], ranks: list[dict[str, Any]], cwd: Path, log_dir: Path,
                 printer: Printer):
        self.host = host.name
        self.supervisor = Supervisor(argv, ranks, cwd=str(cwd), log_dir=str(log_dir), label=host.name,
                                     base_env=without_secrets({**os.environ, **host.env}), grace_s=GRACE_S,
                                     on_line=lambda rank, line: printer.line(f"[{host.name}/{rank}] {line}"),
                                     on_note=lambda text: printer.note(f"{host.name}: {text}"))
        self.log_dir = log_dir
        self._result: GroupResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"fdl-ranks-{host.name}", daemon=True)

    def _run(self) -> None:
        try:  # the supervisor forks from this thread: its ranks' PR_SET_PDEATHSIG is tied to it
            self._result = self.supervisor.run()
        except BaseException as exc:
            self._error = exc
        finally:
            self._ended()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.supervisor.stop("terminated")

    def kill(self) -> None:
        self.supervisor.kill()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def outcome(self) -> HostOutcome:
        if self._error is not None:
            return HostOutcome(self.host, 1, {}, None, f"the rank supervisor failed: {self._error}")
        assert self._result is not None
        return _outcome(self.host, self._result.to_dict(), self._result.exit_code, None)


class RemoteSession(Session):
    """A remote host's ranks: its staged supervisor over ssh, stdin held open, stdout streamed back."""

    def __init__(self, host: LaunchHost, ssh_argv: list[str], staged: dict[str, Any], printer: Printer, run_id: str):
        self.host = host.name
        self.printer = printer
        remote = (f"cd {shlex.quote(staged['run_dir'])} && exec env {FDL_RUN_ID}={shlex.quote(run_id)} "
                  f"{shlex.quote(host.python)} -u {shlex.quote(staged['supervisor'])} {shlex.quote(staged['spec'])}")
        self.argv = [*ssh_argv, remote]
        self.log_dir = f"{staged['run_dir']}/logs"
        self.proc: subprocess.Popen[bytes] | None = None
        self.result: dict[str, Any] | None = None
        self.stderr: list[str] = []
        self._pumps: list[threading.Thread] = []
        self._start_error: str | None = None

    def start(self) -> None:
        # Its own session: a Ctrl-C at the terminal reaches the launcher only, which then stops every host in order.
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            self._start_error = f"cannot run ssh: {exc.strerror or exc}"
            return
        for target, stream in ((self._out, self.proc.stdout), (self._err, self.proc.stderr)):
            pump = threading.Thread(target=target, args=(stream,), daemon=True)
            pump.start()
            self._pumps.append(pump)

    def _out(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith(RESULT_PREFIX):
                try:
                    self.result = json.loads(line[len(RESULT_PREFIX):])
                except ValueError:
                    pass
                continue
            self.printer.line(line if line.startswith(f"[{self.host}/") else f"[{self.host}] {line}")
        stream.close()
        if self.proc is not None:  # ssh ends with its session's output: reap it, then say the session ended
            try:
                self.proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        self._ended()

    def _err(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith(NOTE_PREFIX):  # the supervisor's own note: the launcher's, about this host
                self.printer.note(f"{self.host}: {line[len(NOTE_PREFIX):]}")
            elif line.strip():
                self.stderr.append(line)
                del self.stderr[:-20]
                self.printer.line(f"[{self.host}] {line}")
        stream.close()
        self._ended()

    def stop(self) -> None:
        """EOF on the supervisor's stdin: it ends its ranks (SIGTERM, SIGKILL after the grace) and reports."""
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            signal_processes([self.proc.pid], signal.SIGTERM, group=True)

    @property
    def done(self) -> bool:
        if self._start_error is not None:
            return True
        return self.proc is not None and self.proc.poll() is not None and not any(p.is_alive() for p in self._pumps)

    def outcome(self) -> HostOutcome:
        if self._start_error is not None or self.proc is None:
            return HostOutcome(self.host, 127, {}, None, self._start_error or "the session never started")
        self.stop()  # the pipe into an ended session is closed too
        code = self.proc.returncode
        fallback = None
        if self.result is None:
            said = self.stderr[-1] if self.stderr else "no output"
            fallback = (f"ssh exited {code}: {said}" if code == 255 else
                        f"the rank supervisor ended without a result (exit {code}): {said}")
        return _outcome(self.host, self.result, code if code >= 0 else 128 - code, fallback)
