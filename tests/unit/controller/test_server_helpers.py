"""Who counts as loopback: the peer address the socket reports, nothing a client can write."""

from __future__ import annotations

import pytest

from fdl.controller.server import is_loopback


@pytest.mark.parametrize("remote, expected", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.213.5.2", False), ("::ffff:10.0.0.1", False), ("fe80::1%eth0", False), ("0.0.0.0", False),
    ("", False), (None, False), ("localhost", False), ("not an address", False),
])
def test_is_loopback(remote, expected) -> None:
    assert is_loopback(remote) is expected
