"""Talking to a controller: the one client `fdl status`, `fdl start` and the join agent share.

`requests` is imported on first use, so importing this module stays cheap.
Failures come back as fdl errors a command can print as they are:

- `NoRunListening`: the connection was refused, i.e. no controller holds that
  port (the endpoint lives only as long as its launcher): not a fault.
- `ControllerUnreachable`: timeouts, unknown hosts, resets, answers that are
  not the controller's JSON.
- `ControllerRefused`: the controller answered and said no; `.reason` is the
  stable code (bad_token, window_closed, quorum_not_met, ...), `.payload` the
  whole answer.
- `UnverifiedController` (a `ControllerUnreachable`, exit 1): a client holding
  the run's token got an answer that does not prove the same token
  (fdl.controller.auth): whatever answered is not this run's controller, or
  holds another token, or the answer was tampered with on the way. Nothing in
  such an answer is acted on, and nothing learned from the network is
  permanent: the next attempt may reach the real controller.

Every dial is TLS 1.3 (fdl.controller.tls), over TCP or over the unix socket
of an ssh forward. A client given a token first asks `GET /join/id` with a
fresh challenge: the answer must prove the token (bound to the challenge) and
name the TLS key of the connection it came on; that key is then pinned, and a
later connection presenting another key is dropped before anything is sent
(a relay that terminates TLS itself fails here). Only then does it sign
requests (the token itself is never sent) and check every answer's proof.

Each exchange has one deadline for the whole answer (a peer that drips bytes
is cut), and no redirect is followed: a controller never redirects. Whatever a
peer said (a refusal's reason and message) is made printable before it goes
into an error, so nothing unauthenticated reaches a terminal raw.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import json
import socket
import ssl
import threading
import time
from typing import Any, NamedTuple

from fdl.config.parse import split_host_port
from fdl.controller import auth, tls
from fdl.controller.protocol import PROTOCOL, Hello, hello_body
from fdl.controller.view import printable
from fdl.errors import FdlError, RemoteError, UsageError
from fdl.hostside.envvars import FDL_JOIN_TOKEN

MAX_ANSWER = 64 << 20  # bytes of an answer read at most (a 4096-host state.json is under 1 MiB)


class ControllerError(RemoteError):
    """The controller could not be asked."""

    def __init__(self, message: str, *, address: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.address = address


class NoRunListening(ControllerError):
    """Connection refused: no controller (so no run) at that address."""


class ControllerUnreachable(ControllerError):
    """The address did not answer as a controller (timeout, no route, not fdl's JSON)."""


class ControllerRefused(FdlError):
    """The controller answered with a refusal."""

    def __init__(self, message: str, *, reason: str, status: int, payload: dict[str, Any], address: str):
        super().__init__(message)
        self.reason = reason
        self.status = status
        self.payload = payload
        self.address = address


class UnverifiedController(ControllerUnreachable):
    """An answer that does not prove the run's token: nothing in it is acted on (transient: learned from the
    network). `status` and `claimed` (the refusal's reason, made printable) say what it claimed."""

    def __init__(self, message: str, *, address: str, hint: str | None = None, status: int = 0,
                 claimed: str | None = None):
        super().__init__(message, address=address, hint=hint)
        self.status = status
        self.claimed = claimed


def normalize_address(text: str) -> tuple[str, str]:
    """host[:port] -> (display address, base URL); raises UsageError naming the problem."""
    try:
        host, port = split_host_port(text)
    except ValueError as exc:
        raise UsageError(f"controller address {text!r} is not host[:port]: {exc}.") from None
    shown = f"[{host}]" if ":" in host else host
    return f"{shown}:{port}", f"https://{shown}:{port}"


def _caused_by(exc: BaseException, kind: type[BaseException] | None = None, errno_value: int | None = None) -> bool:
    """Whether a requests/urllib3 error was, at its root, an error of `kind` (or with that errno)."""
    seen: set[int] = set()
    stack: list[Any] = [exc]
    while stack:
        item = stack.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if (kind is not None and isinstance(item, kind)) or \
                (errno_value is not None and getattr(item, "errno", None) == errno_value):
            return True
        stack.extend([item.__cause__, item.__context__, getattr(item, "reason", None), *item.args])
    return False


def _refused(exc: BaseException) -> bool:
    """Whether a requests/urllib3 connection error was, at its root, ECONNREFUSED."""
    return _caused_by(exc, ConnectionRefusedError, errno.ECONNREFUSED)


class Answer(NamedTuple):
    """One HTTP answer, read whole (bounded)."""

    status: int
    headers: Any  # a case-insensitive mapping
    content: bytes

    def json(self) -> Any:
        """The body as JSON (ValueError when it is not)."""
        return json.loads(self.content)


class ControllerClient:
    """One controller, reached at host[:port] (default port 1337), or through a unix socket that leads to it
    (an ssh forward: `socket_path`; `address` is then the controller as seen from the far end). Every dial is
    TLS (fdl.controller.tls); with a token, the controller's key is pinned through the token before anything
    that matters is sent."""

    def __init__(self, address: str, *, timeout: float = 5.0, token: str | None = None,
                 socket_path: str | None = None):
        self.address, self.base = normalize_address(address)
        self.timeout = timeout
        self.socket_path = socket_path
        self._prk = auth.extract(token) if token else None  # the token itself is not kept
        self._keys: auth.Keys | None = None
        self.controller_id: str | None = None
        self.clock_skew: float | None = None  # the controller's clock minus this box's, as it claimed
        self.clock_proven = False  # whether that claim came in an answer that proved the run's token
        self.pin: bytes | None = None  # the controller's TLS key (SPKI SHA-256), once a proved answer named it
        self.presented: bytes | None = None  # the key the last connection made presented
        self._mismatch: bytes | None = None  # a connection presented another key than the pinned one
        self._session: Any = None
        self._current: Any = None  # the socket of the exchange in progress (what the deadline cuts)

    @property
    def proves(self) -> bool:
        """Whether this client holds a token (signs its requests, checks answers)."""
        return self._prk is not None

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def _forget(self) -> None:
        """Ask the controller's id (and key) again next time, on fresh connections: it may have restarted."""
        self.controller_id = self._keys = self.pin = None
        self.close()

    def key_presented(self, spki: bytes) -> None:
        """Called by every new connection once its TLS handshake is done, before anything is sent on it."""
        self.presented = spki
        if self.pin is not None and spki != self.pin:
            self._mismatch = spki
            raise ConnectionError("the controller's TLS key is not the pinned one")

    def _send(self, method: str, path: str, data: bytes | None, headers: dict[str, str], wait: float) -> Answer:
        """One HTTPS exchange, the whole answer within `wait` seconds (a deadline, not a per-read timeout: a peer
        that drips bytes is cut), no redirect followed; network failures as ControllerError."""
        import requests  # lazy: a heavy import, and only commands that talk to a controller pay it

        if self._session is None:
            self._session = requests.Session()
            self._session.trust_env = False  # a controller is never reached through an HTTP proxy
            self._session.mount("https://", tls_adapter(self))
        self._mismatch = None
        cut = threading.Event()
        timer = threading.Timer(wait, self._cut, args=(cut,))
        timer.daemon = True
        timer.start()
        try:
            resp = self._session.request(method, self.base + path, data=data, headers=headers, stream=True,
                                         allow_redirects=False, timeout=(min(wait, 10.0), wait))
            body = bytearray()
            for chunk in resp.iter_content(1 << 16):  # read to the end: the connection goes back to the pool
                body += chunk
                if len(body) > MAX_ANSWER:
                    resp.close()
                    raise ControllerUnreachable(f"{self.address} answered with more than {MAX_ANSWER >> 20} MiB; "
                                                f"is something else listening on that port?", address=self.address)
        except (requests.exceptions.RequestException, OSError) as exc:
            raise self._failure(exc, wait, cut.is_set()) from None
        finally:
            timer.cancel()
            self._current = None
        if cut.is_set():  # the deadline fired just as the answer completed: not trusted to be whole
            raise self._late(wait)
        if 300 <= resp.status_code < 400:
            self._forget()
            raise ControllerUnreachable(
                f"{self.address} answered with a redirect (HTTP {resp.status_code}); a controller never redirects "
                f"and fdl follows none: something else answers at that address", address=self.address)
        return Answer(resp.status_code, resp.headers, bytes(body))

    def _cut(self, cut: threading.Event) -> None:
        """The deadline: shut the exchange's socket down (its blocked read returns), from the timer's thread."""
        cut.set()
        sock = self._current
        if sock is not None:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the OS socket under TLS, not a TLS shutdown

    def _late(self, wait: float) -> ControllerError:
        self._forget()  # the connection was cut: a fresh one next time
        return ControllerUnreachable(f"the controller at {self.address} did not answer within {wait:g} s",
                                     address=self.address)

    def _failure(self, exc: BaseException, wait: float, late: bool) -> ControllerError:
        import requests

        if self._mismatch is not None:
            shown = tls.curl_pin(self._mismatch)
            self._forget()
            return UnverifiedController(
                f"the controller at {self.address} presented another TLS key ({shown}) than the one its token-proved "
                f"answer named, so nothing was sent on that connection", address=self.address,
                hint="Something between this box and the controller terminates TLS itself (a relay or proxy), or the "
                     "controller restarted; the next dial asks it again.")
        if late:
            return self._late(wait)
        if _caused_by(exc, ssl.SSLError):
            message = (f"something answers at {self.address} but not with TLS 1.3, as every fdl controller of "
                       f"protocol {PROTOCOL} does: another program, or a controller of an older fdl release")
            if self._prk is not None:  # nothing that proves the token: a trust failure, like an unproved answer
                return UnverifiedController(message, address=self.address, hint=_UNPROVED_HINT)
            return ControllerUnreachable(message, address=self.address)
        if isinstance(exc, requests.exceptions.ConnectionError) and _refused(exc):
            return NoRunListening(f"no run listening at {self.address} (connection refused)", address=self.address)
        if isinstance(exc, requests.exceptions.Timeout) or _caused_by(exc, TimeoutError):
            return ControllerUnreachable(f"the controller at {self.address} did not answer within {wait:g} s",
                                         address=self.address)
        if isinstance(exc, requests.exceptions.ConnectionError):
            return ControllerUnreachable(f"cannot reach the controller at {self.address}: {_why(exc)}",
                                         address=self.address)
        return ControllerUnreachable(f"cannot talk to the controller at {self.address}: {_why(exc)}",
                                     address=self.address)

    def identify(self) -> str:
        """GET /join/id: the controller instance's id (every proof names it), learned once per client.

        With a token, the answer must prove it, bound to a fresh challenge of this client's, and the TLS key it
        names must be the one this very connection presented: only then is the key pinned, and only then does
        anything that matters cross. Without a token the answer proves nothing (and needs to prove nothing: a
        tokenless client sends nothing that matters)."""
        if self.controller_id is not None:
            return self.controller_id
        self.close()  # a fresh connection: the key checked is the one this answer came through
        self.presented = None
        challenge = auth.new_challenge()
        asked = time.time()
        resp = self._send("GET", "/join/id", None, {auth.CHALLENGE_HEADER: challenge}, self.timeout)
        try:
            payload = resp.json()
        except ValueError:
            payload = None
        found = payload.get("controller_id") if isinstance(payload, dict) else None
        if not isinstance(payload, dict) or not isinstance(found, str) or not auth.CONTROLLER_ID_RE.fullmatch(found):
            raise ControllerUnreachable(
                f"{self.address} answered HTTP {resp.status} but did not name its controller instance "
                f"(GET /join/id), which every fdl controller of protocol {PROTOCOL} does: something else listens "
                f"there, or a controller of another fdl release.", address=self.address)
        now = payload.get("now")
        if isinstance(now, (int, float)) and not isinstance(now, bool):
            self.clock_skew = float(now) - (asked + time.time()) / 2
        self.clock_proven = False
        if self._prk is not None:
            keys = auth.expand(self._prk, found)
            if not auth.identity_ok(keys, challenge, resp.status, resp.content, resp.headers):
                self.close()
                raise UnverifiedController(
                    f"the controller at {self.address} could not prove it holds the run's token: its answer to GET "
                    f"/join/id carries no valid proof, so nothing in it is acted on and nothing was sent to it",
                    address=self.address, status=resp.status, hint=_UNPROVED_HINT)
            named = payload.get("tls_spki_sha256")
            if not (isinstance(named, str) and self.presented is not None
                    and hmac.compare_digest(named, self.presented.hex())):
                self.close()
                raise UnverifiedController(
                    f"the controller at {self.address} proved the run's token for another TLS key than the one this "
                    f"connection presented ({tls.curl_pin(self.presented) if self.presented else 'none'}): something "
                    f"between this box and the controller terminates TLS itself, so nothing is sent through it",
                    address=self.address, status=resp.status,
                    hint="Remove the relay or proxy in between (a TLS-terminating proxy reads everything), or dial the "
                         "controller directly or through its ssh door (--ssh).")
            self.pin, self._keys, self.clock_proven = self.presented, keys, True
        self.controller_id = found
        return found

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None, *, timeout: float | None = None,
                 accept: tuple[int, ...] = (200,), prove: bool | None = None) -> dict[str, Any]:
        wait = self.timeout if timeout is None else timeout
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        nonce = None
        if self._prk is not None and (method == "POST" if prove is None else prove):
            self.identify()
            assert self._keys is not None
            signed = auth.sign_request(self._keys, method, path, data or b"")
            nonce = signed[auth.NONCE_HEADER]
            headers.update(signed)
            headers["Accept-Encoding"] = "identity"  # the proof covers the bytes sent
        resp = self._send(method, path, data, headers, wait)
        if nonce is not None and self._keys is not None \
                and not auth.answer_ok(self._keys, nonce, resp.status, resp.content, resp.headers):
            if resp.status in (502, 503, 504):  # shed for load before the request was read
                raise ControllerUnreachable(f"the controller at {self.address} is overloaded (HTTP "
                                            f"{resp.status}); retry shortly", address=self.address)
            claimed = _claimed(resp)
            self._forget()
            raise UnverifiedController(
                f"the controller at {self.address} could not prove it holds the run's token: its answer (HTTP "
                f"{resp.status}) carries no valid proof, so nothing in it is acted on"
                + (f" (unverified, it says {claimed})" if claimed else ""),
                address=self.address, status=resp.status, claimed=_claimed_reason(resp), hint=_UNPROVED_HINT)
        try:
            payload = resp.json()
        except (ValueError, json.JSONDecodeError):
            raise ControllerUnreachable(
                f"{self.address} answered HTTP {resp.status} but not with the controller's JSON; is "
                f"something else listening on that port?", address=self.address) from None
        if not isinstance(payload, dict):
            raise ControllerUnreachable(f"{self.address} answered with JSON that is not an object",
                                        address=self.address)
        if resp.status in accept and payload.get("ok", True) is not False:
            return payload
        reason = _short(payload.get("reason") or f"http_{resp.status}", 64)
        message = _short(payload.get("message") or f"HTTP {resp.status}", 400)
        raise ControllerRefused(message, reason=reason, status=resp.status, payload=payload,
                                address=self.address)

    # ------------------------------------------------------------------ operator side

    def state(self, *, prove: bool = False) -> dict[str, Any]:
        """GET /state.json; prove: sign the request and accept only an answer that proves the token (a client
        holding one; raises UnverifiedController otherwise)."""
        return self._request("GET", "/state.json", prove=prove and self._prk is not None)

    def start(self) -> dict[str, Any]:
        """POST /start (signed when this client holds a token); raises ControllerRefused with the controller's
        reason when not armed."""
        return self._request("POST", "/start", {"protocol": PROTOCOL})

    # ------------------------------------------------------------------ agent side

    def hello(self, hello: Hello | dict[str, Any]) -> dict[str, Any]:
        """POST /join; the answer carries the ticket. Raises ControllerRefused with the reason."""
        body = hello_body(hello) if isinstance(hello, Hello) else dict(hello)
        return self._request("POST", "/join", body)

    def wait_world(self, ticket: str, wait_s: float | None = None) -> dict[str, Any] | None:
        """Long-poll for the world: the member's assignment once formed, None when the poll ran out first."""
        body: dict[str, Any] = {"protocol": PROTOCOL, "ticket": ticket}
        if wait_s is not None:
            body["wait_s"] = wait_s
        hold = (wait_s if wait_s is not None else 60.0) + self.timeout
        answer = self._request("POST", "/join/world", body, timeout=hold)
        return answer if answer.get("formed") else None

    def heartbeat(self, ticket: str, *, running: bool = False) -> dict[str, Any]:
        return self._request("POST", "/join/heartbeat", {"protocol": PROTOCOL, "ticket": ticket,
                                                         "running": running})

    def report_exit(self, ticket: str, code: int, detail: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"protocol": PROTOCOL, "ticket": ticket, "code": int(code)}
        if detail:
            body["detail"] = detail[:1024]
        return self._request("POST", "/join/exit", body)


_UNPROVED_HINT = ("Either something else answers at that address, or the run's token differs from this box's (check "
                  f"{FDL_JOIN_TOKEN} / --token-file / join.token against the run's controller.join.token), or the "
                  "answer was changed on the way.")


def _short(value: object, limit: int) -> str:
    """A peer's words, printable and bounded: nothing it sent reaches a terminal raw."""
    text = printable(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _payload(resp: Answer) -> dict[str, Any] | None:
    try:
        payload = resp.json()
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def _claimed(resp: Answer) -> str:
    """What an unverified refusal says about itself, shown as a claim (it proves nothing)."""
    payload = _payload(resp)
    if payload is None or payload.get("ok") is not False:
        return ""
    return _short(f"{payload.get('reason')}: {payload.get('message')}", 200)


def _claimed_reason(resp: Answer) -> str | None:
    payload = _payload(resp)
    return _short(payload.get("reason"), 64) if payload is not None and payload.get("ok") is False else None


def tls_adapter(client: ControllerClient) -> Any:
    """A requests transport adapter whose every connection is TLS to the controller (over TCP, or over the unix
    socket of an ssh forward), and reports the key its peer presented to the client before anything is sent
    (ControllerClient.key_presented, which refuses a key other than the pinned one). Built on urllib3's
    public connection classes; the TLS context is fdl.controller.tls's (no CA: the key is pinned instead)."""
    from requests.adapters import HTTPAdapter
    from urllib3.connection import HTTPConnection
    from urllib3.connectionpool import HTTPConnectionPool
    from urllib3.exceptions import NewConnectionError

    context = tls.client_context()
    path = client.socket_path

    class Connection(HTTPConnection):
        def connect(self) -> None:
            timeout = self.timeout if isinstance(self.timeout, (int, float)) else None
            try:
                if path is not None:
                    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    raw.settimeout(timeout)
                    try:
                        raw.connect(path)
                    except OSError:
                        raw.close()
                        raise
                else:
                    raw = socket.create_connection((self.host, self.port), timeout)
                    # no Nagle: the request would wait for the ACK of the handshake's last flight (delayed ACK)
                    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as exc:
                raise NewConnectionError(self, f"cannot connect to {path or self.host}: {exc}") from exc
            client._current = raw  # the deadline cuts a handshake that drags on, too
            try:
                sock = context.wrap_socket(raw)  # the handshake, under the connect timeout
                der = sock.getpeercert(binary_form=True)
                spki = tls.spki_of(der) if der else None
            except (OSError, ValueError) as exc:
                raw.close()
                if isinstance(exc, TimeoutError):
                    raise  # no answer in time: a timeout, not a failed handshake
                raise ConnectionError(f"no TLS 1.3 with the controller: {exc}") from exc
            if spki is None:
                sock.close()
                raise ConnectionError("the controller presented no certificate")
            try:
                client.key_presented(spki)
            except ConnectionError:
                sock.close()
                raise
            self.sock = sock
            client._current = sock

        def request(self, *args: Any, **kwargs: Any) -> None:
            client._current = self.sock  # what the deadline cuts (a kept-alive connection too)
            super().request(*args, **kwargs)

    class Pool(HTTPConnectionPool):
        ConnectionCls = Connection

    class Adapter(HTTPAdapter):
        def __init__(self) -> None:
            super().__init__()
            host, port = split_host_port(client.address)
            self.pool = Pool(host.strip("[]"), port)

        def get_connection_with_tls_context(self, request: Any, verify: Any, proxies: Any = None,
                                            cert: Any = None) -> Any:
            return self.pool

        def cert_verify(self, conn: Any, url: Any, verify: Any, cert: Any) -> None:
            """No certificate authority: the key is pinned through the token instead (see Connection)."""

        def close(self) -> None:
            self.pool.close()
            super().close()

    return Adapter()


def _why(exc: BaseException) -> str:
    """A network error in a few words; its text may quote what the peer sent, so it is made printable."""
    text = str(exc)
    for marker in ("Name or service not known", "No route to host", "Network is unreachable",
                   "Connection reset", "timed out", "Temporary failure in name resolution"):
        if marker in text:
            return marker.lower()
    return _short(text, 160)
