"""Where `fdl status` and `fdl start` look for the controller, and with which token.

Strongest first: `--addr host[:port]`; the active env's `cluster.controller`
(then its port on loopback, so a run whose workers all come through ssh
tunnels is found from the controller box); this user's live launcher runs;
the convention default 127.0.0.1:1337, which the command notes on stderr.

The token for an address, found without typing it: the env's
`cluster.controller.join.token` for the env's addresses, and for a live run
of this user (found by its record or at the address typed) the run's own
token file, readable by this user alone (fdl.controller.live.run_token). A token
the command is given (`--token-file`, `FDL_JOIN_TOKEN`) wins over both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from fdl.config.parse import DEFAULT_PORT
from fdl.config.schema import ClusterSpec
from fdl.controller.client import ControllerClient, ControllerError, NoRunListening, normalize_address
from fdl.errors import UsageError
from fdl.hostside.paths import RUNS_IN_HOME

DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
T = TypeVar("T")

if TYPE_CHECKING:
    from fdl.controller.live import LiveRun


class Target(NamedTuple):
    """The addresses to try, in order, where they came from, and the token found for each."""

    addresses: tuple[str, ...]
    source: str  # "--addr" | "cluster.controller" | "live run" | "default"
    tokens: tuple[tuple[str, str], ...] = ()  # (address, token) found without the user typing it
    note: str | None = None  # what to tell the user on stderr

    @property
    def primary(self) -> str:
        return self.addresses[0]

    def token_for(self, address: str) -> str | None:
        return dict(self.tokens).get(address)


def _live_runs() -> list[LiveRun]:
    from fdl.controller.live import live_runs

    return live_runs()


def _run_token(run_id: str) -> str | None:
    from fdl.controller.live import run_token

    return run_token(run_id)


def resolve(addr: str | None, cluster_loader: Callable[[], ClusterSpec | None],
            live_loader: Callable[[], list[LiveRun]] = _live_runs,
            token_loader: Callable[[str], str | None] = _run_token) -> Target:
    """Pick the controller address; cluster_loader returns the active env's ClusterSpec (or None).

    live_loader returns this user's live launcher runs (fdl.controller.live): a run that moved off its
    configured port is asked first in its place, and with no configuration at all the live runs
    are asked before the convention default. token_loader reads a live run's own token file.
    """
    runs = live_loader()
    found: dict[str, str] = {}
    for run in reversed(runs):  # the newest run wins an address
        token = token_loader(run.run_id)
        if token:
            found[run.address] = token
    if addr:
        shown, _ = normalize_address(addr)
        return Target((shown,), "--addr", _tokens((shown,), found))
    cluster = cluster_loader()
    if cluster is not None:
        ctl = cluster.controller
        shown, _ = normalize_address(f"[{ctl.host}]:{ctl.port}" if ":" in ctl.host else f"{ctl.host}:{ctl.port}")
        configured = [shown]
        if ctl.host not in _LOOPBACK:
            configured.append(f"127.0.0.1:{ctl.port}")
        ours = [r for r in runs if r.configured in configured or r.address in configured]
        moved = [r.address for r in ours if r.address not in configured]
        addresses = tuple(dict.fromkeys(moved + configured))
        mine = next((found[r.address] for r in ours if r.address in found), None)  # this user's run of this env
        token = ctl.join.token or mine
        if token:
            found = {**found, **dict.fromkeys(addresses, token)}
        return Target(addresses, "cluster.controller", _tokens(addresses, found))
    if runs:
        addresses = tuple(dict.fromkeys([r.address for r in runs] + [DEFAULT_ADDRESS]))
        return Target(addresses, "live run", _tokens(addresses, found),
                      note=f"no --addr and no cluster.controller in the active configuration; asking the run "
                           f"this user's launcher (pid {runs[0].pid}) serves on {runs[0].address}")
    return Target((DEFAULT_ADDRESS,), "default",
                  note=f"no --addr and no cluster.controller in the active configuration; asking the "
                       f"convention default {DEFAULT_ADDRESS}")


def _tokens(addresses: tuple[str, ...], found: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple((a, found[a]) for a in addresses if a in found)


def ask(target: Target, fn: Callable[[ControllerClient], T], *, timeout: float = 5.0,
        token: str | None = None) -> tuple[str, T]:
    """Call fn with a client for each address in turn until one answers; returns (address, result).

    token: the one the user gave (proved, never sent, to every address); otherwise each address gets the
    token found for it (Target.tokens), or none. A proof names the controller instance it was made for,
    so whatever answers at an address learns nothing it could use elsewhere.

    A refusal by the controller (ControllerRefused) is an answer and propagates at once. When no address
    answers, the error of the first is raised, naming every address tried; it is NoRunListening only if
    every one refused the connection.
    """
    errors: list[ControllerError] = []
    for address in target.addresses:
        with ControllerClient(address, timeout=timeout, token=token or target.token_for(address)) as client:
            try:
                return address, fn(client)
            except ControllerError as exc:
                errors.append(exc)
    answered = [e for e in errors if not isinstance(e, NoRunListening)]
    if len(errors) == 1 or len(answered) == 1:
        raise (answered or errors)[0]  # the one address where something was there says the most
    if not answered:
        raise NoRunListening(f"no run listening at {' or '.join(target.addresses)} (connection refused)",
                             address=errors[0].address)
    tried = "; ".join(str(e) for e in errors)
    raise type(answered[0])(f"no controller answered: {tried}", address=answered[0].address)


def read_token_file(path: str) -> str:
    """The token in a file the user named (--token-file); UsageError when it cannot be read or is empty."""
    import os

    try:
        with open(os.path.expanduser(path), encoding="utf-8") as handle:
            text = handle.read(4097)
    except OSError as exc:
        raise UsageError(f"--token-file {path}: cannot read it ({exc.strerror or exc}).",
                         hint=f"Name the file that holds the run's token (a launcher keeps its run's in "
                              f"{RUNS_IN_HOME}/RUN/token; fdl join-config writes a farm's).") from None
    except UnicodeDecodeError:
        raise UsageError(f"--token-file {path} does not hold text.") from None
    token = text.strip()
    if not token or len(text) > 4096 or any(c.isspace() for c in token):
        raise UsageError(f"--token-file {path} does not hold one token (one line, no spaces).")
    return token
