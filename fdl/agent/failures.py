"""What an attempt's failures are after the permanence check, and what a box says about them.

Everything learned from the network is transient (exit 1), whoever sent it: a refusal, an answer that does not
prove the token, a rank environment the agent will not take; so is an OSError of a disk or a mount between dials
(fdl.agent.agent's docstring). `Stopped` is no failure: the agent was asked to stop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fdl.agent.data import disk_error
from fdl.errors import ExitCode, FdlError
from fdl.hostside.envvars import FDL_JOIN_TOKEN

if TYPE_CHECKING:
    from fdl.controller.client import ControllerError, ControllerRefused

#: Refusals and failures that say the run's token was not proved either way (a wrong token, a clock off by more
#: than the proof window, something else answering): counted for the loud warning under --persist.
TRUST_REASONS = frozenset({"bad_token", "stale_request", "unverified", "tunnel"})
WARN_EVERY = 3  # --persist: the likely causes are spelled out after this many such failures in a row
CLOCK_WINDOW_S = 60.0  # the controller refuses a proof whose time is further than this from its clock

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


def unreachable(exc: ControllerError, tunneled: bool) -> Unreachable:
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


def transient(exc: FdlError | OSError) -> FdlError:
    """A failure of one attempt, as what it is after the permanence check: transient (exit 1), whoever raised it.
    An OSError nobody classed (a stale mount's EIO, a read-only tree) says which file and what would mend it."""
    if isinstance(exc, OSError):
        return disk_error(exc)
    exc.exit_code = ExitCode.FAILURE
    return exc
