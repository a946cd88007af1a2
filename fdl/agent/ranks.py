"""This host's ranks of a formed world: the controller's rank environment checked, the ranks run under the rank
supervisor (fdl.hostside.supervisor, the launcher's own code path) with heartbeats while they run, and the exit
report."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fdl.agent.failures import RankEnvRefused, Stopped
from fdl.agent.options import JoinOptions
from fdl.agent.prepare import Prepared
from fdl.errors import ExitCode, FdlError
from fdl.hostside.supervisor import GroupResult, Supervisor

if TYPE_CHECKING:
    from fdl.controller.client import ControllerClient

__all__ = ["HEARTBEAT_DEFAULT_S", "PERSIST_MAX_RESTARTS", "Ranks"]

HEARTBEAT_DEFAULT_S = 3.0
#: TORCHELASTIC_MAX_RESTARTS under `--persist`, which re-dials without a bound (torchrun's is an integer).
PERSIST_MAX_RESTARTS = 2**31 - 1


class Ranks:
    """Runs the ranks of each world this box is given, and counts the worlds of each run it ran (a re-dialed run's
    TORCHELASTIC_RESTART_COUNT)."""

    def __init__(self, options: JoinOptions, host: str, *, environ: Mapping[str, str], note: Callable[[str], None],
                 on_line: Callable[[int, str], None] | None = None):
        self.options = options
        self.host = host
        self.environ = environ
        self.note = note
        self.on_line = on_line
        self.runs: dict[str, int] = {}  # TORCHELASTIC_RUN_ID -> worlds of that run this agent already ran

    def _count_run(self, ranks: list[dict[str, Any]], shape: dict[str, Any]) -> int:
        """TORCHELASTIC_RESTART_COUNT for this world: how many worlds of the same run (the same
        TORCHELASTIC_RUN_ID, e.g. one published run re-dialed after a failure) this agent already ran."""
        env = (ranks[0].get("env") or {}) if ranks else {}
        run = str(env.get("TORCHELASTIC_RUN_ID") or shape.get("run_id") or "")
        if not run:
            return 0
        count = self.runs.pop(run, 0)
        self.runs[run] = count + 1  # most recent last; a long-lived box keeps the last 256 runs
        while len(self.runs) > 256:
            self.runs.pop(next(iter(self.runs)))
        return count

    def run(self, client: ControllerClient, ticket: str, world: dict[str, Any], prep: Prepared,
            admitted: dict[str, Any]) -> int:
        """Run this host's ranks of the formed world until they end; their group's exit code (reported)."""
        from fdl.controller.client import ControllerError, ControllerRefused
        from fdl.controller.protocol import refused_rank_env
        from fdl.hostside.envvars import without_secrets

        shape = world.get("world") or {}
        ranks = world.get("ranks") or []
        refused = sorted({name for r in ranks for name in refused_rank_env(r.get("env") or {})})
        if refused or not all(isinstance(r.get("rank"), int) for r in ranks):
            detail: str | None = f"refused the controller's rank environment: {', '.join(refused) or 'malformed ranks'}"
            try:
                client.report_exit(ticket, ExitCode.FAILURE, detail)
            except (ControllerError, ControllerRefused, FdlError) as exc:
                self.note(f"exit report not delivered ({exc.message})")
            raise RankEnvRefused(
                f"the controller's answer sets rank environment variables fdl does not take from a controller "
                f"({', '.join(refused[:8]) or 'malformed ranks'}); no rank was started.",
                hint="A rank takes only the torch.distributed and FDL_* variables listed in docs/controller.md; "
                     "per-host variables (LD_PRELOAD, ...) belong in the worker's own configuration.")
        args = prep.args
        world_args = shape.get("args") or []
        if args is None:
            args = tuple(world_args)
        elif world_args and tuple(world_args) != tuple(args):
            self.note("args: this box's arguments differ from the run's (the controller's); this box's are used, "
                      "and they must match the run")
        self.note(f"world formed: {shape.get('size')} ranks on {shape.get('nodes')} hosts, backend "
                  f"{shape.get('backend')}, master {shape.get('master_addr')}:{shape.get('master_port')}; this host "
                  f"runs rank(s) {', '.join(str(r.get('rank')) for r in ranks)}")
        log_dir = prep.log_root / f"{(shape.get('run_id') or 'run')[:16]}-{int(time.time())}"
        prep.log_root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(prep.log_root, 0o700)  # rank logs are the run's own: nobody else lists or reads them
        base_env = without_secrets(prep.rank_env(self.options, self.environ))
        restarts = self._count_run(ranks, shape)
        supervisor = Supervisor([prep.binary, *args], [{"rank": r["rank"], "env": r.get("env") or {}} for r in ranks],
                                cwd=prep.cwd, log_dir=str(log_dir), label=self.host, base_env=base_env,
                                on_line=self.on_line, on_note=self.note, restart_count=restarts,
                                max_restarts=PERSIST_MAX_RESTARTS if self.options.persist else 0)
        results: list[GroupResult] = []
        errors: list[BaseException] = []
        # Waited on instead of Thread.join: a signal handler's exception (Stopped) interrupting join() can
        # mark a still-running thread as finished (CPython releases the lock the thread holds), after which
        # join() returns at once, before the ranks are down.
        done = threading.Event()

        def supervise() -> None:
            try:
                results.append(supervisor.run())
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
            finally:
                done.set()

        beat_s = float(world.get("heartbeat_s") or admitted.get("heartbeat_s") or HEARTBEAT_DEFAULT_S)
        thread = threading.Thread(target=supervise, name="fdl-ranks", daemon=True)
        thread.start()
        lost_since: float | None = None
        stopping = False
        stopped: Stopped | None = None
        try:
            while not done.is_set():
                try:
                    beat = client.heartbeat(ticket, running=True)
                    lost_since = None
                    if beat.get("stop") and not stopping:
                        stopping = True
                        self.note(f"the run failed ({beat.get('reason') or 'the controller says so'}); stopping "
                                  f"this host's ranks")
                        supervisor.stop("terminated")
                except ControllerRefused as exc:
                    if not stopping:
                        stopping = True
                        self.note(f"the controller dropped this box ({exc.reason}: {exc.message}); stopping ranks")
                        supervisor.stop("terminated")
                except ControllerError as exc:  # an unproved answer (UnverifiedController) is not acted on
                    if lost_since is None:
                        lost_since = time.monotonic()
                        self.note(f"heartbeat: {exc.message}; the ranks keep running")
                done.wait(beat_s)
        except Stopped as exc:
            stopped = exc
            supervisor.stop("terminated")
        except BaseException:
            supervisor.stop("terminated")
            done.wait()
            raise
        done.wait()
        if errors:
            raise FdlError(f"the rank supervisor failed: {errors[0]}")
        result = results[0]
        code = result.exit_code
        detail = None
        if stopped is not None:
            code = 128 + stopped.signum
            detail = f"the agent was stopped (signal {stopped.signum})"
        elif result.first_failure is not None:
            detail = f"rank {result.first_failure} exited {result.codes.get(result.first_failure)}"
        elif result.reason != "ok":
            detail = f"ranks {result.reason}"
        try:
            client.report_exit(ticket, code, detail)
        except (ControllerError, ControllerRefused) as exc:
            self.note(f"exit report not delivered ({exc.message}); this host's code is {code}")
        self.note(f"ranks finished: exit {code}" + (f" ({detail})" if detail else "") + f"; logs in {log_dir}")
        if stopped is not None:
            raise stopped
        return code
