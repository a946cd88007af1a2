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

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fdl import __version__
from fdl.controller import live
from fdl.controller.states import DONE, FAILED, FORMING, TERMINAL, TRAINING, Refused
from fdl.controller.wire import is_loopback
from fdl.errors import ExitCode, FdlError
from fdl.hostside.envvars import FDL_JOIN_TOKEN, FDL_RUN_ID
from fdl.hostside.paths import RUNS_IN_HOME, launch_runs
from fdl.launch.build import BuildJob, build_jobs, check_artifacts, prebuild
from fdl.launch.dispatch import (
    GRACE_S,
    HostOutcome,
    LocalSession,
    RemoteSession,
    Session,
    rank_specs,
    stage_remote,
)
from fdl.launch.plan import SINGLE, LaunchPlan
from fdl.launch.printer import Printer
from fdl.signals import Interrupts

if TYPE_CHECKING:
    from fdl.cluster.inventory import ClusterInventory
    from fdl.controller.policy import RunPolicy
    from fdl.controller.server import ControllerServer

BEAT_S = 1.0
SWEEP_TIMEOUT_S = 60.0


class RunFailed(FdlError):
    """The run ended failed: a rank exited non-zero, a host was lost, or the window never formed."""


class _Watch:
    """The supervision loop's state: which hosts ended how, the first failure, and the stop in progress."""

    def __init__(self, launcher: Launcher, sessions: list[Session]):
        self.launcher = launcher
        self.server = launcher.server
        self.sessions = sessions
        self.outcomes: dict[str, HostOutcome] = {}
        self.first: HostOutcome | None = None
        self.stopping_since: float | None = None
        self.killed = False
        self.ended = threading.Event()
        self.interrupted = False

    @property
    def finished(self) -> bool:
        return len(self.outcomes) == len(self.sessions) and self.server.machine.phase in TERMINAL

    def start(self) -> None:
        launcher = self.launcher
        for session in self.sessions:
            session.ended = self.ended
            session.start()
            launcher.running.add(session.host)
        launcher.printer.note(f"ranks started on {len(self.sessions)} host(s)")
        for name in list(launcher.running):  # the world is up as far as the launcher's hosts go
            self.server.call(lambda m, t=launcher.tickets[name]: m.heartbeat(t, running=True))

    def interrupt(self, signum: int | None) -> None:
        if not self.interrupted:
            self.interrupted = True
            self.launcher._fail("interrupted: the launcher got " + ("SIGTERM" if signum == signal.SIGTERM
                                                                      else "Ctrl-C"))

    def hurry(self) -> None:
        self.interrupted = True
        self.stopping_since = self.stopping_since or time.monotonic()
        self._kill()

    def _kill(self) -> None:
        self.killed = True
        for session in self.sessions:
            if session.host not in self.outcomes:
                session.kill()

    def step(self) -> None:
        """Collect ended hosts (exit reports), and once the run failed stop every host still running."""
        launcher, server = self.launcher, self.server
        for session in self.sessions:
            if session.host in self.outcomes or not session.done:
                continue
            outcome = session.outcome()
            self.outcomes[session.host] = outcome
            launcher.running.discard(session.host)
            if outcome.code != 0 and self.first is None and server.machine.phase not in TERMINAL:
                self.first = outcome
            try:
                server.call(lambda m, o=outcome: m.report_exit(launcher.tickets[o.host], o.code, o.detail))
            except Refused:
                pass
        if server.machine.phase == FAILED and self.stopping_since is None:
            self.stopping_since = time.monotonic()
            still = [s for s in self.sessions if s.host not in self.outcomes]
            if still:
                launcher.printer.note(f"the run failed ({server.machine.reason}); stopping the ranks on "
                                      f"{', '.join(s.host for s in still)}")
            for session in still:
                session.stop()
        if self.stopping_since is not None and not self.killed \
                and time.monotonic() - self.stopping_since > GRACE_S + 10:
            self._kill()


class Launcher:
    """Runs one plan. `run()` returns the exit code or raises an FdlError saying why the run failed."""

    def __init__(self, plan: LaunchPlan, *, no_prebuild: bool = False, printer: Printer | None = None,
                 progress: bool | None = None, env_name: str | None = None):
        self.plan = plan
        self.no_prebuild = no_prebuild
        self.printer = printer or Printer()
        self.progress = progress
        self.env_name = env_name
        self._server: ControllerServer | None = None
        self.inventory: ClusterInventory | None = None
        self.tickets: dict[str, str] = {}
        self.running: set[str] = set()
        self._beat_stop = threading.Event()
        self._beats: threading.Thread | None = None
        self.started = time.monotonic()
        self._token_file: Path | None = None  # the token this run made, removed when it ends
        self._minted: str | None = None  # the made token's file, as shown (~/...), when the run made one

    @property
    def server(self) -> ControllerServer:
        """The run's controller (started by run(), for the run's lifetime)."""
        assert self._server is not None, "the controller starts in run()"
        return self._server

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
            forget_token(self._token_file)
            raise
        record = None
        try:
            record = self._record_live()
            self._announce()
            return self._run()
        finally:
            self._beat_stop.set()
            if self._beats is not None:
                self._beats.join(timeout=5)
            self._keep_state()
            self.server.stop()
            live.remove_record(record)
            forget_token(self._token_file)

    def _record_live(self) -> Path | None:
        """Say where this run's controller listens, for a plain `fdl status` and `fdl start` of this user on this
        machine (fdl.controller.live; they find the run's token beside it). A cluster run's controller is recorded as
        this machine reaches it: on loopback when it listens there or on every address."""
        plan = self.plan
        address = plan.controller_addr
        if plan.mode != SINGLE and (is_loopback(plan.bind) or plan.bind in ("0.0.0.0", "::", "localhost")):
            address = f"127.0.0.1:{self.server.port}"
        try:
            return live.write_record(address, plan.configured_addr or plan.controller_addr, plan.run_id)
        except OSError as exc:
            self.printer.note(f"could not record the live run for `fdl status` ({exc}); "
                              f"use fdl status --addr {plan.controller_addr}")
            return None

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
                policy = policy.with_token(self._mint_token())
        return policy

    def _mint_token(self) -> str:
        """A random token for this run alone, kept 0600 in the run's directory while the run lives (never printed,
        never on a command line; removed when the run ends): this user's `fdl status`/`fdl start` find it there,
        walk-ins read it from there; the launcher's own hosts need none (they are admitted in-process)."""
        import secrets

        from fdl.hostside.fsio import atomic_write

        token = secrets.token_hex(32)
        path = live.token_path(self.plan.run_id)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path.parent, 0o700)
        atomic_write(path.parent / TOKEN_OWNER, f"{os.getpid()}\n".encode(), mode=0o600)  # before the token
        atomic_write(path, (token + "\n").encode(), mode=0o600)
        self._token_file = path
        shown = f"~/{path.relative_to(Path.home())}" if path.is_relative_to(Path.home()) else str(path)
        self._minted = shown
        self.printer.note(f"no join token is configured, so this run made its own (0600, in {shown}): this "
                          f"account's fdl status and fdl start find it"
                          + ("; walk-ins read it from there (the line below)" if self.plan.discovery else ""))
        return token

    def walk_in_line(self) -> str | None:
        """How a walk-in joins this run's discovery window (None: a roster run admits none): the command a box
        runs, token included by reference (never the token itself), arguments left to the run."""
        plan = self.plan
        if not plan.discovery or plan.cluster is None:
            return None
        if plan.cluster.controller.join.tunnel_only:
            dial = f"--ssh USER@THIS_BOX --identity KEY {plan.controller_addr}"  # the door: docs/join.md, Trust
        else:
            dial = plan.controller_addr
        token = f"{FDL_JOIN_TOKEN}=\"$(cat {self._minted})\"" if self._minted else f"{FDL_JOIN_TOKEN}=<the run's token>"
        return f"{token} fdl join {dial} --bin PROGRAM --devices DEVICES"

    @property
    def run_dir(self) -> Path:
        """This machine's record of the run: its token, local rank logs and the final state.json."""
        return live.run_dir(self.plan.run_id)

    def _keep_state(self) -> None:
        """The final state.json outlives the controller (it goes with the launcher): kept in the run's directory."""
        import json

        from fdl.hostside.fsio import atomic_write

        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(self.run_dir / "state.json", json.dumps(self.server.state(), indent=1).encode(),
                         mode=0o600)
        except (OSError, RuntimeError, TimeoutError) as exc:
            self.printer.note(f"could not keep the final state in {self.run_dir}: {exc}")

    def _announce(self) -> None:
        plan = self.plan
        hosts = len(plan.hosts)
        what = (f"{plan.ranks} rank(s) on this machine" if plan.mode == SINGLE else
                f"{plan.ranks} rank(s) on {hosts} host(s)" + (" plus walk-ins" if plan.discovery else ""))
        if plan.mode == SINGLE:
            watch = "fdl status"  # the live record (or the default port) finds it
        else:
            watch = f"fdl @{self.env_name} status" if self.env_name else f"fdl status --addr {plan.controller_addr}"
        self.printer.note(f"run {plan.run_id} of '{plan.command.name}': {what}; controller on "
                          f"{self.server.address} (watch with `{watch}`)")
        line = self.walk_in_line()
        if line is not None:
            assert plan.cluster is not None  # a discovery window is a cluster run's
            start = (f"; once quorum is met, `{watch.replace(' status', ' start')}` fires the start"
                     if plan.cluster.controller.join.start != "auto" else "")
            self.printer.note(f"PROGRAM is what a walk-in's ranks run (a script's wrapper will do), DEVICES what "
                              f"it offers (0,1 or cpu:N); its ranks get the run's arguments{start}")
            self.printer.note(f"a walk-in joins with: {line}")

    def _run(self) -> int:
        plan = self.plan
        try:
            jobs = self._build()
            self._join_hosts()
            with Interrupts(threading.Event()) as signals:
                if not self._wait_world(signals):
                    return self._interrupted()
                if self.server.machine.phase == FAILED:
                    raise RunFailed(f"the run failed before it started: {self.server.machine.reason}.")
                assignments = {h.name: self.server.call(lambda m, n=h.name: m.world.assignment(n))
                               for h in plan.hosts}
                specs = {h.name: rank_specs(plan, h, assignments[h.name]) for h in plan.hosts}
                world = self.server.machine.world
                assert world is not None  # the phase is forming or later: the world exists
                self.printer.note(f"world formed: {world.size} ranks on {world.nodes} host(s), backend "
                                  f"{world.backend}, master {world.master_addr}:{world.master_port}")
            sessions = self._sessions(jobs, specs)
        except KeyboardInterrupt:
            return self._interrupted()
        except FdlError as exc:
            self._fail(exc.message.split(". ")[0])
            raise
        return self._supervise(sessions)

    def _build(self) -> dict[str, BuildJob]:
        plan = self.plan
        jobs = build_jobs(plan)
        if plan.hosts and any(job.recipe for job in jobs):
            if self.no_prebuild:
                self.printer.note("--no-prebuild: running the binaries already built")
                check_artifacts(plan, jobs)
            else:
                recipe = next(job.recipe for job in jobs if job.recipe)
                self.printer.note(f"pre-flight build: `{recipe}` for {len(jobs)} host(s)"
                                  + ("" if plan.mode == SINGLE else " (target/cluster/<host>/<arch>/)"))
                t0 = time.monotonic()
                prebuild(plan, jobs, progress=self.progress)
                self.printer.note(f"pre-flight build done in {time.monotonic() - t0:.1f}s")
        else:
            check_artifacts(plan, jobs)
        return {job.host: job for job in jobs}

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
            self.tickets[host.name] = member.ticket
        self._beats = threading.Thread(target=self._beat_loop, name="fdl-launch-beats", daemon=True)
        self._beats.start()

    def _beat_loop(self) -> None:
        """Heartbeats for the launcher's hosts, so the controller's liveness rules see them alive."""
        while not self._beat_stop.wait(BEAT_S):
            for name, ticket in list(self.tickets.items()):
                try:
                    self.server.call(lambda m, t=ticket, r=name in self.running: m.heartbeat(t, running=r))
                except (Refused, RuntimeError, TimeoutError):
                    pass

    def _wait_world(self, signals: Interrupts) -> bool:
        """Until the world forms or the run fails; False when interrupted."""
        server = self.server
        noted = False
        while not server.wait_phase(FORMING, TRAINING, *TERMINAL, timeout=0.2):
            if signals.cancel.is_set():
                return False
            if not noted and time.monotonic() - self.started > 2:
                noted = True
                state = server.state()
                self.printer.note(f"waiting for the world to form: phase {state['phase']}, quorum "
                                  f"{state['quorum']['have']['hosts']}/{state['quorum']['need']['hosts']} hosts"
                                  + (", start switch: fdl start" if state["start"]["mode"] != "auto" else ""))
        return True

    def _sessions(self, jobs: dict[str, BuildJob], specs: dict[str, list[dict[str, Any]]]) -> list[Session]:
        plan = self.plan
        sessions: list[Session] = []
        staged: dict[str, dict[str, Any]] = {}
        inventory = None
        if plan.remote:
            from fdl.cluster.inventory import build_inventory

            assert plan.cluster is not None
            inventory = build_inventory(plan.cluster, plan.root)
            problem = open_files_for(len(plan.remote))
            if problem:
                self.printer.note(problem)
            self.printer.note(f"staging on {len(plan.remote)} remote host(s): binary (rsync), rank supervisor, "
                              f"rank spec")
            staged = stage_remote(plan, inventory, jobs, specs, progress=self.progress)
        self.inventory = inventory
        log_root = self.run_dir / "logs"
        for host in plan.hosts:
            if host.local:
                job = jobs[host.name]
                argv = plan.rank_argv(None if job.artifact is None else str(job.artifact))
                sessions.append(LocalSession(host, argv, specs[host.name], plan.root, log_root, self.printer))
            else:
                from fdl.cluster.ssh import ssh_argv

                assert inventory is not None
                sessions.append(RemoteSession(host, ssh_argv(inventory.hosts[host.name]), staged[host.name],
                                              self.printer, plan.run_id))
        return sessions

    def _supervise(self, sessions: list[Session]) -> int:
        server = self.server
        watch = _Watch(self, sessions)
        cancel = threading.Event()
        with Interrupts(cancel) as interrupts:
            watch.start()
            while not watch.finished:
                try:
                    watch.ended.clear()
                    if cancel.is_set():
                        watch.interrupt(interrupts.signal)
                    watch.step()
                    watch.ended.wait(0.1)  # a session's end wakes this at once; the timeout catches the rest
                except KeyboardInterrupt:  # a second Ctrl-C: no more grace for the ranks
                    watch.hurry()
        interrupted = watch.interrupted
        outcomes, first = watch.outcomes, watch.first
        if interrupted or any(o.host in self._remote_names() and not o.codes for o in outcomes.values()):
            self._sweep()
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

    def _remote_names(self) -> set[str]:
        return {h.name for h in self.plan.remote}

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

    def _sweep(self) -> None:
        """Stop anything of this run left on the remote hosts (roles/fdl_reap finds it by FDL_RUN_ID)."""
        remote = sorted(self._remote_names())
        inventory = self.inventory
        if not remote or inventory is None:
            return
        from fdl.cluster.runner import run_playbook

        self.printer.note(f"sweeping {len(remote)} host(s) for processes of run {self.plan.run_id}")
        try:
            run_playbook("reap.yml", inventory, extravars={"fdl_reap_run_id": self.plan.run_id},
                         limit=remote, progress=False, timeout=SWEEP_TIMEOUT_S, title="sweep")
        except (FdlError, KeyboardInterrupt) as exc:
            self.printer.note(f"the sweep did not finish ({exc}); check the hosts for processes with "
                              f"{FDL_RUN_ID}={self.plan.run_id}")


#: beside a run's token file: the pid of the launcher that made it (the token goes when that process is gone)
TOKEN_OWNER = "token.pid"


def forget_token(path: Path | None) -> None:
    """Remove a run's token file (and its owner record) once the run is over: the token admits nobody any more,
    and ranks of this account should not find earlier runs' tokens lying about."""
    if path is None:
        return
    for leftover in (path, path.parent / TOKEN_OWNER):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()


#: a token without an owner record (an fdl from before it) younger than this may belong to a launcher that has not
#: written its live record yet: it stays
UNOWNED_GRACE_S = 300


def _launcher_alive(run_dir: Path, live_ids: set[str]) -> bool:
    """Whether the launcher that made the token in run_dir may still run: the pid recorded beside the token is
    alive; or, with no such record (an fdl from before it), a live run names this run or the token is recent."""
    try:
        pid = int((run_dir / TOKEN_OWNER).read_text().strip())
    except FileNotFoundError:
        try:
            recent = time.time() - (run_dir / "token").stat().st_mtime < UNOWNED_GRACE_S
        except OSError:
            recent = False
        return run_dir.name in live_ids or recent
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except OSError:  # no such process, or another account's: not the launcher that made it
        return False
    return True


def sweep_tokens() -> int:
    """Remove the token files of this user's earlier runs whose launcher is gone (killed, crashed, or from an
    fdl that kept them); returns how many went. A running launcher's token stays."""
    count = 0
    try:
        runs = list(launch_runs().iterdir())
    except OSError:
        return 0
    live_ids = {run.run_id for run in live.live_runs()}
    for run_dir in runs:
        token = run_dir / "token"
        if not token.is_file() or _launcher_alive(run_dir, live_ids):
            continue
        forget_token(token)
        count += 1
    return count


def open_files_for(hosts: int) -> str | None:
    """Raise this process's soft limit on open files to what `hosts` remote sessions need (three pipes each, and
    the staging's while it runs), up to the hard limit; a note when even the hard limit is short. The usual soft
    limit of 1,024 ends at about 300 hosts."""
    import resource

    needed = 256 + 8 * hosts
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        target = soft
    if target < needed:
        return (f"this process may open {target} files and {hosts} remote hosts need about {needed}; raise the "
                f"hard limit (ulimit -Hn) if sessions fail to start")
    return None


def launch(plan: LaunchPlan, *, no_prebuild: bool = False, env_name: str | None = None) -> int:
    """Run a launcher plan; the exit code (0: every rank exited 0), or RunFailed/FdlError."""
    return Launcher(plan, no_prebuild=no_prebuild, env_name=env_name).run()
