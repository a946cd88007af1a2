"""What every layer of the endpoint shares about HTTP: its bounds, the loopback test, the JSON envelope."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from fdl.controller.protocol import MAX_BODY

JSON_TYPE = "application/json"


@dataclass(frozen=True)
class Limits:
    """Bounds on what any peer can make the server hold."""

    max_body: int = MAX_BODY  # bytes in a request body
    max_line: int = 4096  # request line / header line length
    max_field: int = 4096  # one header value
    max_headers: int = 32  # header count
    head_timeout_s: float = 10.0  # the TLS handshake, then each complete request head, within this (also idle)
    body_timeout_s: float = 10.0  # a request's body must arrive within this
    write_timeout_s: float = 10.0  # an answer the peer has not drained within this aborts its connection
    send_buffer: int = 64 * 1024  # SO_SNDBUF of accepted sockets (small and fixed: no autotuning for a non-reader)
    max_connections: int = 10_000  # open connections of strangers (no request on them proved the run's token)
    max_per_peer: int = 64  # strangers' connections of one peer: an address, on loopback an address and account
    max_per_net: int = 256  # strangers in one /24 (IPv4) or /64 (IPv6) together; never over a quarter of the total
    stranger_idle_s: float = 2.0  # a stranger's keep-alive connection idle this long after an answer is closed
    max_trusted: int = 10_000  # connections that carried a proof of the token, beyond the strangers' ones
    per_member: int = 4  # proved connections of one peer: max_per_peer plus this many per member at its address
    backlog: int = 4096


def is_loopback(remote: str | None) -> bool:
    """Whether a peer address is this machine's loopback (IPv4 127/8, ::1, or IPv4-mapped 127/8)."""
    if not remote:
        return False
    try:
        ip = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def json_bytes(obj: Any) -> bytes:
    """obj as compact JSON."""
    return json.dumps(obj, separators=(",", ":")).encode()


def json_response(obj: Any, status: int = 200, *, close: bool = False, raw: bytes | None = None) -> web.Response:
    """A JSON answer that no cache keeps (raw: the body, already serialized)."""
    resp = web.Response(body=raw if raw is not None else json_bytes(obj), status=status, content_type=JSON_TYPE,
                        headers={"Cache-Control": "no-store"})
    if close:
        resp.force_close()
    return resp


def error_response(status: int, reason: str, message: str, *, close: bool = False) -> web.Response:
    """The one error envelope: `{"ok": false, "reason": CODE, "message": SENTENCE}`."""
    return json_response({"ok": False, "reason": reason, "message": message}, status, close=close)
