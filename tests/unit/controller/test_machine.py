"""The run state machine on a fake clock: window, quorum, start modes, refusals, liveness, exits."""

from __future__ import annotations

import json

import pytest

from fdl.controller.machine import RunMachine
from fdl.controller.policy import RosterHost, RunPolicy
from fdl.controller.protocol import Hello
from fdl.controller.states import Refused
from fdl.errors import ConfigError
from fdl.hostside.checks.devices import parse_devices
from tests.controller_util import FakeClock

PEER = "10.213.5.2"


def machine(clock: FakeClock | None = None, **policy) -> RunMachine:
    policy.setdefault("window_s", 60.0)
    policy.setdefault("silence_s", 1e6)  # liveness has its own tests
    return RunMachine(RunPolicy(**policy), clock=clock or FakeClock(), wall=lambda: 1_700_000_000.0)


def hello(host: str, devices: str = "cpu:1", **kw) -> Hello:
    return Hello(host=host, devices=parse_devices(devices), **kw)


def join(m: RunMachine, host: str, devices: str = "cpu:1", *, trusted: bool = True, peer: str = "127.0.0.1", **kw):
    return m.hello(hello(host, devices, **kw), peer=peer, trusted=trusted)


def refused(fn, *args, **kwargs) -> Refused:
    with pytest.raises(Refused) as info:
        fn(*args, **kwargs)
    return info.value


# ---------------------------------------------------------------- window and quorum


def test_window_counts_from_first_admission_not_from_start() -> None:
    clock = FakeClock()
    m = machine(clock, quorum_hosts=2, window_s=30)
    clock.advance(500)  # an idle controller has no deadline
    m.tick()
    assert m.phase == "waiting" and m.state()["window"]["deadline"] is None
    join(m, "a")
    clock.advance(10)
    state = m.state()
    assert state["window"]["seconds_left"] == pytest.approx(20)
    assert state["quorum"] == {"need": {"hosts": 2, "ranks": 0}, "have": {"hosts": 1, "ranks": 1}, "met": False}


def test_auto_forms_on_the_clock_once_quorum_is_met() -> None:
    clock = FakeClock()
    m = machine(clock, quorum_hosts=2, window_s=30)
    join(m, "a", "0,1")
    join(m, "b", "cpu:2")
    assert m.phase == "staging"
    clock.advance(29.9)
    m.tick()
    assert m.phase == "staging"
    clock.advance(0.2)
    m.tick()
    assert m.phase == "forming" and m.formed_by == "window deadline"
    assert m.world is not None and m.world.size == 4


def test_auto_without_quorum_fails_when_the_window_closes_and_later_hellos_are_refused() -> None:
    clock = FakeClock()
    m = machine(clock, quorum_hosts=3, window_s=5)
    join(m, "a")
    join(m, "b")
    clock.advance(5)
    m.tick()
    assert m.phase == "failed"
    assert "without quorum (2 of 3 hosts)" in m.reason
    err = refused(join, m, "c")
    assert err.reason == "window_closed" and "failed" in err.message


def test_deadline_is_checked_on_requests_without_waiting_for_a_tick() -> None:
    clock = FakeClock()
    m = machine(clock, window_s=5)
    join(m, "a")
    clock.advance(6)
    err = refused(join, m, "b")  # no tick() in between
    assert err.reason == "window_closed"
    assert m.phase == "forming"


def test_discovery_auto_forms_when_capacity_is_reached() -> None:
    m = machine(max_hosts=3)
    for host in ("a", "b"):
        join(m, host)
        assert m.phase == "staging"
    join(m, "c")
    assert m.phase == "forming" and m.formed_by == "roster complete"


def test_quorum_in_ranks() -> None:
    m = machine(start="manual", quorum_hosts=1, quorum_ranks=4)
    join(m, "a", "0,1")
    assert m.phase == "waiting"
    err = refused(m.fire, peer="127.0.0.1", trusted=True)
    assert err.reason == "quorum_not_met"
    assert err.extra == {"have": {"hosts": 1, "ranks": 2}, "need": {"hosts": 1, "ranks": 4}}
    assert "1 of 1 hosts, 2 of 4 ranks" in err.message
    join(m, "b", "0,1")
    assert m.phase == "staging"


# ---------------------------------------------------------------- roster runs


def roster_policy(**kw) -> dict:
    kw.setdefault("discovery", False)
    kw.setdefault("roster", (RosterHost("node-a", parse_devices("0,1"), address="10.0.0.11", data_path="/data/a"),
                             RosterHost("node-b", parse_devices("cpu:2"), address="10.0.0.12"),
                             RosterHost("node-c", parse_devices("0"), address="10.0.0.13")))
    return kw


def rjoin(m: RunMachine, host: str, devices: str):
    """A roster host's hello, from its roster address."""
    return join(m, host, devices, peer=m.policy.roster[m.policy.roster_names.index(host)].address, trusted=False)


def test_roster_run_admits_only_its_hosts_and_forms_in_roster_order() -> None:
    m = machine(**roster_policy())
    err = refused(join, m, "stranger")
    assert err.reason == "not_in_roster" and "node-a, node-b, node-c" in err.message
    rjoin(m, "node-c", "0")
    rjoin(m, "node-a", "0,1")
    assert m.phase == "waiting"  # a roster run's default quorum is the whole roster
    assert m.state()["expected"] == ["node-b"]
    rjoin(m, "node-b", "cpu:2")
    assert m.phase == "forming" and m.formed_by == "roster complete"
    seats = m.world.seats
    assert [seats[h].first_rank for h in ("node-a", "node-b", "node-c")] == [0, 2, 4]
    assert m.world.master_addr == "10.0.0.11"  # rank 0's host, from the roster
    assert m.world.backend == "gloo"  # a CPU host in the world
    assert m.members["node-a"].data_path == "/data/a"


def test_roster_run_missing_a_host_fails_at_the_deadline_naming_the_count() -> None:
    clock = FakeClock()
    m = machine(clock, **roster_policy(window_s=10))
    rjoin(m, "node-a", "0,1")
    clock.advance(11)
    m.tick()
    assert m.phase == "failed" and "1 of 3 hosts" in m.reason


def test_policy_refuses_a_quorum_the_roster_cannot_reach() -> None:
    with pytest.raises(ConfigError, match="more than the 3 hosts"):
        RunPolicy(**roster_policy(quorum_hosts=4))
    with pytest.raises(ConfigError, match="no roster"):
        RunPolicy(discovery=False)


# ---------------------------------------------------------------- start switch


def test_manual_holds_at_quorum_until_the_switch_is_fired() -> None:
    clock = FakeClock()
    m = machine(clock, start="manual", quorum_hosts=2, max_hosts=2, window_s=60)
    join(m, "a")
    err = refused(m.fire, peer="127.0.0.1", trusted=True)
    assert err.reason == "quorum_not_met" and "1 of 2 hosts" in err.message
    join(m, "b")
    assert m.phase == "staging"  # complete roster, but manual never forms by itself
    assert m.state()["start"]["startable"] is True
    clock.advance(10)
    m.tick()
    assert m.phase == "staging"
    m.fire(peer="127.0.0.1", trusted=True)
    state = m.state()
    assert state["phase"] == "forming" and state["world"]["formed_by"] == "start switch"
    assert state["start"]["switch"] == "fired" and state["start"]["fired_by"] == "127.0.0.1"
    err = refused(m.fire, peer="127.0.0.1", trusted=True)
    assert err.reason == "window_closed"


def test_manual_window_closing_unfired_fails_and_the_switch_then_says_window_closed() -> None:
    clock = FakeClock()
    m = machine(clock, start="manual", quorum_hosts=1, window_s=5)
    join(m, "a")
    clock.advance(5)
    m.tick()
    assert m.phase == "failed" and "before the start switch was fired" in m.reason
    assert refused(m.fire, peer="127.0.0.1", trusted=True).reason == "window_closed"


def test_hybrid_forms_on_whichever_comes_first() -> None:
    clock = FakeClock()
    m = machine(clock, start="hybrid", quorum_hosts=1, window_s=5)
    join(m, "a")
    clock.advance(5)
    m.tick()
    assert m.phase == "forming" and m.formed_by == "window deadline"
    m2 = machine(FakeClock(), start="hybrid", quorum_hosts=1, window_s=5)
    join(m2, "a")
    m2.fire(peer="127.0.0.1", trusted=True)
    assert m2.phase == "forming" and m2.formed_by == "start switch"


def test_auto_mode_has_no_switch() -> None:
    m = machine(quorum_hosts=1)
    join(m, "a")
    err = refused(m.fire, peer="127.0.0.1", trusted=True)
    assert err.reason == "auto_mode" and m.phase == "staging"


def test_refused_fire_is_not_queued() -> None:
    m = machine(start="manual", quorum_hosts=2)
    join(m, "a")
    refused(m.fire, peer="127.0.0.1", trusted=True)
    join(m, "b")
    assert m.phase == "staging" and m.switch == "unarmed"


# ---------------------------------------------------------------- tokens


def test_start_needs_loopback_or_a_proof_of_the_token() -> None:
    m = machine(start="manual", quorum_hosts=1, token="f00d" * 8)
    join(m, "a")
    err = refused(m.fire, peer=PEER, trusted=False)
    assert err.reason == "bad_token" and err.status == 403 and "must be signed" in err.message
    assert m.phase == "staging"
    m.fire(peer=PEER, trusted=True)  # the server passes trusted=True once the request's proof matched
    assert m.phase == "forming" and m.fired_by == PEER


def test_the_switch_needs_a_proof_from_loopback_too() -> None:
    # regression: a loopback peer fired the switch without a proof (every account on the box shares loopback)
    m = machine(start="manual", quorum_hosts=1, token="s3cret")
    join(m, "a", trusted=True)
    for peer in (PEER, "127.0.0.1", "::1"):
        err = refused(m.fire, peer=peer, trusted=False)
        assert err.reason == "bad_token" and "from the controller box" in err.message
    m.fire(peer="127.0.0.1", trusted=True)  # its proof matched
    assert m.phase == "forming"
    open_run = machine(start="manual", quorum_hosts=1)  # no token (insecure_no_token): anyone fires
    join(open_run, "a", trusted=False, peer=PEER)
    open_run.fire(peer=PEER, trusted=False)
    assert open_run.phase == "forming"


def test_join_needs_a_proof_from_every_peer() -> None:
    m = machine(token="s3cret")
    assert refused(join, m, "a", trusted=False, peer=PEER).reason == "bad_token"
    assert refused(join, m, "b", trusted=False, peer="127.0.0.1").reason == "bad_token"  # loopback proves nothing
    m.hello(hello("a"), peer=PEER, trusted=False, authed=True)
    m.hello(hello("b"), peer="127.0.0.1", trusted=False, authed=True)
    assert set(m.members) == {"a", "b"}
    assert m.members["a"].address == PEER
    assert m.refusals == {"bad_token": 2}
    open_run = machine()
    join(open_run, "a", trusted=False, peer=PEER)  # no token configured: open admission
    assert "a" in open_run.members


def test_state_json_names_the_controller_instance() -> None:
    m, other = machine(), machine()
    assert m.state()["controller_id"] == m.controller_id != other.controller_id
    assert len(m.controller_id) == 32 and int(m.controller_id, 16) >= 0


# ---------------------------------------------------------------- roster-bound admission
# regression: a hello naming a roster host from another address was admitted, its address became
# MASTER_ADDR and the real host was refused; a token holder could override the roster's address and devices.


def test_a_roster_host_joins_only_from_its_roster_address_and_the_roster_wins() -> None:
    roster = (RosterHost("node-a", parse_devices("cpu:2"), "10.213.5.7"), RosterHost("node-b", address="10.213.5.8"))
    m = machine(discovery=False, roster=roster, token="t" * 8)
    for peer, authed in (("10.213.5.99", True), ("127.0.0.1", True), ("10.213.5.99", False)):
        err = refused(m.hello, hello("node-a", "0,1,2,3", address="10.9.9.9"), peer=peer, trusted=peer == "127.0.0.1",
                      authed=authed)
        assert err.reason in ("wrong_address", "bad_token") and err.status == 403
    assert m.members == {}
    member = m.hello(hello("node-a", "0,1,2,3", address="10.9.9.9"), peer="::ffff:10.213.5.7", trusted=False,
                     authed=True)
    assert (member.address, str(member.devices), member.ranks) == ("10.213.5.7", "cpu:2", 2)
    m.hello(hello("node-b", "cpu:1"), peer="10.213.5.8", trusted=False, authed=True)
    assert m.world is not None and m.world.master_addr == "10.213.5.7"


def test_hosts_the_launcher_reserves_are_refused_over_the_network_for_the_whole_run() -> None:
    m = machine(discovery=True, reserved=frozenset({"node-a"}), token="t" * 8, quorum_hosts=2)
    for trusted, authed in ((False, True), (True, False), (False, False)):
        err = refused(m.hello, hello("node-a"), peer=PEER, trusted=trusted, authed=authed)
        assert err.reason in ("reserved_host", "bad_token") and err.status == 403
    assert m.refusals.get("reserved_host") == 2 and m.members == {}  # nothing admitted before the launcher joins it
    m.hello(hello("node-a"), peer="launcher", trusted=True, in_process=True)
    m.hello(hello("walkin"), peer=PEER, trusted=False, authed=True)
    assert set(m.members) == {"node-a", "walkin"}


# ---------------------------------------------------------------- cohort refusals


def test_run_id_and_signature_must_match_the_cohort() -> None:
    m = machine()
    join(m, "a", run_id="r1", signature="ab12")
    err = refused(join, m, "b", run_id="r2", signature="ab12")
    assert err.reason == "run_id_differs" and "'r2'" in err.message and "'r1'" in err.message
    assert refused(join, m, "b", run_id=None).reason == "run_id_differs"
    err = refused(join, m, "b", run_id="r1", signature="cd34")
    assert err.reason == "signature_differs"
    join(m, "b", run_id="r1")  # no signature (probe skipped) is not compared
    join(m, "c", run_id="r1", signature="ab12")
    assert m.state()["signature"] == "ab12"


def test_pinned_run_id_is_the_cohort_from_the_start() -> None:
    m = machine(run_id="pub-7")
    assert refused(join, m, "a", run_id="pub-6").reason == "run_id_differs"
    join(m, "a", run_id="pub-7")


def test_the_launchers_own_hosts_leave_the_cohorts_run_id_to_the_walk_ins() -> None:
    """regression (found by the farm end to end): in a discovery window the launcher's own hosts join first,
    in-process and without a run id, and the first of them fixed the cohort's run id at None, so every walk-in
    holding a published run was refused (run_id_differs) and a farm run with a roster worker never formed. The
    cohort's run id is the walk-ins' (docs/launcher.md, "Discovery windows"); they are held to it alone."""
    clock = FakeClock()
    m = machine(clock, silence_s=5, start="manual", reserved=frozenset({"node-a"}))
    m.hello(hello("node-a"), peer="launcher", trusted=True, in_process=True)
    assert m.cohort_run_id is None
    join(m, "w1", run_id="pub-1", peer=PEER)
    assert m.state()["run_id"] == "pub-1"
    assert refused(join, m, "w2", run_id="pub-2", peer=PEER).reason == "run_id_differs"
    assert refused(join, m, "w2", run_id=None, peer=PEER).reason == "run_id_differs"
    join(m, "w2", run_id="pub-1", peer=PEER)
    # the walk-ins fall silent (the launcher's host beats in-process): the next publish's walk-ins set it anew
    clock.advance(6)
    m.heartbeat(m.members["node-a"].ticket)
    m.tick()
    assert set(m.members) == {"node-a"} and m.cohort_run_id is None
    join(m, "w3", run_id="pub-2", peer=PEER)
    assert m.cohort_run_id == "pub-2"


def test_host_joins_once_and_roster_has_a_capacity() -> None:
    m = machine(max_hosts=2, start="manual")
    join(m, "a")
    err = refused(join, m, "a")
    assert err.reason == "host_joined"
    join(m, "b")
    err = refused(join, m, "c")
    assert err.reason == "roster_full" and "2 hosts" in err.message
    ranks = machine(max_ranks=3)
    join(ranks, "a", "cpu:2")
    assert refused(join, ranks, "b", "cpu:2").reason == "roster_full"


def test_cohort_resets_when_the_roster_empties_before_forming() -> None:
    clock = FakeClock()
    m = machine(clock, silence_s=5, quorum_hosts=2)
    join(m, "a", run_id="old")
    clock.advance(6)
    m.tick()
    assert not m.members
    join(m, "b", run_id="new")
    assert m.cohort_run_id == "new"


# ---------------------------------------------------------------- liveness


def test_silent_member_is_dropped_before_forming_and_may_join_again() -> None:
    clock = FakeClock()
    m = machine(clock, quorum_hosts=2, silence_s=5, window_s=60)
    a = join(m, "a")
    b = join(m, "b")
    assert m.phase == "staging"
    clock.advance(3)
    m.heartbeat(a.ticket)
    clock.advance(3)
    m.tick()
    assert set(m.members) == {"a"} and m.phase == "waiting"
    state = m.state()
    assert state["departed"][0]["host"] == "b" and "silent" in state["departed"][0]["reason"]
    err = refused(m.heartbeat, b.ticket)
    assert err.reason == "unknown_ticket" and err.status == 410
    join(m, "b")
    assert m.phase == "staging"


def test_a_member_holding_a_world_poll_is_alive() -> None:
    clock = FakeClock()
    m = machine(clock, quorum_hosts=2, silence_s=5)
    a = join(m, "a")
    member = m.poll_begin(a.ticket)
    clock.advance(30)
    m.tick()
    assert "a" in m.members
    m.poll_end(member)
    clock.advance(5.1)
    m.tick()
    assert "a" not in m.members


def test_silence_after_forming_fails_the_run() -> None:
    clock = FakeClock()
    m = machine(clock, max_hosts=2, silence_s=5)
    a = join(m, "a")
    join(m, "b")
    assert m.phase == "forming"
    for _ in range(3):
        clock.advance(2)
        m.heartbeat(a.ticket, running=True)
        m.tick()
    assert m.phase == "failed" and "host b went silent" in m.reason
    answer = m.heartbeat(a.ticket)
    assert answer.host == "a"  # still a member; the HTTP reply tells it to stop


# ---------------------------------------------------------------- after forming


def test_running_then_exits_zero_end_done() -> None:
    m = machine(max_hosts=2)
    a, b = join(m, "a"), join(m, "b")
    assert m.world_reply(m.poll_begin(a.ticket)) is not None
    m.heartbeat(a.ticket, running=True)
    assert m.phase == "forming"
    m.heartbeat(b.ticket, running=True)
    assert m.phase == "training"
    m.report_exit(a.ticket, 0)
    assert m.phase == "training"
    m.report_exit(b.ticket, 0)
    assert m.phase == "done"
    assert [e["exit_code"] for e in m.state()["roster"]] == [0, 0]


def test_a_nonzero_exit_fails_the_run_naming_the_host() -> None:
    m = machine(max_hosts=2)
    a, b = join(m, "a"), join(m, "b")
    m.report_exit(b.ticket, 3, "rank 1 raised")
    assert m.phase == "failed" and m.reason == "host b exited 3: rank 1 raised"
    m.report_exit(a.ticket, 0)
    assert m.phase == "failed"


def test_exit_before_forming_leaves_the_window() -> None:
    m = machine(quorum_hosts=2)
    a = join(m, "a")
    join(m, "b")
    m.report_exit(a.ticket, 1)
    assert set(m.members) == {"b"} and m.phase == "waiting"


def test_forged_ticket_secret_is_refused() -> None:
    m = machine()
    a = join(m, "a")
    ident = a.ticket.split(".")[0]
    for ticket in (f"{ident}.{'0' * 32}", f"{ident}.", "m99." + a.secret, "garbage", ""):
        assert refused(m.heartbeat, ticket).reason == "unknown_ticket"


# ---------------------------------------------------------------- state.json


def test_state_json_reflects_every_change_and_is_valid_json() -> None:
    clock = FakeClock()
    m = machine(clock, start="manual", quorum_hosts=1)
    seen = []
    m.listeners.append(lambda machine_: seen.append(machine_.version))
    body = m.state_json()
    assert json.loads(body)["roster"] == []
    a = join(m, "a", "0,1", gpu_names=("NVIDIA H100", "NVIDIA H100"), run_id="r1")
    state = json.loads(m.state_json())
    entry = state["roster"][0]
    assert entry["host"] == "a" and entry["devices"] == "0,1" and entry["ranks"] == 2
    assert entry["gpu_names"] == ["NVIDIA H100", "NVIDIA H100"] and entry["status"] == "joined"
    assert entry["admitted_at"] == pytest.approx(1_700_000_000.0, abs=1)
    assert state["run_id"] == "r1" and state["phase"] == "staging" and seen
    m.fire(peer="127.0.0.1", trusted=True)
    m.world_reply(m.poll_begin(a.ticket))
    entry = json.loads(m.state_json())["roster"][0]
    assert entry["status"] == "assigned" and entry["first_rank"] == 0
    clock.advance(2)
    m.heartbeat(a.ticket, running=True)
    state = m.state()
    assert state["roster"][0]["status"] == "running" and state["phase"] == "training"
    assert state["roster"][0]["last_seen"] == pytest.approx(1_700_000_002.0, abs=0.01)


# ---------------------------------------------------------------- counters (state.json, GET /metrics)


def test_admissions_and_exit_reports_are_counted_once_each() -> None:
    clock = FakeClock()
    m = machine(clock, start="manual", quorum_hosts=2, silence_s=5)
    a = join(m, "a")
    join(m, "gone")
    clock.advance(6)
    m.heartbeat(a.ticket)
    m.tick()  # "gone" is dropped, joins again: a second admission
    left = join(m, "gone")
    m.report_exit(left.ticket, 7)  # leaves before forming: an exit report all the same
    b = join(m, "b")
    m.fire(peer="127.0.0.1", trusted=True)
    m.report_exit(a.ticket, 0)
    m.report_exit(b.ticket, 1)
    m.report_exit(b.ticket, 1)  # a repeated report is not counted again
    state = m.state()
    assert m.admissions == state["admissions"] == 4
    assert state["exits"] == {"0": 1, "1": 1, "7": 1}
