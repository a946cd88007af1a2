"""Aggregate the ranks' JSON lines of the all-reduce smoke test into one result.

Pure functions: `aggregate` turns every rank's events (read from their output
by fdl.hostside.collective.offer) into bandwidth rows, per-rank and per-host
figures, the slowest rank and the stragglers, and `to_check` makes the
`collective` check of the probe report.

Bandwidths follow nccl-tests: for an all-reduce of S bytes taking t seconds,
algbw = S / t and busbw = algbw * 2(n-1)/n for n ranks (busbw is comparable
with the link speed whatever n is). t is the mean over ranks of each rank's
mean iteration time, as nccl-tests averages.

Stragglers come from the exchange rounds, where every rank times its own
traffic: a rank's bandwidth is its best round whose send and receive peers
both sit on other hosts (its best intra-host round on a single host); a
host's is its best rank's (a slow link slows every rank of its host, a busy
CPU only some); a host under STRAGGLER_FRACTION of the median host is a
straggler. It takes three hosts to tell which end of a slow
link is slow.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

STRAGGLER_FRACTION = 0.5


@dataclass
class Row:
    """One message size: nccl-tests' columns."""

    bytes: int
    iters: int
    time_us: float  # mean over ranks of each rank's mean iteration time
    algbw_gbs: float
    busbw_gbs: float
    slowest_rank: int
    slowest_time_us: float


@dataclass
class CollectiveResult:
    """The smoke test across the cluster, aggregated."""

    world_size: int = 0
    backend: str | None = None
    hosts: dict[str, list[int]] = field(default_factory=dict)  # host -> its ranks
    rows: list[Row] = field(default_factory=list)
    rank_bandwidth_gbs: dict[int, float] = field(default_factory=dict)  # exchange phase
    host_bandwidth_gbs: dict[str, float] = field(default_factory=dict)
    slowest_rank: int | None = None
    stragglers: list[str] = field(default_factory=list)
    skipped_hosts: dict[str, str] = field(default_factory=dict)  # host -> why (PyTorch missing)
    errors: list[dict] = field(default_factory=list)  # error events
    completed_ranks: int = 0
    truncated: bool = False  # the budget ran out: fewer sizes or rounds than planned
    abandoned: bool = False  # the time limit struck before every rank finished
    time_limit_s: float | None = None
    elapsed_s: float | None = None
    failure: str | None = None  # why the test did not run or finish, in words

    @property
    def finished(self) -> bool:
        return self.world_size > 0 and self.completed_ranks == self.world_size and not self.abandoned

    def to_dict(self) -> dict:
        doc = asdict(self)
        doc["rank_bandwidth_gbs"] = {str(k): v for k, v in self.rank_bandwidth_gbs.items()}
        return doc


def bus_factor(world: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor 2(n-1)/n."""
    return 2 * (world - 1) / world if world > 0 else 0.0


def aggregate(events: list[dict], *, skipped_hosts: dict[str, str] | None = None, abandoned: bool = False,
              time_limit_s: float | None = None, elapsed_s: float | None = None) -> CollectiveResult:
    """Every rank's events (any order) -> rows, figures, slowest rank, stragglers."""
    result = CollectiveResult(skipped_hosts=dict(skipped_hosts or {}), abandoned=abandoned,
                              time_limit_s=time_limit_s, elapsed_s=elapsed_s)
    rank_host: dict[int, str] = {}
    allreduce: dict[int, dict[int, dict]] = {}  # bytes -> rank -> event
    exchange: list[dict] = []
    for event in events:
        kind = event.get("event")
        if kind == "start":
            rank_host[int(event["rank"])] = str(event.get("host"))
            result.world_size = max(result.world_size, int(event.get("world", 0)))
            result.backend = result.backend or event.get("backend")
        elif kind == "allreduce":
            allreduce.setdefault(int(event["bytes"]), {})[int(event["rank"])] = event
        elif kind == "exchange":
            exchange.append(event)
        elif kind == "done":
            result.completed_ranks += 1
            result.truncated = result.truncated or bool(event.get("truncated"))
        elif kind == "error" and event.get("kind") == "torch-missing":
            result.skipped_hosts[str(event.get("host"))] = str(event.get("detail") or "PyTorch missing")
        elif kind == "error":
            result.errors.append(event)
    for rank, host in sorted(rank_host.items()):
        result.hosts.setdefault(host, []).append(rank)

    factor = bus_factor(result.world_size)
    for size in sorted(allreduce):
        per_rank = allreduce[size]
        if result.world_size and len(per_rank) < result.world_size:
            continue  # a size some rank never finished: no fair figure
        mean = statistics.fmean(e["time_s"] for e in per_rank.values())
        slowest = max(per_rank, key=lambda r: per_rank[r]["time_s"])
        algbw = size / mean / 1e9 if mean > 0 else 0.0
        result.rows.append(Row(bytes=size, iters=min(int(e.get("iters", 0)) for e in per_rank.values()),
                               time_us=round(mean * 1e6, 2), algbw_gbs=round(algbw, 4),
                               busbw_gbs=round(algbw * factor, 4), slowest_rank=slowest,
                               slowest_time_us=round(per_rank[slowest]["time_s"] * 1e6, 2)))

    _stragglers(result, rank_host, exchange)
    if result.slowest_rank is None and result.rows:
        result.slowest_rank = result.rows[-1].slowest_rank
    return result


def _stragglers(result: CollectiveResult, rank_host: dict[int, str], exchange: list[dict]) -> None:
    single_host = len(result.hosts) < 2
    best: dict[int, float] = {}
    for event in exchange:
        rank = int(event["rank"])
        host = rank_host.get(rank)
        peers = (rank_host.get(int(event["to"])), rank_host.get(int(event["frm"])))
        if not single_host and host in peers:
            continue  # traffic that stays on this host says nothing about its link
        seconds = float(event["time_s"])
        if seconds <= 0:
            continue
        bandwidth = float(event["bytes"]) / seconds / 1e9
        best[rank] = max(best.get(rank, 0.0), bandwidth)
    if not best:
        return
    result.rank_bandwidth_gbs = {r: round(b, 4) for r, b in sorted(best.items())}
    result.slowest_rank = min(best, key=lambda r: best[r])
    for host, ranks in result.hosts.items():
        values = [best[r] for r in ranks if r in best]
        if values:  # a slow link slows every rank of its host; a busy CPU only some of them
            result.host_bandwidth_gbs[host] = round(max(values), 4)
    if len(result.host_bandwidth_gbs) >= 3:
        median = statistics.median(result.host_bandwidth_gbs.values())
        result.stragglers = sorted(h for h, b in result.host_bandwidth_gbs.items()
                                   if b < STRAGGLER_FRACTION * median)


# ---- as a probe check ----

def human_size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def to_check(result: CollectiveResult):
    """The `collective` CheckResult: error when it failed or was abandoned; warning for stragglers,
    skipped hosts or a truncated sweep; ok otherwise."""
    from fdl.hostside.checks.report import ERROR, OK, WARNING, CheckResult

    name = "collective"
    data = result.to_dict()
    shape = (f"{result.world_size} rank{'s' if result.world_size != 1 else ''} on {len(result.hosts)} "
             f"host{'s' if len(result.hosts) != 1 else ''} ({result.backend or '?'})")
    notes: list[tuple[str, str, str | None]] = []
    if result.skipped_hosts:
        listing = ", ".join(f"{h} ({why})" for h, why in sorted(result.skipped_hosts.items()))
        notes.append((WARNING, f"Skipped, PyTorch cannot be imported there: {listing}.",
                      "install PyTorch for the worker's python (pip install torch), or point the worker's "
                      "python: at an interpreter that has it"))
    nothing_ran = not result.world_size and not result.errors and not result.failure and bool(result.skipped_hosts)
    if nothing_ran:
        notes.append((WARNING, "No host could run the all-reduce smoke test.", None))
    elif result.failure or result.errors or result.abandoned or not result.finished:
        if result.failure:
            why = result.failure
        elif result.abandoned:
            done = f"{len(result.rows)} message size{'s' if len(result.rows) != 1 else ''} done"
            why = f"abandoned at the {result.time_limit_s:.0f} s time limit ({done})"
        elif result.errors:
            first = result.errors[0]
            why = (f"rank {first.get('rank')} on {first.get('host')} failed ({first.get('kind')}): "
                   f"{first.get('detail')}")
        else:
            why = f"only {result.completed_ranks} of {result.world_size or '?'} ranks finished"
        notes.insert(0, (ERROR, f"The all-reduce smoke test did not complete: {why}.",
                         "check that every host can reach MASTER_ADDR:MASTER_PORT and the others (firewall, "
                         "interface: GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME), or give the test more time "
                         "(--collective-timeout)"))
    if result.stragglers:
        median = statistics.median(result.host_bandwidth_gbs.values())
        listing = ", ".join(f"{h} ({result.host_bandwidth_gbs[h]:.3f} GB/s)" for h in result.stragglers)
        notes.append((WARNING, f"Straggler{'s' if len(result.stragglers) != 1 else ''}: {listing}, under half "
                               f"the median host's {median:.3f} GB/s.",
                      "check that host's network link (speed and duplex: ethtool; errors: ip -s link; a "
                      "traffic shaper: tc qdisc show) and what else uses it"))
    if result.truncated and not result.abandoned:
        notes.append((WARNING, f"The time budget ran out before every message size and exchange round ran "
                               f"({len(result.rows)} sizes done).", "raise --collective-timeout"))
    peak = max(result.rows, key=lambda r: r.busbw_gbs) if result.rows else None
    summary = f"All-reduce across {shape}"
    if peak is not None:
        summary += (f": {human_size(result.rows[0].bytes)} to {human_size(result.rows[-1].bytes)}, peak bus "
                    f"bandwidth {peak.busbw_gbs:.3f} GB/s at {human_size(peak.bytes)}")
    if result.slowest_rank is not None:
        host = next((h for h, ranks in result.hosts.items() if result.slowest_rank in ranks), "?")
        summary += f"; slowest rank {result.slowest_rank} on {host}"
    summary += "."
    if not result.world_size:
        summary = ""  # no rank ever started: nothing to sum up
    if not notes:
        return CheckResult(name, OK, summary, data=data)
    status = ERROR if any(n[0] == ERROR for n in notes) else WARNING
    hints = []
    for _, _, hint in notes:
        if hint and hint not in hints:
            hints.append(hint)
    return CheckResult(name, status, " ".join([n[1] for n in notes] + ([summary] if summary else [])),
                       hint="; ".join(hints) or None, data=data)


def format_rows(result: CollectiveResult) -> list[str]:
    """nccl-tests-like table lines for the human report."""
    if not result.rows:
        return []
    host_of = {r: h for h, ranks in result.hosts.items() for r in ranks}
    lines = [f"{'size':>10} {'iters':>6} {'time(us)':>11} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}  slowest rank"]
    for row in result.rows:
        lines.append(f"{human_size(row.bytes):>10} {row.iters:>6} {row.time_us:>11.1f} {row.algbw_gbs:>12.3f} "
                     f"{row.busbw_gbs:>12.3f}  {row.slowest_rank} ({host_of.get(row.slowest_rank, '?')}, "
                     f"{row.slowest_time_us:.1f} us)")
    if result.slowest_rank is not None:
        lines.append(f"slowest rank: {result.slowest_rank} on {host_of.get(result.slowest_rank, '?')}"
                     + (f" ({result.rank_bandwidth_gbs[result.slowest_rank]:.3f} GB/s in the exchange rounds)"
                        if result.slowest_rank in result.rank_bandwidth_gbs else ""))
    if result.host_bandwidth_gbs:
        lines.append("exchange bandwidth per host (GB/s): " + ", ".join(
            f"{h} {b:.3f}{' STRAGGLER' if h in result.stragglers else ''}"
            for h, b in result.host_bandwidth_gbs.items()))
    return lines
