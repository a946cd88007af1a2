"""Which local account holds the other end of a loopback connection (the kernel's sock_diag, as `ss -e` shows).

On loopback every account of the box shares the same addresses, so an
address says nothing about who is dialing: the controller's shares are kept
per account there instead (fdl.controller.gate). The kernel knows the owner
of the peer's socket, and tells it through NETLINK_SOCK_DIAG: one exact
lookup of the peer's TCP socket by its four-tuple (`inet_diag_req_v2`,
linux/inet_diag.h), answered with its `idiag_uid`. Unprivileged, one round
trip to the kernel, no scan of /proc/net/tcp.
"""

from __future__ import annotations

import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLMSG_ERROR = 0x2
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_REQUEST = struct.Struct("=BBBBI")  # inet_diag_req_v2 head: family, protocol, ext, pad, states
_SOCKID = struct.Struct(">HH16s16s")  # inet_diag_sockid head: sport, dport, src, dst (network order)
_SOCKID_TAIL = struct.Struct("=III")  # idiag_if, idiag_cookie[2]
_MSG_HEAD = struct.Struct("=BBBB")  # inet_diag_msg: family, state, timer, retrans (then the sockid)
_MSG_TAIL = struct.Struct("=IIIII")  # expires, rqueue, wqueue, uid, inode
NO_COOKIE = 0xFFFFFFFF


class PeerOwners:
    """Looks up the account owning a loopback peer's socket; None when the kernel cannot say (no sock_diag,
    the peer gone already). One netlink socket, opened on first use and kept."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._seq = 0
        self.broken = False  # the kernel refused sock_diag once: do not ask again

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def uid(self, family: int, peer: tuple[str, int], local: tuple[str, int]) -> int | None:
        """The uid owning the TCP socket at peer that is connected to local (both on this box)."""
        if self.broken:
            return None
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
                self._sock.settimeout(0.2)
            return self._ask(family, peer, local)
        except OSError:
            self.broken = self._sock is None
            self.close()
            return None

    def _ask(self, family: int, peer: tuple[str, int], local: tuple[str, int]) -> int | None:
        assert self._sock is not None
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        src = socket.inet_pton(family, peer[0]).ljust(16, b"\0")
        dst = socket.inet_pton(family, local[0]).ljust(16, b"\0")
        body = (_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
                + _SOCKID.pack(peer[1], local[1], src, dst) + _SOCKID_TAIL.pack(0, NO_COOKIE, NO_COOKIE))
        self._sock.send(_HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, self._seq,
                                     0) + body)
        while True:
            data = self._sock.recv(8192)
            length, kind, _, seq, _ = _HEADER.unpack_from(data)
            if seq != self._seq:
                continue  # an answer to an earlier lookup that timed out
            if kind == NLMSG_ERROR or length < _HEADER.size + _MSG_HEAD.size + _SOCKID.size + _SOCKID_TAIL.size \
                    + _MSG_TAIL.size:
                return None
            offset = _HEADER.size + _MSG_HEAD.size + _SOCKID.size + _SOCKID_TAIL.size
            return int(_MSG_TAIL.unpack_from(data, offset)[3])

