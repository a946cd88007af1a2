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
# peers had no share at all; an IPv6 host (billions of addresses) or a /24 got one share per address.


def test_the_gate_holds_a_stranger_to_its_share_and_keeps_a_reserve_for_members() -> None:
    from fdl.controller.gate import Gate

    members = {"10.0.0.2": 1}
    shed: list = []
    gate = Gate(lambda: None, max_connections=10, per_peer=4, per_net=100, per_member=0, reserve=3,
                members_at=lambda peer: members.get(peer, 0), shed=shed.append)
    assert [gate.admit("10.0.0.9")[0] for _ in range(6)] == [True] * 4 + [False] * 2  # one stranger: 4 of 10
    for i in range(6):
        assert gate.admit(f"10.0.1.{i}")[0]  # other strangers fill the total ...
    assert not gate.admit("10.0.1.99")[0] and gate.total == 10
    assert [gate.admit("10.0.0.2")[0] for _ in range(4)] == [True, True, True, False]  # ... a member still gets in
    assert gate.overloaded == 4 and shed == ["10.0.0.9", "10.0.0.9", "10.0.1.99", "10.0.0.2"]
    gate.release("10.0.0.9", "10.0.0.0/24")
    assert gate.by_peer["10.0.0.9"] == 3 and gate.admit("10.0.0.9")[0] is False  # the total is still full
    for _ in range(3):
        gate.release("10.0.0.2", None)
    assert gate.admit("10.0.0.9")[0] and "10.0.0.2" not in gate.by_peer


def test_loopback_is_a_stranger_and_networks_share_one_share() -> None:
    from fdl.controller.gate import Gate, network_of

    assert network_of("10.1.2.3") == "10.1.2.0/24" and network_of("2001:db8::1:2") == "2001:db8::/64"
    gate = Gate(lambda: None, max_connections=1000, per_peer=4, per_net=6, per_member=2, reserve=10,
                members_at=lambda peer: 3 if peer == "10.0.0.2" else 0, shed=lambda peer: None)
    assert [gate.admit("127.0.0.1")[0] for _ in range(5)] == [True] * 4 + [False]  # loopback: a stranger's share
    assert [gate.admit(f"10.9.9.{i}")[0] for i in range(10)] == [True] * 6 + [False] * 4  # one /24: one share
    assert [gate.admit(f"2001:db8::{i}")[0] for i in range(10)] == [True] * 6 + [False] * 4  # one /64 too
    assert gate.admit("2001:db8:0:1::1") == (True, "2001:db8:0:1::/64")  # the next /64 is another network
    # an address holding three members: per_peer + 2 per member, and not counted in its network's share
    assert [gate.admit("10.0.0.2")[0] for _ in range(11)] == [True] * 10 + [False]
    assert gate.admit("10.0.0.3") == (True, "10.0.0.0/24")


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
