"""Where `fdl status` and `fdl start` look for the controller.

Strongest first: `--addr host[:port]`; the active env's `cluster.controller`
(then its port on loopback, so a run whose workers all come through ssh
tunnels is found from the controller box); the convention default
127.0.0.1:1337, which the command notes on stderr.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from fdl.config.schema import DEFAULT_PORT, ClusterSpec
from fdl.controller.client import ControllerClient, ControllerError, NoRunListening, normalize_address

DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
T = TypeVar("T")

if TYPE_CHECKING:
    from fdl.launch.live import LiveRun


class Target(NamedTuple):
    """The addresses to try, in order, and where they came from."""

    addresses: tuple[str, ...]
    source: str  # "--addr" | "cluster.controller" | "default"
    token: str | None = None  # the env's join token, only when the address came from that env
    note: str | None = None  # what to tell the user on stderr

    @property
    def primary(self) -> str:
        return self.addresses[0]


def _live_runs() -> list[LiveRun]:
    from fdl.launch.live import live_runs

    return live_runs()


def resolve(addr: str | None, cluster_loader: Callable[[], ClusterSpec | None],
            live_loader: Callable[[], list[LiveRun]] = _live_runs) -> Target:
    """Pick the controller address; cluster_loader returns the active env's ClusterSpec (or None).

    live_loader returns this user's live launcher runs (fdl.launch.live): a run that moved off its
    configured port is asked first in its place, and with no configuration at all the live runs
    are asked before the convention default.
    """
    if addr:
        shown, _ = normalize_address(addr)
        return Target((shown,), "--addr")
    runs = live_loader()
    cluster = cluster_loader()
    if cluster is not None:
        ctl = cluster.controller
        shown, _ = normalize_address(f"[{ctl.host}]:{ctl.port}" if ":" in ctl.host else f"{ctl.host}:{ctl.port}")
        configured = [shown]
        if ctl.host not in _LOOPBACK:
            configured.append(f"127.0.0.1:{ctl.port}")
        moved = [r.address for r in runs if r.configured in configured and r.address not in configured]
        return Target(tuple(dict.fromkeys(moved + configured)), "cluster.controller", token=ctl.join.token)
    if runs:
        return Target(tuple(dict.fromkeys([r.address for r in runs] + [DEFAULT_ADDRESS])), "live run",
                      note=f"no --addr and no cluster.controller in the active configuration; asking the run "
                           f"this user's launcher (pid {runs[0].pid}) serves on {runs[0].address}")
    return Target((DEFAULT_ADDRESS,), "default",
                  note=f"no --addr and no cluster.controller in the active configuration; asking the "
                       f"convention default {DEFAULT_ADDRESS}")


def ask(target: Target, fn: Callable[[ControllerClient], T], *, timeout: float = 5.0,
        token: str | None = None) -> tuple[str, T]:
    """Call fn with a client for each address in turn until one answers; returns (address, result).

    token: proved (never sent) only to the primary address, the one resolved for the env or typed; the
    loopback fallback gets a client with no token, so whatever listens there receives nothing that contains
    or proves it (a run on this box takes loopback requests without proof).

    A refusal by the controller (ControllerRefused) is an answer and propagates at once. When no address
    answers, the error of the first is raised, naming every address tried; it is NoRunListening only if
    every one refused the connection.
    """
    errors: list[ControllerError] = []
    for address in target.addresses:
        with ControllerClient(address, timeout=timeout,
                              token=token if address == target.primary else None) as client:
            try:
                return address, fn(client)
            except ControllerError as exc:
                errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    tried = "; ".join(str(e) for e in errors)
    first = errors[0]
    cls = NoRunListening if all(isinstance(e, NoRunListening) for e in errors) else type(first)
    if cls is NoRunListening:
        message = f"no run listening at {' or '.join(target.addresses)} (connection refused)"
    else:
        message = f"no controller answered: {tried}"
    raise cls(message, address=first.address)
