"""Who counts as loopback: the peer address the socket reports, nothing a client can write."""

from __future__ import annotations

import pytest

from fdl.controller.wire import is_loopback


@pytest.mark.parametrize("remote, expected", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.213.5.2", False), ("::ffff:10.0.0.1", False), ("fe80::1%eth0", False), ("0.0.0.0", False),
    ("", False), (None, False), ("localhost", False), ("not an address", False),
])
def test_is_loopback(remote, expected) -> None:
    assert is_loopback(remote) is expected


# regression: one peer could hold every connection the controller allows, and members' requests got 503; loopback
# peers had no share at all; an IPv6 host (billions of addresses) or a /24 got one share per address. Then (issue 37
# finding 6): four addresses of one /24 held its whole share and shut out their neighbours' walk-ins; strangers'
# keep-alive connections from many networks filled every slot; members had only a reserve strangers shared.


def shares(**limits):
    from fdl.controller.gate import Shares

    members = limits.pop("members", {})
    shed: list = []
    base = dict(max_connections=1000, per_peer=4, per_net=100, max_trusted=100, per_member=0,
                members_at=lambda address: members.get(address, 0), shed=shed.append)
    base.update(limits)
    made = Shares(**base)
    made.shed_log = shed
    return made


class Cut:
    """The one thing the shares do to a connection's transport: abort it."""

    aborted = False

    def abort(self) -> None:
        self.aborted = True


def entry(address: str, *, idle: bool = False, at: float = 0.0, key: str | None = None):
    from fdl.controller.gate import Entry, network_of

    made = Entry(address, key or address, network_of(address), at)
    made.transport = Cut()
    made.inflight = 0 if idle else 1  # idle: TLS up, nothing in flight
    return made


def admitted(gate, *entries) -> list[bool]:
    return [gate.admit(e) for e in entries]


def test_a_stranger_is_held_to_its_share_and_a_proved_connection_leaves_it() -> None:
    gate = shares(per_peer=4, members={"10.0.0.2": 2}, per_member=2, max_trusted=7)
    held = [entry("10.0.0.9") for _ in range(6)]
    assert admitted(gate, *held) == [True] * 4 + [False] * 2  # nothing idle of its own to give up
    assert gate.shed_log == ["10.0.0.9", "10.0.0.9"] and gate.refused == 2
    gate.promote(held[0])  # a request on it proved the token: the peer's stranger share has room again
    assert held[0].trusted and gate.trusted == 1 and gate.strangers == 3
    assert gate.admit(entry("10.0.0.9"))
    proved = [entry("10.0.0.2") for _ in range(9)]
    assert all(admitted(gate, *proved[:4]))
    for e in proved[:4]:
        gate.promote(e)
    assert all(admitted(gate, *proved[4:8]))
    for e in proved[4:8]:
        gate.promote(e)  # per_peer 4 + 2 per member (2 members): 8, but the pool holds 7 in all (one is .9's)
    assert [e.trusted for e in proved[:8]] == [True] * 6 + [False] * 2 and gate.trusted == 7
    gate.release(held[0])
    gate.release(held[0])  # idempotent
    assert gate.trusted == 6 and gate.total == 6 + gate.strangers


def test_several_addresses_of_one_24_cannot_shut_out_their_neighbours_walk_in() -> None:
    gate = shares(per_peer=64, per_net=8)
    flood = [entry(f"10.9.9.{1 + i % 4}", at=i) for i in range(8)]  # one LAN host, four addresses, all busy
    assert all(admitted(gate, *flood))
    assert not gate.admit(entry("10.9.9.1"))  # the /24 is full, .1 is among its heaviest, nothing idle: refused
    neighbour = entry("10.9.9.77")
    assert gate.admit(neighbour) and gate.evicted == 1  # one of the four gave up a slot
    assert sum(e.released for e in flood) == 1 and sum(e.transport.aborted for e in flood) == 1
    assert not neighbour.released
    assert gate.nets.count["10.9.9.0/24"] == 8


def test_strangers_from_many_networks_cannot_fill_the_slots_against_a_walk_in() -> None:
    gate = shares(max_connections=20, per_peer=2, per_net=2)
    busy = [entry(f"10.{n}.0.1", at=n) for n in range(10)]  # requests in flight: never idle
    idle = [entry(f"10.{n}.0.2", idle=True, at=100 + n) for n in range(10)]  # keep-alive GET /join/id, between asks
    assert all(admitted(gate, *busy, *idle)) and gate.strangers == 20
    walk_in = entry("192.168.7.5")
    assert gate.admit(walk_in)  # a network holding nothing takes a slot from the heaviest, an idle one first
    assert [e.released for e in idle] == [True] + [False] * 9 and not any(e.released for e in busy)
    again = entry("192.168.7.5")
    assert gate.admit(again)  # its /24 now holds one, others two: still lighter
    assert not gate.admit(entry("192.168.7.5"))  # its peer's share (2) is full and nothing of its own is idle
    gate.promote(walk_in)  # it proved the token: strangers can no longer take its slot
    assert walk_in.trusted and gate.strangers == 19


def test_loopback_accounts_and_ipv6_networks_are_groups_of_their_own() -> None:
    from fdl.controller.gate import network_of

    assert network_of("10.1.2.3") == "10.1.2.0/24" and network_of("2001:db8::1:2") == "2001:db8::/64"
    gate = shares(per_peer=4, per_net=6)
    pollers = [entry("127.0.0.1", key="127.0.0.1#uid1001") for _ in range(4)]
    assert all(admitted(gate, *pollers))
    assert not gate.admit(entry("127.0.0.1", key="127.0.0.1#uid1001"))  # that account's share is full ...
    assert gate.admit(entry("127.0.0.1", key="127.0.0.1#uid1000"))  # ... not another account's on the address
    assert admitted(gate, *(entry(f"2001:db8::{i}") for i in range(7))) == [True] * 6 + [False]
    assert gate.admit(entry("2001:db8:0:1::1"))  # the next /64 is another network


def test_only_answered_idle_strangers_are_swept() -> None:
    gate = shares()
    fresh, answered, busy, proved = entry("10.0.0.1", idle=True), entry("10.0.0.2", idle=True), \
        entry("10.0.0.3", idle=True), entry("10.0.0.4", idle=True)
    assert all(admitted(gate, fresh, answered, busy, proved))
    answered.answered = busy.answered = proved.answered = True
    busy.inflight = 1
    fresh.answered = False
    gate.promote(proved)
    assert gate.idle_strangers(older_than=1.0) == [answered]


def test_a_member_whose_address_was_shed_for_load_is_not_silent() -> None:
    from fdl.controller.machine import RunMachine
    from fdl.controller.policy import RunPolicy
    from fdl.controller.protocol import Hello
    from fdl.hostside.checks.devices import parse_devices
    from tests.controller_util import FakeClock

    clock = FakeClock()
    m = RunMachine(RunPolicy(window_s=600, quorum_hosts=2, silence_s=10), clock=clock)
    for host, peer in (("a", "10.0.0.2"), ("b", "10.0.0.3")):
        m.hello(Hello(host=host, devices=parse_devices("cpu:1")), peer=peer, trusted=False, authed=True)
    assert m.peers == {"10.0.0.2": 1, "10.0.0.3": 1}
    for _ in range(3):
        clock.advance(6)
        m.shed("10.0.0.2")  # a's heartbeats are refused for load; b simply stops
        m.shed("10.9.9.9")  # a stranger's shed connections count for nobody
        m.tick()
    assert set(m.members) == {"a"} and m.departed[0]["host"] == "b"
    clock.advance(11)
    m.tick()
    assert m.members == {} and m.peers == {}  # once the shedding stops, silence counts again


#: What the controller may use of aiohttp: its documented server API (the Server reference and the "Low Level
#: Server" page: web.Server is the protocol factory for loop.create_server; AppRunner.server hands it out).
AIOHTTP_DOCUMENTED = {"Application", "AppRunner", "BaseRequest", "Request", "Response", "StreamResponse", "Server",
                      "middleware", "HTTPException", "HTTPNotFound", "HTTPMethodNotAllowed"}


def test_the_controller_subclasses_nothing_of_aiohttp_and_uses_only_its_documented_api() -> None:
    """regression (issue 39 item 6): gate.py subclassed aiohttp's `web.RequestHandler` and overrode methods that
    are no documented extension point (connection_made, pause_writing, handle_error, log_exception...)."""
    import ast
    from pathlib import Path

    import fdl.controller

    for source in sorted(Path(fdl.controller.__file__).parent.glob("*.py")):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        from_aiohttp = {alias.asname or alias.name for node in ast.walk(tree)
                        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiohttp")
                        for alias in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    root = base
                    while isinstance(root, ast.Attribute):
                        root = root.value
                    assert not (isinstance(root, ast.Name) and root.id in from_aiohttp), \
                        f"{source.name}:{node.lineno}: class {node.name} subclasses aiohttp's {ast.unparse(base)}"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "web":
                assert node.attr in AIOHTTP_DOCUMENTED, f"{source.name}:{node.lineno}: web.{node.attr}"


def test_the_server_uses_aiohttps_public_api_and_enums() -> None:
    """regression: server.py subclassed aiohttp's private RequestHandler import and read `_connections`,
    `_kwargs` and `_loop` of web.Server; phases and switch states were bare strings."""
    import ast
    import json
    from pathlib import Path

    import fdl.controller
    from fdl.controller.states import PHASES, Phase, Switch

    sources = sorted(Path(fdl.controller.__file__).parent.glob("*.py"))
    assert {"server.py", "gate.py", "routes.py"} <= {path.name for path in sources}
    for source in sources:
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.module in (None, "aiohttp") or not node.module.startswith("aiohttp."), node.module
            if isinstance(node, ast.Attribute) and node.attr in ("_connections", "_kwargs"):
                raise AssertionError(f"private aiohttp attribute {node.attr} read at {source.name}:{node.lineno}")
    assert [p.value for p in PHASES] == ["waiting", "staging", "forming", "training", "done", "failed"]
    assert json.dumps({"phase": Phase.FAILED, "switch": Switch.FIRED}) == '{"phase": "failed", "switch": "fired"}'
