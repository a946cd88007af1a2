"""The join agent: prepare, dial, wait for the world, run this host's ranks, report; and `--persist`.

One attempt is: preparation (fdl.agent.prepare), the `--ssh` tunnel when
asked for, the hello on the controller's join channel (fdl.controller.client,
the same client `fdl status` uses), the long-poll for the world, the ranks
under the rank supervisor (fdl.hostside.supervisor, the launcher's own code
path) with heartbeats while they run, and the exit report.

Exit codes: what is permanent (exit 2) is decided once, before the first
dial, from this box's own configuration (fdl.agent.permanent: a closed
list). After that nothing is: every failure of an attempt is transient
(exit 1), an OSError included. One-shot returns the agent's own code (the
ranks' group result) verbatim, or raises that transient failure.
`--persist` re-dials after every failure and after every agent exit (clean
or not) with capped exponential backoff plus jitter, saying each time what
went wrong and what would mend it; only the check before the first dial
ever reaches systemd in that mode.

Everything learned from the network is transient, whoever sent it: an
answer that does not prove the token, a refusal (bad token, stale clock,
...), a rank environment the agent will not take, a dropped ssh connection.
So is whatever a disk, a mount or a fetched tree does between dials. A box
cannot tell a wrong token from an impostor, so a `--persist` box keeps
re-dialing and says, every few attempts, what the likely causes are.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING, Any

from fdl import __version__
from fdl.agent.backoff import Backoff
from fdl.agent.data import disk_error
from fdl.agent.options import JoinOptions
from fdl.agent.permanent import check
from fdl.agent.prepare import Prepared, prepare
from fdl.agent.tunnel import Tunnel, local_address_toward, pinned_environ
from fdl.errors import ExitCode, FdlError
from fdl.hostside.envvars import FDL_JOIN_TOKEN
from fdl.hostside.supervisor import GroupResult, Supervisor

if TYPE_CHECKING:
    from fdl.controller.client import ControllerClient, ControllerError, ControllerRefused
    from fdl.controller.protocol import Hello

Note = Callable[[str], None]
#: Refusals and failures that say the run's token was not proved either way (a wrong token, a clock off by more
#: than the proof window, something else answering): counted for the loud warning under --persist.
TRUST_REASONS = frozenset({"bad_token", "stale_request", "unverified", "tunnel"})
WARN_EVERY = 3  # --persist: the likely causes are spelled out after this many such failures in a row
CLOCK_WINDOW_S = 60.0  # the controller refuses a proof whose time is further than this from its clock
WORLD_POLL_S = 20.0
HEARTBEAT_DEFAULT_S = 3.0
#: TORCHELASTIC_MAX_RESTARTS under `--persist`, which re-dials without a bound (torchrun's is an integer).
PERSIST_MAX_RESTARTS = 2**31 - 1


class Stopped(BaseException):
    """The agent was asked to stop (SIGTERM, SIGINT): the attempt is torn down and nothing re-dials."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class JoinRefused(FdlError):
    """The controller turned this box down; `reason` is its stable code (always transient: learned from the
    network)."""

    def __init__(self, message: str, *, reason: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.reason = reason


class Unreachable(FdlError):
    """No controller answered, or none that proved the run's token (transient: the next dial tries again);
    `reason` is "unverified" for an answer without a valid proof."""

    def __init__(self, message: str, *, hint: str | None = None, reason: str | None = None):
        super().__init__(message, hint=hint)
        self.reason = reason


_REFUSAL_HINTS = {
    "bad_token": f"Present the run's controller.join.token ({FDL_JOIN_TOKEN}, or join.token in the join: block); "
                 "through an ssh door too.",
    "window_closed": "The next run's window admits this box; with --persist it re-dials on its own.",
    "run_id_differs": "This box holds a different publish than the cohort: the next dial fetches the current run.",
    "signature_differs": "This box builds a different model than the cohort: check its source and arguments.",
    "host_joined": "Another box already joined under this name: give each box its own --host.",
    "roster_full": "The window is full; the next run's window may have room.",
    "not_in_roster": "This run admits only its roster's hosts (discovery is off); use a host name it lists.",
    "stale_request": "The request's time is too far from the controller's clock: sync this box's clock with NTP "
                     "(timedatectl set-ntp true, or chrony).",
    "reserved_host": "The launcher runs that host itself; a walk-in needs a name of its own (--host).",
    "wrong_address": "A roster host joins only from its roster address: dial from that box, or fix its address: "
                     "in cluster.workers.",
}


class RankEnvRefused(FdlError):
    """The controller's answer sets rank environment variables outside the allow-list (transient: the answer
    came over the network; no rank starts on it)."""


def refusal_error(exc: ControllerRefused, address: str) -> JoinRefused:
    reason = getattr(exc, "reason", "refused")
    return JoinRefused(f"the controller at {address} refused this box ({reason}): {exc.message}", reason=reason,
                       hint=_REFUSAL_HINTS.get(reason))


def _unreachable(exc: ControllerError, tunneled: bool) -> Unreachable:
    from fdl.controller.client import UnverifiedController

    via = " through the ssh tunnel" if tunneled else ""
    return Unreachable(f"{exc.message}{via}.",
                       hint=exc.hint or "The controller runs only while its launcher does; start the run (or wait "
                                        "for it), then dial again. --persist re-dials on its own.",
                       reason="unverified" if isinstance(exc, UnverifiedController) else None)


def likely_causes(address: str, failures: int, skew: float | None, proven: bool = False) -> str:
    """The loud warning a --persist box prints every few failures that proved nothing either way. The clock
    advice is only as good as the answer it came in: proven when that answer proved the run's token, labelled
    unverified otherwise (whatever answered may say anything)."""
    if skew is not None and CLOCK_WINDOW_S / 2 < abs(skew) < 365 * 86400:  # an absurd claim says nothing
        side = "behind" if skew > 0 else "ahead of"
        if proven:
            clock = (f"this box's clock is {abs(skew):.0f} s {side} what {address} says its clock is (in an "
                     f"answer that proved the run's token); a request more than {CLOCK_WINDOW_S:g} s off is refused")
        else:
            clock = (f"this box's clock may be off: whatever answers at {address} says (unverified: its answer "
                     f"proved no token) that this box is {abs(skew):.0f} s {side} its clock; a request more than "
                     f"{CLOCK_WINDOW_S:g} s off the controller's is refused")
    else:
        clock = f"this box's clock is more than {CLOCK_WINDOW_S:g} s off the controller's"
    return (f"WARNING: {failures} dials in a row reached no controller that proves the run's token at {address}. "
            f"Likely causes: (1) this box's token is not the run's ({FDL_JOIN_TOKEN}, join.token or the token file "
            f"against the run's controller.join.token); (2) {clock}: sync it with NTP (timedatectl set-ntp true, "
            f"or chrony); (3) something else answers at that address (another program on the port between runs, "
            f"a reused address); (4) through --ssh: the door does not take this box's key, or drops connections "
            f"under load (sshd MaxStartups). None of this is permanent: this box keeps re-dialing.")


class JoinAgent:
    """One worker: `run()` does a one-shot join or the `--persist` loop."""

    def __init__(self, options: JoinOptions, *, note: Note = lambda _: None,
                 on_line: Callable[[int, str], None] | None = None, environ: Mapping[str, str] | None = None,
                 build_output: IO[str] | None = None, sleep: Callable[[float], None] = time.sleep):
        self.options = options
        self.note = note
        self.on_line = on_line
        # join.known_hosts pins the door for every ssh a dial starts (tunnel, sshfs, rsync, git)
        self.environ = pinned_environ(os.environ if environ is None else environ, options.known_hosts)
        self.build_output = build_output
        self.sleep = sleep
        self.host = options.host or socket.gethostname().split(".")[0]
        self.attempts = 0
        self.runs: dict[str, int] = {}  # TORCHELASTIC_RUN_ID -> worlds of that run this agent already ran
        self.skew: float | None = None  # the controller's clock minus this box's, as its GET /join/id claimed
        self.skew_proven = False  # whether that answer proved the run's token

    # ------------------------------------------------------------------ the loop

    def run(self) -> int:
        check(self.options, environ=self.environ, note=self.note)  # the permanent class: exit 2, before any dial
        if not self.options.persist:
            try:
                return self.attempt()
            except FdlError as exc:
                transient(exc)  # the same exception, its code now transient
                raise
            except OSError as exc:
                raise transient(exc) from exc
        backoff = Backoff.from_env(self.environ)
        unproved = 0  # failures in a row that proved nothing either way (TRUST_REASONS)
        while True:
            try:
                code = self.attempt()
            except (FdlError, OSError) as exc:
                failure = transient(exc)
                wait = backoff.after_failure()
                self.note(f"transient failure: {failure.message}" + (f" ({failure.hint})" if failure.hint else ""))
                unproved = unproved + 1 if getattr(failure, "reason", None) in TRUST_REASONS else 0
                if unproved and unproved % WARN_EVERY == 0:
                    self.note(likely_causes(self.options.controller_text, unproved, self.skew, self.skew_proven))
                self.note(f"persist: re-dialing in {wait:.1f} s (attempt {self.attempts + 1})")
            else:
                unproved = 0
                wait = backoff.after_success() if code == 0 else backoff.after_failure()
                self.note(f"persist: the agent exited {code}; re-dialing in {wait:.1f} s")
            self.sleep(wait)

    # ------------------------------------------------------------------ one attempt

    def attempt(self) -> int:
        """Prepare, dial, run; returns the agent's exit code or raises a classed FdlError."""
        self.attempts += 1
        opts = self.options
        prep = prepare(opts, environ=self.environ, note=self.note, build_output=self.build_output)

        from fdl.controller.client import ControllerClient, ControllerError, ControllerRefused

        tunnel = Tunnel(opts.ssh, opts.controller, identity=opts.identity, note=self.note,
                        environ=self.environ, known_hosts=opts.known_hosts) if opts.ssh else None
        with tunnel if tunnel is not None else contextlib.nullcontext():
            shown = opts.controller_text + (f" (via ssh {opts.ssh})" if opts.ssh else "")
            with ControllerClient(opts.controller_text, timeout=10.0, token=opts.token,
                                  socket_path=tunnel.socket_path if tunnel is not None else None) as client:
                try:
                    admitted = client.hello(self._hello(prep))
                except ControllerRefused as exc:
                    raise refusal_error(exc, shown) from None
                except ControllerError as exc:
                    raise _unreachable(exc, tunnel is not None) from None
                finally:
                    if client.clock_skew is not None:
                        self.skew, self.skew_proven = client.clock_skew, client.clock_proven
                ticket = str(admitted["ticket"])
                left = admitted.get("seconds_left")
                self.note(f"admitted by {shown} as {admitted.get('host', self.host)} with {admitted.get('ranks')} "
                          f"rank(s); phase {admitted.get('phase')}"
                          + (f", window closes in {left:.0f} s" if isinstance(left, (int, float)) else ""))
                try:
                    world = self._wait_world(client, ticket)
                except ControllerRefused as exc:
                    raise refusal_error(exc, shown) from None
                except ControllerError as exc:
                    raise _unreachable(exc, tunnel is not None) from None
                except Stopped as exc:  # leave the window before it forms, so the roster stays true
                    with contextlib.suppress(Exception):
                        client.report_exit(ticket, 128 + exc.signum, "stopped before the world formed")
                    raise
                return self._run_world(client, ticket, world, prep, admitted)

    def _hello(self, prep: Prepared) -> Hello:
        from fdl.controller.protocol import Hello

        opts = self.options
        address = None
        if opts.ssh is not None:  # the controller sees the tunnel's loopback: tell it where this box really is
            address = local_address_toward(opts.ssh.host, opts.ssh.port or 22)
        return Hello(host=self.host, devices=prep.offer.devices, run_id=prep.run_id, signature=prep.signature,
                     address=address, data_path=prep.data_root,
                     gpu_ram_share=opts.gpu_ram_share, gpu_names=prep.offer.gpu_names,
                     agent=f"fdl-join/{__version__}")

    def _wait_world(self, client: ControllerClient, ticket: str) -> dict[str, Any]:
        while True:
            world = client.wait_world(ticket, wait_s=WORLD_POLL_S)
            if world is not None:
                return world

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

    def _run_world(self, client: ControllerClient, ticket: str, world: dict[str, Any], prep: Prepared,
                   admitted: dict[str, Any]) -> int:
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


def transient(exc: FdlError | OSError) -> FdlError:
    """A failure of one attempt, as what it is after the permanence check: transient (exit 1), whoever raised it.
    An OSError nobody classed (a stale mount's EIO, a read-only tree) says which file and what would mend it."""
    if isinstance(exc, OSError):
        return disk_error(exc)
    exc.exit_code = ExitCode.FAILURE
    return exc


def print_note(stream: IO[str] | None = None) -> Note:
    """A note printer for the command line: `fdl: join: ...` on stderr."""
    out = sys.stderr if stream is None else stream

    def note(text: str) -> None:
        from fdl.controller.view import printable

        print(f"fdl: join: {printable(text)}", file=out, flush=True)  # a controller's words are data

    return note
