"""The training port in every address family: what a bind address holds, and binding it all or nothing.

A box answers a name with its IPv6 addresses first when it has them, and an
IPv6-only listener on `[::]:PORT` and an IPv4 one on `0.0.0.0:PORT` coexist:
binding one family leaves the port in the other to whichever account binds
it first, and every worker that dials the box by name reaches that account.
So the controller holds its port in both families:

- `0.0.0.0`, `::` or empty: both wildcards, served;
- a loopback address (`127.0.0.1`, `::1`) or `localhost`: both loopbacks, served;
- another name: every address it resolves to, served, and the wildcard of a
  family it has no address in, bound but not listening (nothing is served
  there, and nobody else can listen there);
- another literal address: that address.

Binding is all or nothing: when another process holds the port in any of
them, nothing is kept and `FdlError` names the address and its family.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from typing import NamedTuple

from fdl.errors import FdlError

WILDCARDS = ("", "0.0.0.0", "::")
LOOPBACK_V4, LOOPBACK_V6 = "127.0.0.1", "::1"
_ABSENT = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT)  # no such family on this box


class Hold(NamedTuple):
    """One socket the controller binds: its family and address, and whether it listens (serves)."""

    family: int
    address: str
    serve: bool = True
    implied: bool = False  # not what the bind names: the other family (skipped where this box lacks it)

    @property
    def shown(self) -> str:
        return f"[{self.address}]" if self.family == socket.AF_INET6 else self.address

    @property
    def family_name(self) -> str:
        return "IPv6" if self.family == socket.AF_INET6 else "IPv4"


def _literal(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def holds(bind: str) -> list[Hold]:
    """What binding `bind` holds, in order (the first is what the bind names)."""
    bind = bind.strip("[]")
    if bind in WILDCARDS:
        first = socket.AF_INET6 if bind == "::" else socket.AF_INET
        both = [Hold(socket.AF_INET, "0.0.0.0", implied=first != socket.AF_INET),
                Hold(socket.AF_INET6, "::", implied=first != socket.AF_INET6)]
        return sorted(both, key=lambda h: h.implied)
    ip = _literal(bind)
    if ip is not None:
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        own = Hold(family, bind.split("%", 1)[0])
        if ip.is_loopback:
            other = Hold(socket.AF_INET, LOOPBACK_V4, implied=True) if family == socket.AF_INET6 else \
                Hold(socket.AF_INET6, LOOPBACK_V6, implied=True)
            return [own, other]
        return [own]
    try:
        infos = socket.getaddrinfo(bind, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise FdlError(f"the controller cannot listen on {bind!r}: the name does not resolve ({exc}).",
                       hint="Set cluster.controller.bind to an address of this box, or 0.0.0.0.") from None
    found: list[Hold] = []
    for family, _, _, _, sockaddr in infos:
        address = str(sockaddr[0])
        if family in (socket.AF_INET, socket.AF_INET6) and all(h.address != address for h in found):
            found.append(Hold(family, address))
    loopback = all((ip := _literal(h.address)) is not None and ip.is_loopback for h in found)
    for family, wild, loop in ((socket.AF_INET, "0.0.0.0", LOOPBACK_V4), (socket.AF_INET6, "::", LOOPBACK_V6)):
        if found and not any(h.family == family for h in found):
            found.append(Hold(family, loop, implied=True) if loopback else
                         Hold(family, wild, serve=False, implied=True))
    return found


def bind_all(bind: str, port: int, *, backlog: int = 4096, tries: int = 20) -> list[tuple[Hold, socket.socket]]:
    """Bind (and listen on, where it serves) every socket `bind` holds, on one port (port 0: any free port,
    the same in every family). Raises FdlError naming the address another process holds."""
    plan = holds(bind)
    for _ in range(tries if port == 0 else 1):
        bound: list[tuple[Hold, socket.socket]] = []
        chosen = port
        try:
            for hold in plan:
                sock = _bind_one(hold, chosen, backlog)
                if sock is None:
                    continue
                bound.append((hold, sock))
                chosen = sock.getsockname()[1]
            return bound
        except OSError as exc:
            for _, sock in bound:
                sock.close()
            if exc.errno == errno.EADDRINUSE and port == 0:
                continue  # the port picked in the first family is taken in another: pick again
            raise _refusal(exc, hold, chosen) from None
    raise FdlError(f"the controller found no port free in every address family {bind} holds.")


def _bind_one(hold: Hold, port: int, backlog: int) -> socket.socket | None:
    try:
        sock = socket.socket(hold.family, socket.SOCK_STREAM)
    except OSError as exc:
        if hold.implied and exc.errno in _ABSENT:
            return None  # this box has no such family: nobody can listen there either
        raise
    try:
        if hold.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        if hold.serve:
            # what asyncio sets too; a hold that only reserves does not, so no other socket can share it
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((hold.address, port))
        if hold.serve:
            sock.listen(backlog)
            sock.setblocking(False)
        return sock
    except OSError as exc:
        sock.close()
        if hold.implied and exc.errno in _ABSENT:
            return None
        raise


def _refusal(exc: OSError, hold: Hold, port: int) -> FdlError:
    where = f"{hold.shown}:{port} ({hold.family_name}{', implied by the bind address' if hold.implied else ''})"
    if exc.errno == errno.EADDRINUSE:
        return FdlError(
            f"the controller cannot hold port {port} on {where}: another process holds it. A listener there "
            f"would take every worker that dials this box by a name with an {hold.family_name} address.",
            hint=f"Find it with `ss -ltnp 'sport = :{port}'`, stop it, or set cluster.controller.port (--port).")
    return FdlError(f"the controller cannot listen on {where}: {exc.strerror or exc}.",
                    hint="Set cluster.controller.bind to an address of this box, or cluster.controller.port.")


def port_free(bind: str, port: int) -> bool:
    """Whether the controller could hold bind:port in every family right now."""
    try:
        bound = bind_all(bind, port, backlog=1)
    except FdlError:
        return False
    for _, sock in bound:
        sock.close()
    return True
