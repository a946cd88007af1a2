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

The parts, one job each: the dial and its session with the controller
(fdl.agent.session), this host's ranks (fdl.agent.ranks), what failures are
and what a box says about them (fdl.agent.failures); `JoinAgent` runs one
attempt or the `--persist` loop over them.

Everything learned from the network is transient, whoever sent it: an
answer that does not prove the token, a refusal (bad token, stale clock,
...), a rank environment the agent will not take, a dropped ssh connection.
So is whatever a disk, a mount or a fetched tree does between dials. A box
cannot tell a wrong token from an impostor, so a `--persist` box keeps
re-dialing and says, every few attempts, what the likely causes are.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO

from fdl.agent.backoff import Backoff
from fdl.agent.failures import TRUST_REASONS, WARN_EVERY, likely_causes, transient
from fdl.agent.options import JoinOptions
from fdl.agent.permanent import check
from fdl.agent.prepare import prepare
from fdl.agent.ranks import Ranks
from fdl.agent.session import Dial
from fdl.agent.tunnel import pinned_environ
from fdl.errors import FdlError

Note = Callable[[str], None]


class JoinAgent:
    """One worker: `run()` does a one-shot join or the `--persist` loop; `attempt()` is one preparation, dial and
    world."""

    def __init__(self, options: JoinOptions, *, note: Note = lambda _: None,
                 on_line: Callable[[int, str], None] | None = None, environ: Mapping[str, str] | None = None,
                 build_output: IO[str] | None = None, sleep: Callable[[float], None] = time.sleep):
        self.options = options
        self.note = note
        # join.known_hosts pins the door for every ssh a dial starts (tunnel, sshfs, rsync, git)
        self.environ = pinned_environ(os.environ if environ is None else environ, options.known_hosts)
        self.build_output = build_output
        self.sleep = sleep
        self.host = options.host or socket.gethostname().split(".")[0]
        self.attempts = 0
        self.dial = Dial(options, self.host, environ=self.environ, note=note)
        self.ranks = Ranks(options, self.host, environ=self.environ, note=note, on_line=on_line)

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
                    self.note(likely_causes(self.options.controller_text, unproved, self.dial.skew,
                                            self.dial.skew_proven))
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
        prep = prepare(self.options, environ=self.environ, note=self.note, build_output=self.build_output)
        with self.dial.session() as client:
            ticket, admitted = self.dial.join(client, prep)
            world = self.dial.wait_world(client, ticket)
            return self.ranks.run(client, ticket, world, prep, admitted)


def print_note(stream: IO[str] | None = None) -> Note:
    """A note printer for the command line: `fdl: join: ...` on stderr."""
    out = sys.stderr if stream is None else stream

    def note(text: str) -> None:
        from fdl.controller.view import printable

        print(f"fdl: join: {printable(text)}", file=out, flush=True)  # a controller's words are data

    return note
