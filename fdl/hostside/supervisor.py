"""The rank supervisor: start one child per rank, stream its output, fail fast, leave no orphans.

One code path for every rank child fdl starts: the launcher's ranks on remote
hosts (staged there as this one file, since the hosts need no fdl install),
on this machine (in-process) and under `fdl join` on a self-deployed worker.
Host-side (fdl/hostside/), and more: it imports nothing but the standard
library, not even its siblings, so the file runs on its own:

    python3 supervisor.py SPEC.json      # or: python3 - SPEC.json < supervisor.py

The spec is JSON: {"argv": [...], "cwd": "...", "log_dir": "...", "label": "host",
"grace_s": 10, "restart_count": 0, "max_restarts": 0,
"ranks": [{"rank": 0, "env": {...}}, ...]}. Each output line of
rank r is written to <log_dir>/rank-<r>.log and echoed as `[label/r] line`.

Each rank's environment is the supervisor's own (or base_env), then the
rank's `env` from the spec, then the part of torchrun's environment only this
host can decide (`worker_env`): the restart count and maximum, and torchrun's
thread defaults, which give way to anything the environment or the spec
already sets.

The first rank to exit non-zero fails the group: every other rank (its whole
process group) gets SIGTERM, then SIGKILL after grace_s. When stdin is a pipe
and reaches EOF (the launcher or its ssh connection went away), the group is
torn down the same way. Children also carry PR_SET_PDEATHSIG, so even a
SIGKILLed supervisor takes its ranks with it.

Exit status: 0 when every rank exited 0; otherwise the first failing rank's
code (128+N for a rank killed by signal N). A final JSON line prefixed
`fdl-supervisor-result: ` reports every rank's code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any, Callable, NamedTuple

RESULT_PREFIX = "fdl-supervisor-result: "
NOTE_PREFIX = "fdl supervisor: "  # the supervisor's own notes, on stderr
_PR_SET_PDEATHSIG = 1

#: The torchrun variables the host running the ranks sets (the controller sends the rest of the contract,
#: fdl.controller.world.TORCHRUN_ENV). The restart pair always comes from here; the other two only fill in.
WORKER_ENV = ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS",
              "TORCH_NCCL_ASYNC_ERROR_HANDLING")


def worker_env(env: dict[str, str], *, local_ranks: int, restart_count: int = 0,
               max_restarts: int = 0) -> dict[str, str]:
    """One rank's environment completed the way torchrun's agent completes it on its node.

    TORCHELASTIC_RESTART_COUNT / TORCHELASTIC_MAX_RESTARTS are this host's own (0 and 0 unless a
    `--persist` agent re-runs the same run). OMP_NUM_THREADS is 1 when more than one rank runs on the
    host and nothing set it (torchrun's rule: ranks sharing a box would each start a thread per core);
    TORCH_NCCL_ASYNC_ERROR_HANDLING is 1 unless set (a failed NCCL collective ends the rank, so the group
    fails fast instead of hanging).
    """
    out = dict(env)
    out["TORCHELASTIC_RESTART_COUNT"] = str(int(restart_count))
    out["TORCHELASTIC_MAX_RESTARTS"] = str(int(max_restarts))
    if local_ranks > 1 and "OMP_NUM_THREADS" not in out:
        out["OMP_NUM_THREADS"] = "1"
    out.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    return out


class GroupResult(NamedTuple):
    codes: dict[int, int | None]  # rank -> exit code
    first_failure: int | None  # rank that failed first, None when all exited 0
    reason: str  # "ok", "rank-failed", "orphaned", "terminated"

    @property
    def exit_code(self) -> int:
        if self.first_failure is None:
            return 0 if self.reason == "ok" else 1
        code = self.codes.get(self.first_failure)
        return code if code else 1

    def to_dict(self) -> dict[str, Any]:
        return {"codes": {str(k): v for k, v in self.codes.items()}, "first_failure": self.first_failure,
                "reason": self.reason, "exit_code": self.exit_code}


def _private_log(path: str) -> IO[str]:
    """A rank's log for appending, readable by this user alone (0600, also when it already existed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "a", encoding="utf-8")


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the process that started it dies (Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """End a child started with start_new_session=True and everything in its group: TERM, then KILL."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(grace_s)
    else:  # the leader is gone; whatever it left in its group goes too
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class Supervisor:
    """Runs one process per rank and supervises them as a group."""

    def __init__(self, argv: list[str], ranks: list[dict[str, Any]], *, cwd: str | None = None,
                 log_dir: str | None = None,
                 label: str = "", grace_s: float = 10.0, base_env: dict[str, str] | None = None,
                 on_line: Callable[[int, str], None] | None = None, restart_count: int = 0,
                 max_restarts: int = 0, on_note: Callable[[str], None] | None = None):
        if not argv:
            raise ValueError("the rank command is empty")
        self.argv = list(argv)
        self.ranks = list(ranks)
        self.cwd = cwd
        self.log_dir = log_dir
        self.label = label
        self.grace_s = grace_s
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.on_line = on_line or self._echo
        self.on_note = on_note or self._note
        self.restart_count = restart_count
        self.max_restarts = max_restarts
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.codes: dict[int, int] = {}
        self._pumps: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stop_reason = ""

    def _echo(self, rank: int, line: str) -> None:
        prefix = f"[{self.label}/{rank}] " if self.label else f"[{rank}] "
        with self._lock:
            sys.stdout.write(prefix + line + ("" if line.endswith("\n") else "\n"))
            sys.stdout.flush()

    def _note(self, text: str) -> None:
        with self._lock:
            sys.stderr.write(f"{NOTE_PREFIX}{text}\n")
            sys.stderr.flush()

    def rank_env(self, spec: dict[str, Any]) -> dict[str, str]:
        """The environment one rank starts with."""
        env = dict(self.base_env)
        env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
        return worker_env(env, local_ranks=len(self.ranks), restart_count=self.restart_count,
                          max_restarts=self.max_restarts)

    def start(self) -> None:
        if self.log_dir:  # rank output is the run's own: its directory 0700, each log 0600
            os.makedirs(self.log_dir, mode=0o700, exist_ok=True)
            os.chmod(self.log_dir, 0o700)
        envs = [self.rank_env(spec) for spec in self.ranks]
        defaulted = sum(1 for spec, env in zip(self.ranks, envs) if "OMP_NUM_THREADS" not in self.base_env
                        and "OMP_NUM_THREADS" not in (spec.get("env") or {}) and "OMP_NUM_THREADS" in env)
        if defaulted:
            self.on_note(f"OMP_NUM_THREADS=1 for each of this host's {defaulted} ranks, as torchrun does when "
                         f"ranks share a host; set OMP_NUM_THREADS (environment, command or worker env:) to tune it")
        for spec, env in zip(self.ranks, envs):
            rank = int(spec["rank"])
            try:
                # ansible-bad-function (a module should call run_command): never run inside a module; see main()
                proc = subprocess.Popen(  # pylint: disable=ansible-bad-function
                    self.argv, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=die_with_parent,  # noqa: PLW1509 - PR_SET_PDEATHSIG can only be set in the child
                )
            except OSError as exc:
                self.codes[rank] = 127
                self.on_line(rank, f"fdl: cannot start rank {rank}: {exc.strerror or exc} ({self.argv[0]})")
                self.stop("rank-failed")
                return
            self.procs[rank] = proc
            pump = threading.Thread(target=self._pump, args=(rank, proc), daemon=True)
            pump.start()
            self._pumps.append(pump)

    def _pump(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        log = _private_log(os.path.join(self.log_dir, f"rank-{rank}.log")) if self.log_dir else None
        try:
            if proc.stdout is None:  # started without stdout=PIPE: nothing to relay
                return
            for raw in iter(proc.stdout.readline, b""):
                line = raw.decode("utf-8", "replace")
                if log:
                    log.write(line)
                    log.flush()
                self.on_line(rank, line.rstrip("\n"))
        finally:
            if log:
                log.close()
            if proc.stdout is not None:
                proc.stdout.close()

    def stop(self, reason: str = "terminated") -> None:
        """Ask the whole group to stop (idempotent; the wait loop does the signalling)."""
        if not self._stop.is_set():
            self._stop_reason = reason
            self._stop.set()

    def _signal_all(self, sig: int) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def wait(self, poll_s: float = 0.05) -> GroupResult:
        """Block until every rank has exited; fail fast on the first non-zero exit."""
        first_failure: int | None = next((r for r, c in self.codes.items() if c != 0), None)
        deadline: float | None = None
        while True:
            running = False
            for rank, proc in self.procs.items():
                if rank in self.codes:
                    continue
                code = proc.poll()
                if code is None:
                    running = True
                    continue
                self.codes[rank] = _exit_code(code)
                if self.codes[rank] != 0 and first_failure is None and not self._stop.is_set():
                    first_failure = rank
                    self.stop("rank-failed")
            if not running:
                break
            if self._stop.is_set():
                if deadline is None:
                    self._signal_all(signal.SIGTERM)
                    deadline = time.monotonic() + self.grace_s
                elif time.monotonic() >= deadline:
                    self._signal_all(signal.SIGKILL)
            time.sleep(poll_s)
        self._reap_groups()
        for pump in self._pumps:
            pump.join(timeout=2)
        reason = self._stop_reason or "ok"
        if reason == "ok" and any(self.codes.values()):
            reason = "rank-failed"
        return GroupResult(codes=dict(sorted(self.codes.items())), first_failure=first_failure, reason=reason)

    def _reap_groups(self) -> None:
        """A rank that exited may leave children in its process group: end them too."""
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def run(self) -> GroupResult:
        self.start()
        return self.wait()


def _watch_stdin(supervisor: Supervisor) -> None:
    """EOF on stdin means whoever started us is gone: tear the group down."""
    try:  # raw reads: a daemon thread blocked in a buffered read aborts interpreter shutdown
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    supervisor.stop("orphaned")


def main(argv: list[str] | None = None) -> int:
    # A program of its own (python3 supervisor.py SPEC.json, on a host or under fdl): it prints, exits and starts
    # processes as a program does. It is shipped with the collection's module_utils, where ansible-test's pylint
    # wants module code to call exit_json, module.log and run_command instead, but no module runs it:
    # fdl_dispatch_stage only writes this file onto the host (the one exception, as in ansible-core's respawn.py).
    # pylint: disable=ansible-bad-function
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: supervisor.py SPEC.json", file=sys.stderr)
        return 2
    try:
        with open(args[0], encoding="utf-8") as handle:
            spec = json.load(handle)
        supervisor = Supervisor(spec["argv"], spec["ranks"], cwd=spec.get("cwd"), log_dir=spec.get("log_dir"),
                                label=spec.get("label", ""), grace_s=float(spec.get("grace_s", 10)),
                                restart_count=int(spec.get("restart_count", 0)),
                                max_restarts=int(spec.get("max_restarts", 0)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"fdl supervisor: bad spec {args[0]}: {exc}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: supervisor.stop("terminated"))
    if spec.get("watch_stdin", not sys.stdin.isatty()):
        threading.Thread(target=_watch_stdin, args=(supervisor,), daemon=True).start()
    result = supervisor.run()
    print(RESULT_PREFIX + json.dumps(result.to_dict()), flush=True)
    return result.exit_code


if __name__ == "__main__":
    # a program's exit (see main())
    sys.exit(main())  # pylint: disable=ansible-bad-function
