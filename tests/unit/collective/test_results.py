"""Aggregation of the all-reduce smoke test's rank events: nccl-tests' bandwidth formulas, the slowest
rank, stragglers from the exchange rounds, skipped hosts and failures as the `collective` check."""

from __future__ import annotations

import pytest

from fdl.collective.results import aggregate, bus_factor, format_rows, human_size, to_check
from fdl.collective.run import parse_size
from fdl.hostside.collective.offer import parse_line, selected_gpus

MIB = 1 << 20


def start(rank: int, host: str, world: int) -> dict:
    return {"event": "start", "rank": rank, "host": host, "world": world, "backend": "gloo"}


def allreduce(rank: int, size: int, seconds: float, iters: int = 5) -> dict:
    return {"event": "allreduce", "rank": rank, "bytes": size, "iters": iters, "time_s": seconds}


def exchange(rank: int, k: int, world: int, seconds: float, size: int = 4 * MIB) -> dict:
    return {"event": "exchange", "rank": rank, "round": k, "to": (rank + k) % world, "frm": (rank - k) % world,
            "bytes": size, "time_s": seconds}


def done(rank: int) -> dict:
    return {"event": "done", "rank": rank, "truncated": False}


def cluster(hosts: int, per_host: int, slow_host: int | None = None, direction: str = "out") -> list[dict]:
    """Events of a run where slow_host's link is throttled one way (a netem qdisc shapes one direction):
    "out" slows what it sends, "in" what it receives. A rank's round is slow when its own send or
    receive crosses the throttled direction."""
    world = hosts * per_host
    host_of = [f"h{r // per_host}" for r in range(world)]
    slow_name = None if slow_host is None else f"h{slow_host}"
    events = [start(r, host_of[r], world) for r in range(world)]
    for r in range(world):
        events += [allreduce(r, 8 << 10, 0.001), allreduce(r, MIB, 0.01 + r * 1e-4), done(r)]
        for k in range(1, world):
            to, frm = (r + k) % world, (r - k) % world
            crossing = [(host_of[r], host_of[to]), (host_of[frm], host_of[r])]  # (source, destination)
            if direction == "out":
                slow = any(src == slow_name and dst != src for src, dst in crossing)
            else:
                slow = any(dst == slow_name and dst != src for src, dst in crossing)
            events.append(exchange(r, k, world, 0.04 if slow else 0.004))
    return events


def test_parse_line_reads_only_prefixed_json() -> None:
    assert parse_line('fdl-collective {"event":"done","rank":1}') == {"event": "done", "rank": 1}
    for other in ("UserWarning: numpy", "fdl-collective {broken", 'fdl-collective ["event"]', ""):
        assert parse_line(other) is None


def test_bandwidth_follows_nccl_tests() -> None:
    events = [start(r, "a", 4) for r in range(4)] + [allreduce(r, 64 * MIB, t) for r, t in
                                                      enumerate((0.1, 0.1, 0.1, 0.3))]
    row = aggregate(events).rows[0]
    assert row.time_us == pytest.approx(150000.0)  # mean over ranks
    assert row.algbw_gbs == pytest.approx(64 * MIB / 0.15 / 1e9, rel=1e-3)
    assert row.busbw_gbs == pytest.approx(row.algbw_gbs * 1.5, rel=1e-3)  # 2(n-1)/n with n = 4
    assert (row.slowest_rank, row.slowest_time_us) == (3, 300000.0)
    assert bus_factor(2) == 1.0 and bus_factor(8) == 1.75


def test_a_size_some_rank_missed_has_no_row() -> None:
    events = [start(0, "a", 2), start(1, "a", 2), allreduce(0, MIB, 0.01), allreduce(1, MIB, 0.01),
              allreduce(0, 2 * MIB, 0.02)]
    assert [r.bytes for r in aggregate(events).rows] == [MIB]


def test_a_healthy_cluster_has_no_straggler() -> None:
    result = aggregate(cluster(3, 2))
    assert result.finished and result.stragglers == [] and len(result.rows) == 2
    assert set(result.host_bandwidth_gbs) == {"h0", "h1", "h2"}
    assert to_check(result).status == "ok"


@pytest.mark.parametrize("direction", ["out", "in"])
@pytest.mark.parametrize("slow", [0, 1, 2])
def test_the_throttled_host_is_the_straggler(slow: int, direction: str) -> None:
    result = aggregate(cluster(3, 2, slow_host=slow, direction=direction))
    assert result.stragglers == [f"h{slow}"]
    assert result.slowest_rank in result.hosts[f"h{slow}"]
    check = to_check(result)
    assert check.status == "warning" and f"Straggler: h{slow} (" in check.message
    assert "under half the median host's" in check.message and "tc qdisc show" in check.hint


def test_one_rank_per_host_still_finds_the_straggler() -> None:
    assert aggregate(cluster(4, 1, slow_host=3)).stragglers == ["h3"]


def test_two_hosts_cannot_name_a_straggler() -> None:
    result = aggregate(cluster(2, 2, slow_host=1))
    assert result.stragglers == []  # a slow link between two hosts slows both ends alike


def test_single_host_reports_the_slowest_rank_from_local_rounds() -> None:
    events = cluster(1, 3)
    result = aggregate(events)
    assert result.slowest_rank is not None and result.rank_bandwidth_gbs and result.stragglers == []


def test_hosts_without_pytorch_are_skipped_with_a_warning_naming_them() -> None:
    events = cluster(3, 1) + [{"event": "error", "kind": "torch-missing", "rank": 0, "host": "h9",
                               "detail": "No module named 'torch'"}]
    result = aggregate(events, skipped_hosts={"h8": "No module named 'torch'"})
    check = to_check(result)
    assert check.status == "warning"
    assert "PyTorch cannot be imported there: h8 (No module named 'torch'), h9 (No module named 'torch')" in \
        check.message
    assert "pip install torch" in check.hint


def test_nothing_ran_anywhere_is_a_warning_not_an_error() -> None:
    result = aggregate([{"event": "error", "kind": "torch-missing", "rank": 0, "host": "a", "detail": "x"}])
    check = to_check(result)
    assert check.status == "warning" and "No host could run" in check.message


def test_an_abandoned_run_is_an_error_with_what_it_got() -> None:
    events = [e for e in cluster(3, 1) if e["event"] != "done"]
    check = to_check(aggregate(events, abandoned=True, time_limit_s=30))
    assert check.status == "error"
    assert "did not complete: abandoned at the 30 s time limit (2 message sizes done)" in check.message
    assert "--collective-timeout" in check.hint


def test_a_rank_error_is_named() -> None:
    events = cluster(2, 1) + [{"event": "error", "kind": "collective", "rank": 1, "host": "h1",
                               "detail": "RuntimeError: Connection closed by peer"}]
    check = to_check(aggregate(events))
    assert check.status == "error" and "rank 1 on h1 failed (collective): RuntimeError: Connection closed" \
        in check.message


def test_a_truncated_sweep_warns() -> None:
    events = cluster(1, 2)
    events[-1] = {**events[-1]}
    for e in events:
        if e["event"] == "done":
            e["truncated"] = True
    check = to_check(aggregate(events))
    assert check.status == "warning" and "time budget ran out" in check.message


def test_rows_render_like_nccl_tests() -> None:
    lines = format_rows(aggregate(cluster(3, 2, slow_host=2)))
    assert lines[0].split() == ["size", "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "slowest", "rank"]
    assert lines[1].split()[:2] == ["8", "KiB"] and lines[2].split()[:2] == ["1", "MiB"]
    assert lines[-1].endswith("h2 0.105 STRAGGLER")


def test_result_is_json_ready() -> None:
    import json

    doc = json.loads(json.dumps(to_check(aggregate(cluster(3, 1))).data))
    assert set(doc) >= {"rows", "hosts", "slowest_rank", "stragglers", "skipped_hosts", "rank_bandwidth_gbs",
                        "host_bandwidth_gbs", "world_size", "backend", "abandoned", "truncated", "time_limit_s"}
    assert doc["rows"][0] == {"bytes": 8192, "iters": 5, "time_us": 1000.0, "algbw_gbs": 0.0082,
                              "busbw_gbs": 0.0109, "slowest_rank": 0, "slowest_time_us": 1000.0}


@pytest.mark.parametrize("text, size", [("64M", 64 << 20), ("8K", 8 << 10), ("1GiB", 1 << 30), ("16384", 16384)])
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size and human_size(size)


@pytest.mark.parametrize("text", ["4K", "2G", "3M", "lots", ""])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_selected_gpus_from_a_report() -> None:
    report = {"checks": [{"name": "gpu", "data": {"devices": [{"index": 0, "selected": False},
                                                              {"index": 1, "selected": True}]}}]}
    assert selected_gpus(report) == [1] and selected_gpus({"checks": []}) is None


# ---- a cluster's collective step, combined: each host's offer (its probe) and outcome (its ranks) ----

def outcome(events: list[dict], **extra) -> dict:
    return {"events": events, "tails": {}, "codes": {}, "first_failure": None, "abandoned": False,
            "elapsed_s": 1.5, **extra}


def test_every_host_s_events_make_one_world() -> None:
    from fdl.collective.run import combine

    events = cluster(2, 1)
    offers = {"h0": {"host": "h0", "ranks": 1, "torch": "2.13.0"}, "h1": {"host": "h1", "ranks": 1, "torch": "2.13.0"}}
    result = combine(offers, {"h0": outcome([e for e in events if e["rank"] == 0]),
                              "h1": outcome([e for e in events if e["rank"] == 1], elapsed_s=2.0)},
                     hosts=["h0", "h1"], time_limit_s=60)
    assert result.finished and result.hosts == {"h0": [0], "h1": [1]} and result.failure is None
    assert result.elapsed_s == 2.0 and to_check(result).status == "ok"


def test_a_host_without_pytorch_is_skipped_and_one_that_took_no_part_fails_the_test() -> None:
    from fdl.collective.run import combine

    offers = {"a": {"host": "a", "ranks": 2, "torch": "2.13.0"},
              "b": {"host": "b", "ranks": 0, "skipped": "/usr/bin/python3: No module named 'torch'"},
              "c": {"host": "c", "ranks": 0, "error": "/x/python did not answer the PyTorch check within 30 s"},
              "e": {"host": "e", "ranks": 1, "torch": "2.13.0"}}
    events = [start(r, "a", 2) for r in range(2)] + [allreduce(r, MIB, 0.01) for r in range(2)] + [done(0), done(1)]
    result = combine(offers, {"a": outcome(events), "b": outcome([]), "c": outcome([]), "e": {"msg": "timed out"}},
                     hosts=["a", "b", "c", "d", "e"], time_limit_s=60)
    assert result.skipped_hosts == {"b": "/usr/bin/python3: No module named 'torch'"}
    assert result.failure == ("c: /x/python did not answer the PyTorch check within 30 s; "
                              "d did not take part (its probe did not finish); e did not run its ranks (timed out)")
    check = to_check(result)
    assert check.status == "error" and "Skipped, PyTorch cannot be imported there: b (" in check.message


def test_a_rank_that_failed_without_saying_why_is_named_with_its_last_line() -> None:
    from fdl.collective.run import combine

    offers = {"a": {"host": "a", "ranks": 1, "torch": "2.13.0"}}
    failed = outcome([], first_failure=0, codes={"0": 139}, tails={"0": ["Segmentation fault"]})
    result = combine(offers, {"a": failed}, hosts=["a"], time_limit_s=60)
    assert result.failure == "rank 0 on a exited with code 139 (Segmentation fault)"
    assert "did not complete: rank 0 on a exited with code 139" in to_check(result).message
