"""Dispatch: stage a run on every remote host, then run each host's ranks under the rank supervisor.

Two halves, because a rank runs for hours and an Ansible task is a poor host
for a process whose output must stream back the whole time:

1. **Staging** is Ansible (playbooks/dispatch.yml, roles/fdl_dispatch), all
   hosts at once: the built binary goes over rsync (only changed bytes), the
   rank supervisor (fdl/agent/supervisor.py, shipped as it is: a host needs no
   fdl install) and the host's rank spec (world environment per rank, the
   worker's `env:`, the args) land under `~/.flodl/launch/` on the host.
2. **Running** is one `ssh` per host (fdl.cluster.ssh: the runner's own SSH
   settings and ControlPath, so it rides the master Ansible just opened) that
   starts the supervisor with its stdin held open by the launcher. Its stdout,
   every rank's lines prefixed `[host/rank]`, streams back live; its last line
   is the group's result. When the launcher goes away (Ctrl-C, a crash, a lost
   link) the supervisor sees EOF on stdin and takes its ranks down.

A host that is this machine (or a single-host run) needs neither: its
supervisor runs in-process (`Supervisor`, the same class), its ranks in the
project root.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any, Protocol

from fdl.agent.supervisor import NOTE_PREFIX, RESULT_PREFIX, GroupResult, Supervisor
from fdl.controller.protocol import without_secrets
from fdl.errors import RemoteError
from fdl.launch.build import BuildJob
from fdl.launch.plan import LaunchHost, LaunchPlan

if TYPE_CHECKING:
    from fdl.cluster.inventory import ClusterInventory, InventoryHost

GRACE_S = 10.0
STAGE_ROOT = "~/.flodl/launch"


class TextSink(Protocol):
    """Where a Printer writes: a text stream, or anything with its write and flush."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class Printer:
    """Rank lines to stdout, launcher notes to stderr; one lock, so lines never interleave."""

    def __init__(self, out: TextSink | None = None, err: TextSink | None = None):
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        with self._lock:
            try:
                self.out.write(text.rstrip("\n") + "\n")
                self.out.flush()
            except (BrokenPipeError, ValueError):
                pass

    def note(self, text: str) -> None:
        from fdl.controller.view import printable

        text = printable(text)  # host names and details from walk-ins are data, never terminal controls
        with self._lock:
            try:
                self.err.write(f"fdl: launch: {text}\n")
                self.err.flush()
            except (BrokenPipeError, ValueError):
                pass


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
        if not env.get("FDL_RUN_ID"):
            env["FDL_RUN_ID"] = plan.run_id
        out.append({"rank": int(rank["rank"]), "env": env})
    return out


# The host's `python3 -c` program: it reads one JSON document from stdin (the staging code, fdl.fsio and the
# supervisor's source, and this host's inputs), loads the code as modules and stages. Only code is on the
# command line; the spec travels inside the ssh session.
BOOTSTRAP = ("import json,sys,types\n"
             "d=json.load(sys.stdin)\n"
             "m={}\n"
             "for n,s in d['code']:\n"
             " m[n]=types.ModuleType(n);exec(compile(s,n+'.py','exec'),m[n].__dict__)\n"
             "sys.exit(m['hoststage'].serve(d['params'],d['supervisor'],m['fsio'].atomic_write))\n")
STAGE_TIMEOUT_S = 60.0


def stage_remote(plan: LaunchPlan, inventory: ClusterInventory, jobs: dict[str, BuildJob],
                 specs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Ship binary, supervisor and rank spec to every remote host at once; returns {host: staged paths}.

    One ssh per host runs fdl.launch.hoststage there (over the host's warm ControlMaster: tens of
    milliseconds), then rsync only for the hosts whose copy of the binary differs. Ansible would add its
    own start (about two seconds here) and nothing else: the same ssh settings, host keys and login apply.
    The flodl.fdl.dispatch playbook stays, on the same hoststage code, for staging without fdl.
    """
    from concurrent.futures import ThreadPoolExecutor

    hosts = [h for h in plan.remote]
    digests: dict[str, str] = {}
    code = _stage_code()
    work = []
    for host in hosts:
        job = jobs.get(host.name)
        artifact = str(job.artifact) if job is not None and job.artifact is not None else ""
        if artifact and artifact not in digests:
            digests[artifact] = _sha256(artifact)
        params = {"run_id": plan.run_id, "bin_dir": plan.command.name if artifact else "",
                  "program": Path(artifact).name if artifact else "", "program_sha256": digests.get(artifact, ""),
                  "command": list(plan.args) if plan.command.bin is not None else plan.rank_argv(None),
                  "ranks": specs[host.name], "label": host.name, "grace_s": GRACE_S, "root": STAGE_ROOT}
        work.append((host, inventory.hosts[host.name], artifact, {**code, "params": params}))
    staged: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, min(len(work), 64)), thread_name_prefix="fdl-stage") as pool:
        outcomes = list(pool.map(lambda w: _stage_one(plan.run_id, *w), work))
    for (host, *_), (paths, problem) in zip(work, outcomes, strict=True):
        if problem is not None:
            failures.append(f"{host.name}: {problem}")
        else:
            staged[host.name] = paths
    if failures:
        raise RemoteError(f"staging the run failed on {len(failures)} host(s), so no rank was started: "
                          + "; ".join(failures),
                          hint="Each host needs python3 and rsync, and must be reachable over ssh as its user "
                               "(fdl @cluster probe checks the rest).")
    return staged


def _stage_code() -> dict[str, Any]:
    """The code half of every host's staging document (read once per launch)."""
    from fdl import fsio
    from fdl.agent import supervisor
    from fdl.launch import hoststage

    def source(module: ModuleType) -> str:
        assert module.__file__ is not None
        return Path(module.__file__).read_text(encoding="utf-8")

    return {"code": [["fsio", source(fsio)], ["hoststage", source(hoststage)]], "supervisor": source(supervisor)}


def _stage_one(run_id: str, host: LaunchHost, inv_host: InventoryHost, artifact: str, document: dict[str, Any]
               ) -> tuple[dict[str, Any], str | None]:
    """Stage one host (and rsync its binary when it differs): (staged paths, None) or ({}, why it failed)."""
    from fdl.cluster.ssh import login, rsync_rsh, ssh_argv

    remote = f"exec env FDL_RUN_ID={shlex.quote(run_id)} {shlex.quote(host.python)} -c {shlex.quote(BOOTSTRAP)}"
    try:
        done = subprocess.run([*ssh_argv(inv_host), remote], input=json.dumps(document).encode(),
                              capture_output=True, timeout=STAGE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return {}, f"staging did not finish within {STAGE_TIMEOUT_S:.0f}s"
    except OSError as exc:
        return {}, f"cannot run ssh: {exc.strerror or exc}"
    answer = _last_json(done.stdout)
    if done.returncode == 255:
        return {}, f"ssh exited 255: {_last_line(done.stderr) or 'no output'}"
    if done.returncode != 0 or not isinstance(answer.get("staged"), dict):
        why = answer.get("error") or _last_line(done.stderr) or "no output"
        return {}, f"staging exited {done.returncode}: {why}"
    paths = answer["staged"]
    if artifact and not paths.get("program_current"):
        try:
            shipped = subprocess.run(["rsync", "--archive", "--rsh", rsync_rsh(inv_host), artifact,
                                      f"{login(inv_host)}:{paths['bin_dir']}/"], capture_output=True,
                                     timeout=None, check=False)
        except OSError as exc:
            return {}, f"cannot run rsync: {exc.strerror or exc}"
        if shipped.returncode != 0:
            return {}, f"rsync exited {shipped.returncode}: {_last_line(shipped.stderr) or 'no output'}"
    return {k: paths[k] for k in ("run_dir", "supervisor", "spec")}, None


def _last_json(raw: bytes) -> dict[str, Any]:
    for line in reversed(raw.decode("utf-8", "replace").splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def _last_line(raw: bytes) -> str:
    lines = [line.strip() for line in raw.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""


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
        for proc in list(self.supervisor.procs.values()):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

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
        remote = (f"cd {shlex.quote(staged['run_dir'])} && exec env FDL_RUN_ID={shlex.quote(run_id)} "
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
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass

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
