"""Join protocol parsing: what is accepted, what is refused and how it is worded."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fdl.controller.protocol import (
    BadRequest,
    Hello,
    decode,
    hello_body,
    parse_hello,
    parse_start,
    parse_ticketed,
)
from fdl.hostside.checks.devices import parse_devices


def test_hello_round_trip() -> None:
    hello = Hello(host="node-b", devices=parse_devices("0,1"), run_id="r-1", signature="ab12",
                  address="10.0.0.12", data_path="/flodl/data", gpu_ram_share=0.5, gpu_names=("A", "B"),
                  agent="fdl 0.1.0")
    assert parse_hello(json.loads(json.dumps(hello_body(hello)))) == hello
    assert parse_hello({"host": "h", "devices": [0, 2]}).devices.ids == (0, 2)
    assert parse_hello({"host": "h", "devices": "cpu:3"}).devices.ranks() == 3


@pytest.mark.parametrize("body, needle", [
    ({}, "'host' is required"),
    ({"host": "a b", "devices": "0"}, "'host' must be"),
    ({"host": "a;rm -rf", "devices": "0"}, "'host' must be"),
    ({"host": "h"}, "'devices' is required"),
    ({"host": "h", "devices": "all"}, "not 'all'"),
    ({"host": "h", "devices": "0,0"}, "listed twice"),
    ({"host": "h", "devices": "cpu:0"}, "cpu:N"),
    ({"host": "h", "devices": True}, "'devices' must be"),
    ({"host": "h", "devices": {"x": 1}}, "'devices' must be"),
    ({"host": "h", "devices": "0", "run_id": 5}, "'run_id' must be"),
    ({"host": "h", "devices": "0", "run_id": "a b"}, "'run_id' must be"),
    ({"host": "h", "devices": "0", "signature": "x" * 200}, "1 to 128"),
    ({"host": "h", "devices": "0", "token": "a"}, "never carries the token"),  # regression: it went in clear
    ({"host": "h", "devices": "0", "agent": "a\nb"}, "control characters"),
    ({"host": "h", "devices": "0", "data_path": "rel/path"}, "absolute"),
    ({"host": "h", "devices": "0", "gpu_ram_share": 1.5}, "fraction"),
    ({"host": "h", "devices": "0", "gpu_ram_share": float("nan")}, "fraction"),
    ({"host": "h", "devices": "0", "protocol": 9}, "protocol 9 is not spoken"),
    ({"host": "h", "devices": "0", "gpu_names": ["x"] * 100}, "gpu_names"),
])
def test_hello_refusals_name_the_field(body: dict, needle: str) -> None:
    with pytest.raises(BadRequest, match=needle):
        parse_hello(body)


def test_decode_accepts_objects_only() -> None:
    assert decode(b"") == {} and decode(b'{"a":1}') == {"a": 1}
    for raw, needle in ((b"[1]", "JSON object"), (b"{", "not valid JSON"), (b"\xff\xfe", "not UTF-8|not valid"),
                        (b"[" * 100_000, "not valid JSON")):
        with pytest.raises(BadRequest, match=needle):
            decode(raw)


def test_ticketed_messages() -> None:
    assert parse_ticketed({"ticket": "m1.x", "wait_s": 3}, kind="world").wait_s == 3.0
    assert parse_ticketed({"ticket": "m1.x", "running": True}, kind="heartbeat").running is True
    exit_ = parse_ticketed({"ticket": "m1.x", "code": 2, "detail": "boom"}, kind="exit")
    assert (exit_.code, exit_.detail) == (2, "boom")
    for body, kind, needle in (({}, "world", "'ticket' is required"), ({"ticket": "t", "wait_s": 1e9}, "world",
                                                                       "wait_s"),
                               ({"ticket": "t", "running": "yes"}, "heartbeat", "running"),
                               ({"ticket": "t"}, "exit", "'code' is required"),
                               ({"ticket": "t", "code": True}, "exit", "'code'")):
        with pytest.raises(BadRequest, match=needle):
            parse_ticketed(body, kind=kind)
    assert parse_start({}) is None
    with pytest.raises(BadRequest, match="never carries the token"):
        parse_start({"token": "abc"})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20)
hello_like = st.fixed_dictionaries({}, optional={
    "host": json_values | st.from_regex(r"[a-z0-9.-]{1,20}", fullmatch=True),
    "devices": json_values | st.sampled_from(["0", "0,1", "cpu:2", "all", "cpu:999", "1,1"]),
    "run_id": json_values, "signature": json_values, "token": json_values, "address": json_values,
    "data_path": json_values, "gpu_ram_share": json_values, "gpu_names": json_values, "protocol": json_values,
})


@settings(max_examples=400, deadline=None)
@given(hello_like)
def test_any_json_is_a_hello_or_a_bad_request(body: dict) -> None:
    try:
        hello = parse_hello(body)
    except BadRequest as exc:
        assert str(exc)
    else:
        assert hello.devices.ranks() >= 1 and hello.host


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_decode_or_are_a_bad_request(raw: bytes) -> None:
    try:
        value = decode(raw)
    except BadRequest:
        return
    assert isinstance(value, dict)
