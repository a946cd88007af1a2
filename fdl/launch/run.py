"""The launcher: one `cluster: true` run from controller to exit code.

    controller up (in-process, for the run's lifetime)
      -> pre-flight build, one per host (build.py)
      -> the launcher's hosts join the window in-process; walk-ins (`fdl join`) dial in over HTTP
      -> the world forms (the controller's rules: roster complete, deadline, or `fdl start`)
      -> staging on remote hosts, then one rank session per host (dispatch.py)
      -> supervision: heartbeats for its hosts, exit reports, and on the first failure every other
         host is stopped
      -> exit 0 only when every rank exited 0; otherwise an error naming the first failing host and rank

The controller's state follows the run (waiting while building, forming,
training, done or failed), so `fdl status` shows it from anywhere.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fdl import __version__
from fdl.controller import live
from fdl.controller.states import DONE, FAILED, Refused
from fdl.errors import ExitCode, FdlError
from fdl.hostside.paths import RUNS_IN_HOME
from fdl.launch.build import build_for_run
from fdl.launch.dispatch import HostOutcome, Session, rank_specs
from fdl.launch.hosts import HostSessions
from fdl.launch.notes import RunNotes
from fdl.launch.plan import SINGLE, LaunchPlan
from fdl.launch.printer import Printer
from fdl.launch.record import RunRecord
from fdl.launch.supervise import Beats, Watch, wait_world
from fdl.launch.tokens import RunToken, sweep_tokens
from fdl.signals import Interrupts

if TYPE_CHECKING:
    from fdl.controller.policy import RunPolicy
    from fdl.controller.server import ControllerServer


class RunFailed(FdlError):
    """The run ended failed: a rank exited non-zero, a host was lost, or the window never formed."""


class Launcher:
    """Runs one plan. `run()` returns the exit code or raises an FdlError saying why the run failed.

    The façade of a run's parts, each one job: its token (fdl.launch.tokens), its notes (fdl.launch.notes), this
    machine's record of it (fdl.launch.record), the build (fdl.launch.build), the sessions on its hosts
    (fdl.launch.hosts) and the supervision of the world (fdl.launch.supervise). What stays here is the run's
    order: controller up, build, join, wait, run, end."""

    def __init__(self, plan: LaunchPlan, *, no_prebuild: bool = False, printer: Printer | None = None,
                 progress: bool | None = None, env_name: str | None = None):
        self.plan = plan
        self.no_prebuild = no_prebuild
        self.printer = printer or Printer()
        self.progress = progress
        self.env_name = env_name
        self._server: ControllerServer | None = None
        self.record = RunRecord(plan, self.printer)
        self.token = RunToken(plan.run_id, self.printer)
        self.notes = RunNotes(plan, self.printer, self.token, env_name=env_name)
        self.hosts = HostSessions(plan, self.printer, progress=progress)
        self.beats = Beats()
        self.started = time.monotonic()

    @property
    def server(self) -> ControllerServer:
        """The run's controller (started by run(), for the run's lifetime)."""
        assert self._server is not None, "the controller starts in run()"
        return self._server

    @property
    def run_dir(self) -> Path:
        """This machine's record of the run: its token, local rank logs and the final state.json."""
        return self.record.run_dir

    def walk_in_line(self) -> str | None:
        """How a walk-in joins this run's discovery window (None: a roster run admits none)."""
        return self.notes.walk_in_line()

    # ------------------------------------------------------------------ the run

    def run(self) -> int:
        from fdl.controller.server import ControllerServer

        plan = self.plan
        for text in plan.notes:
            self.printer.note(text)
        swept = sweep_tokens()
        if swept:
            self.printer.note(f"removed the token file(s) of {swept} earlier run(s) whose launcher is gone")
        from fdl.controller.wire import Limits

        limits = Limits(max_per_peer=plan.cluster.controller.peer_connections) if plan.cluster is not None else None
        try:
            self._server = ControllerServer(self._policy(), host=plan.bind, port=plan.port, limits=limits).start()
        except BaseException:
            self.token.forget()
            raise
        record = None
        try:
            record = self.record.record_live(self.server)
            self.notes.announce(self.server)
            return self._run()
        finally:
            self.beats.stop()
            self.record.keep_state(self.server)
            self.server.stop()
            live.remove_record(record)
            self.token.forget()

    def _policy(self) -> RunPolicy:
        """The controller's policy: the plan's, its hosts reserved for the launcher (no hello over the network
        may take their names, not even during the pre-flight build), and a fresh token for this run when none
        is configured, whatever the bind (loopback is not a credential: every account on this box shares it)."""
        from dataclasses import replace

        plan = self.plan
        policy = replace(plan.policy(), reserved=frozenset(h.name for h in plan.hosts))
        if policy.token is None:
            if policy.insecure_no_token:
                self.printer.note(f"WARNING: cluster.controller.join.insecure_no_token is set: the join window on "
                                  f"{plan.bind}:{plan.port} has no token, so anyone who can reach it (every "
                                  f"account on this box included) may join this run, read its arguments, fire its "
                                  f"start switch and run code as a rank")
            else:
                policy = policy.with_token(self.token.mint(discovery=plan.discovery))
        return policy

    def _run(self) -> int:
        plan = self.plan
        try:
            jobs = build_for_run(plan, no_prebuild=self.no_prebuild, printer=self.printer, progress=self.progress)
            self._join_hosts()
            with Interrupts(threading.Event()) as signals:
                if not wait_world(self.server, signals, self.notes, self.started):
                    return self._interrupted()
                if self.server.machine.phase == FAILED:
                    raise RunFailed(f"the run failed before it started: {self.server.machine.reason}.")
                assignments = {h.name: self.server.call(lambda m, n=h.name: m.world.assignment(n))
                               for h in plan.hosts}
                specs = {h.name: rank_specs(plan, h, assignments[h.name]) for h in plan.hosts}
                world = self.server.machine.world
                assert world is not None  # the phase is forming or later: the world exists
                self.notes.world_formed(world)
            sessions = self.hosts.open(jobs, specs, self.run_dir / "logs")
        except KeyboardInterrupt:
            return self._interrupted()
        except FdlError as exc:
            self._fail(exc.message.split(". ")[0])
            raise
        return self._supervise(sessions)

    def _join_hosts(self) -> None:
        """The launcher's own hosts join the window in-process (trusted: it is the controller's own process)."""
        from fdl.controller.protocol import Hello

        plan = self.plan
        for host in plan.hosts:
            hello = Hello(host=host.name, devices=host.devices, run_id=None if plan.discovery else plan.run_id,
                          address=host.address, data_path=host.data_path, agent=f"fdl-launch/{__version__}")
            try:
                member = self.server.call(lambda m, h=hello: m.hello(h, peer="launcher", trusted=True,
                                                                     in_process=True))
            except Refused as exc:
                raise RunFailed(f"host {host.name} could not join its own run: {exc.message}") from None
            self.beats.tickets[host.name] = member.ticket
        self.beats.start(self.server)

    def _supervise(self, sessions: list[Session]) -> int:
        server = self.server
        watch = Watch(server, self.beats, self.printer, self._fail, sessions)
        watch.run()
        interrupted = watch.interrupted
        outcomes, first = watch.outcomes, watch.first
        if interrupted or any(o.host in self.hosts.remote_names() and not o.codes for o in outcomes.values()):
            self.hosts.sweep()
        elapsed = time.monotonic() - self.started
        state = server.state()
        if interrupted:
            self.printer.note(f"interrupted after {elapsed:.1f}s: every rank was stopped; the run is failed")
            return ExitCode.INTERRUPTED
        if state["phase"] == DONE:
            self.printer.note(f"run done: {state['world']['size']} rank(s) on {state['world']['nodes']} host(s) "
                              f"exited 0 in {elapsed:.1f}s; rank logs under {RUNS_IN_HOME}/{self.plan.run_id}/ "
                              + ("on this machine" if self.plan.mode == SINGLE else "on each host"))
            return ExitCode.OK
        raise self._failure(first, sessions, state)

    # ------------------------------------------------------------------ endings

    def _failure(self, first: HostOutcome | None, sessions: list[Session], state: dict[str, Any]) -> RunFailed:
        logs = {s.host: str(getattr(s, "log_dir", "")) for s in sessions}
        if first is not None:
            rank = f", rank {first.first_rank}" if first.first_rank is not None else ""
            code = first.codes.get(first.first_rank, first.code) if first.first_rank is not None else first.code
            where = logs.get(first.host)
            return RunFailed(
                f"the run failed: host {first.host}{rank} exited {code} first"
                + (f" ({first.detail})" if first.detail and not first.detail.startswith("rank ") else "")
                + f"; every other rank was stopped. Controller state: failed ({state.get('reason')}).",
                hint=f"that rank's log is {where}/rank-{first.first_rank}.log on {first.host}"
                     if where and first.first_rank is not None else None)
        return RunFailed(f"the run failed: {state.get('reason') or 'a host failed'}.")

    def _fail(self, reason: str) -> None:
        if self._server is not None:
            try:
                self.server.call(lambda m: m.fail(reason))
            except (RuntimeError, TimeoutError):
                pass

    def _interrupted(self) -> int:
        self._fail("interrupted: the launcher was stopped before the ranks started")
        self.printer.note("interrupted before any rank started; nothing is running")
        return ExitCode.INTERRUPTED

def launch(plan: LaunchPlan, *, no_prebuild: bool = False, env_name: str | None = None) -> int:
    """Run a launcher plan; the exit code (0: every rank exited 0), or RunFailed/FdlError."""
    return Launcher(plan, no_prebuild=no_prebuild, env_name=env_name).run()
