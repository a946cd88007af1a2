"""`GET /metrics`: the run as Prometheus metrics, produced with prometheus_client.

Nothing here touches the join path. The machine and the server keep plain
counters (dict increments: admissions, refusals by reason, exit reports by
code, requests by endpoint); this collector turns them, and the gauges, into
metric families at scrape time from one `state_head()` snapshot, the same
data state.json carries. Each server has its own `CollectorRegistry`, so
several controllers can serve in one process.

`collect()` reads the machine, which is not thread-safe: the registry is only
ever rendered on the server's event loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from fdl.controller.states import PHASES
from fdl.controller.view import deadlines

if TYPE_CHECKING:
    from fdl.controller.machine import RunMachine

__all__ = ["RunCollector", "Scraped", "new_registry", "render"]


class Scraped(Protocol):
    """What a scrape reads of the controller (fdl.controller.server.ControllerServer has it; this module sits
    below the server and its routes, which import it lazily at the first scrape)."""

    @property
    def machine(self) -> RunMachine: ...

    @property
    def requests(self) -> dict[tuple[str, int], int]: ...

    @property
    def accepted(self) -> int: ...

    @property
    def overloaded(self) -> int: ...

    @property
    def evicted(self) -> int: ...

    @property
    def open_connections(self) -> int: ...


class RunCollector:
    """Metric families for one controller, built from a snapshot at each scrape."""

    def __init__(self, server: Scraped):
        self._server = server

    def collect(self) -> Iterator[Metric]:
        server = self._server
        head = server.machine.state_head()
        start, quorum = head["start"], head["quorum"]
        need, have = quorum["need"], quorum["have"]

        info = InfoMetricFamily("fdl_run", "The run this controller serves (value always 1).")
        info.add_metric([], {"run_id": head["run_id"] or "", "kind": head["kind"], "start_mode": start["mode"],
                             "controller": head["controller"] or ""})
        yield info

        phase = GaugeMetricFamily("fdl_phase", "1 for the run's current phase, 0 for the others.",
                                  labels=["phase"])
        for name in PHASES:
            phase.add_metric([name], 1.0 if head["phase"] == name else 0.0)
        yield phase

        yield _gauge("fdl_state_version", "state.json's version: it grows whenever the run's state changes.",
                     head["version"])
        yield _gauge("fdl_roster_hosts", "Hosts admitted and still on the roster.", have["hosts"])
        yield _gauge("fdl_roster_ranks", "Ranks the hosts on the roster offer.", have["ranks"])
        yield _gauge("fdl_roster_expected_hosts", "Roster hosts (cluster.workers) that have not joined yet.",
                     len(head["expected"]))
        yield _gauge("fdl_quorum_have_hosts", "Hosts counted towards quorum.", have["hosts"])
        yield _gauge("fdl_quorum_need_hosts", "Hosts quorum needs (at least 1).", max(need["hosts"], 1))
        yield _gauge("fdl_quorum_have_ranks", "Ranks counted towards quorum.", have["ranks"])
        yield _gauge("fdl_quorum_need_ranks", "Ranks quorum needs (0: no rank requirement).", need["ranks"])
        yield _gauge("fdl_quorum_met", "1 when quorum is met.", 1 if quorum["met"] else 0)

        window = head["window"]
        yield _gauge("fdl_window_open", "1 while the join window admits hosts.", 1 if window["open"] else 0)
        yield _gauge("fdl_window_length_seconds", "The join window's length (window_s), counted from the first "
                                                  "admission.", window["window_s"])
        left = GaugeMetricFamily("fdl_deadline_seconds_left", "Seconds until an open deadline passes; a deadline "
                                                               "is only listed while it counts down.",
                                 labels=["deadline"])
        for deadline in deadlines(head):
            left.add_metric([deadline.name], deadline.seconds_left)
        yield left

        yield _gauge("fdl_start_switch_fired", "1 once the start switch was fired.",
                     1 if start["switch"] == "fired" else 0)
        yield _gauge("fdl_start_startable", "1 while the start switch would form the world now.",
                     1 if start["startable"] else 0)
        world = head["world"]
        yield _gauge("fdl_world_size_ranks", "Ranks in the formed world (0 before it forms).",
                     world["size"] if world else 0)

        yield CounterMetricFamily("fdl_admissions", "Hellos admitted into the join window.",
                                  value=head["admissions"])
        refusals = CounterMetricFamily("fdl_refusals", "Requests the run refused, by reason (as state.json's "
                                                       "refusals).", labels=["reason"])
        for reason, count in sorted(head["refusals"].items()):
            refusals.add_metric([reason], count)
        yield refusals
        exits = CounterMetricFamily("fdl_host_exits", "Exit reports: a host's ranks ended, by the exit code the "
                                                      "host reported.", labels=["code"])
        for code, count in head["exits"].items():
            exits.add_metric([code], count)
        yield exits

        requests = CounterMetricFamily("fdl_http_requests", "HTTP requests answered, by endpoint and status "
                                                            "code (unknown paths count as endpoint=\"other\").",
                                       labels=["endpoint", "code"])
        for (endpoint, code), count in sorted(server.requests.items()):
            requests.add_metric([endpoint, str(code)], count)
        yield requests
        yield CounterMetricFamily("fdl_http_connections_accepted", "Connections taken (a TLS handshake each).",
                                  value=server.accepted)
        yield CounterMetricFamily("fdl_http_connections_refused", "Connections closed before TLS because their "
                                                                  "peer's or network's share was full.",
                                  value=server.overloaded)
        yield CounterMetricFamily("fdl_http_connections_evicted", "Strangers' connections closed to make room for "
                                                                  "a newcomer from a lighter peer or network.",
                                  value=server.evicted)
        yield _gauge("fdl_http_connections", "Open HTTP connections.", server.open_connections)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def new_registry(server: Scraped) -> CollectorRegistry:
    """A registry of its own for one controller: the run's metrics and this process's (process_*)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(server))
    ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """(body, content type): the text format a scraper's Accept header asks for (Prometheus text 0.0.4 by
    default, OpenMetrics when asked). Call on the server's loop."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
