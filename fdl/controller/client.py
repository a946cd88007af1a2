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
- `UnverifiedController` (exit 2): a client holding the run's token got an
  answer that does not prove the same token (fdl.controller.auth): whatever
  answered is not this run's controller, or holds another token. Nothing in
  such an answer is acted on.

A client given a token signs every request with it (the token itself is never
sent) and checks every answer's proof before returning it.
"""

from __future__ import annotations

import errno
import json
from typing import Any

from fdl.config.parse import split_host_port
from fdl.controller import auth
from fdl.controller.protocol import PROTOCOL, Hello, hello_body
from fdl.errors import ExitCode, FdlError, RemoteError, UsageError


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


class UnverifiedController(FdlError):
    """An answer that does not prove the run's token: nothing in it is acted on (permanent)."""

    exit_code = ExitCode.PERMANENT

    def __init__(self, message: str, *, address: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.address = address


def normalize_address(text: str) -> tuple[str, str]:
    """host[:port] -> (display address, base URL); raises UsageError naming the problem."""
    try:
        host, port = split_host_port(text)
    except ValueError as exc:
        raise UsageError(f"controller address {text!r} is not host[:port]: {exc}.") from None
    shown = f"[{host}]" if ":" in host else host
    return f"{shown}:{port}", f"http://{shown}:{port}"


def _refused(exc: BaseException) -> bool:
    """Whether a requests/urllib3 connection error was, at its root, ECONNREFUSED."""
    seen: set[int] = set()
    stack: list[Any] = [exc]
    while stack:
        item = stack.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, ConnectionRefusedError) or getattr(item, "errno", None) == errno.ECONNREFUSED:
            return True
        stack.extend([item.__cause__, item.__context__, getattr(item, "reason", None), *item.args])
    return False


class ControllerClient:
    """One controller, reached at host[:port] (default port 1337)."""

    def __init__(self, address: str, *, timeout: float = 5.0, token: str | None = None):
        self.address, self.base = normalize_address(address)
        self.timeout = timeout
        self._keys = auth.derive(token) if token else None  # the token itself is not kept
        self._session: Any = None

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None, *, timeout: float | None = None,
                 accept: tuple[int, ...] = (200,)) -> dict[str, Any]:
        import requests  # lazy: a heavy import, and only commands that talk to a controller pay it

        if self._session is None:
            self._session = requests.Session()
            self._session.trust_env = False  # a controller is never reached through an HTTP proxy
        wait = self.timeout if timeout is None else timeout
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        nonce = None
        if self._keys is not None and method == "POST":
            signed = auth.sign_request(self._keys, method, path, data or b"")
            nonce = signed[auth.NONCE_HEADER]
            headers.update(signed)
        try:
            resp = self._session.request(method, self.base + path, data=data, headers=headers,
                                         timeout=(min(wait, 10.0), wait))
        except requests.exceptions.ConnectionError as exc:
            if _refused(exc):
                raise NoRunListening(f"no run listening at {self.address} (connection refused)",
                                     address=self.address) from None
            raise ControllerUnreachable(f"cannot reach the controller at {self.address}: "
                                        f"{_why(exc)}", address=self.address) from None
        except requests.exceptions.Timeout:
            raise ControllerUnreachable(f"the controller at {self.address} did not answer within {wait:g} s",
                                        address=self.address) from None
        except requests.exceptions.RequestException as exc:
            raise ControllerUnreachable(f"cannot talk to the controller at {self.address}: {_why(exc)}",
                                        address=self.address) from None
        if nonce is not None and self._keys is not None \
                and not auth.answer_ok(self._keys, nonce, resp.status_code, resp.content, resp.headers):
            if resp.status_code in (502, 503, 504):  # shed for load before the request was read: transient
                raise ControllerUnreachable(f"the controller at {self.address} is overloaded (HTTP "
                                            f"{resp.status_code}); retry shortly", address=self.address)
            raise UnverifiedController(
                f"the controller at {self.address} could not prove it holds the run's token: its answer (HTTP "
                f"{resp.status_code}) carries no valid proof, so nothing in it is acted on{_claimed(resp)}",
                address=self.address,
                hint="Either something else answers at that address, or the run's token differs from this box's "
                     "(check --token / FDL_JOIN_TOKEN / join.token against the run's controller.join.token).")
        try:
            payload = resp.json()
        except (ValueError, json.JSONDecodeError):
            raise ControllerUnreachable(
                f"{self.address} answered HTTP {resp.status_code} but not with the controller's JSON; is "
                f"something else listening on that port?", address=self.address) from None
        if not isinstance(payload, dict):
            raise ControllerUnreachable(f"{self.address} answered with JSON that is not an object",
                                        address=self.address)
        if resp.status_code in accept and payload.get("ok", True) is not False:
            return payload
        reason = str(payload.get("reason") or f"http_{resp.status_code}")
        message = str(payload.get("message") or f"HTTP {resp.status_code}")
        raise ControllerRefused(message, reason=reason, status=resp.status_code, payload=payload,
                                address=self.address)

    # ------------------------------------------------------------------ operator side

    def state(self) -> dict[str, Any]:
        """GET /state.json."""
        return self._request("GET", "/state.json")

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


def _claimed(resp: Any) -> str:
    """What an unverified refusal says about itself, shown as a claim (it proves nothing)."""
    try:
        payload = resp.json()
    except ValueError:
        return ""
    if not isinstance(payload, dict) or payload.get("ok") is not False:
        return ""
    text = "".join(c for c in f"{payload.get('reason')}: {payload.get('message')}" if c.isprintable())
    return f" (unverified, it says {text[:200]})"


def _why(exc: BaseException) -> str:
    text = str(exc)
    for marker in ("Name or service not known", "No route to host", "Network is unreachable",
                   "Connection reset", "timed out", "Temporary failure in name resolution"):
        if marker in text:
            return marker.lower()
    return text if len(text) <= 160 else text[:157] + "..."
