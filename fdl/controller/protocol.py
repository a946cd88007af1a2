"""The join protocol's messages: parsing and validation of what peers send.

Every request body is a JSON object; anything else, any field of the wrong
type or out of bounds, raises `BadRequest` (the HTTP layer answers 400 with
its message). Unknown fields are ignored so newer agents can talk to older
controllers. The wire format is documented in docs/controller.md.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NamedTuple

from fdl.config.parse import is_valid_host
from fdl.hostside.checks.devices import Devices, parse_devices
from fdl.hostside.envvars import (
    FDL_BACKEND,
    FDL_CONTROLLER,
    FDL_DATA_PATH,
    FDL_DEVICE,
    FDL_GPU_RAM_SHARE,
    FDL_HOST,
    FDL_NODE_RANK,
    FDL_NUM_NODES,
    FDL_RUN_ID,
)

PROTOCOL = 4  # 2: the token is proved by signing, never sent; 3: proofs name the controller instance (auth.py);
#              4: every dial is TLS, and the signed GET /join/id names the controller's TLS key (tls.py)
MAX_BODY = 16 * 1024  # bytes; a hello is a few hundred
MAX_HOST = 253
MAX_ID = 128  # run id, signature
MAX_PATH = 4096
MAX_DETAIL = 1024
MAX_GPU_NAMES = 64
MAX_WAIT_S = 60.0
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+/=-]*$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


class BadRequest(ValueError):
    """A request body that does not follow the protocol (HTTP 400)."""


class Hello(NamedTuple):
    """A worker asking to join: who it is, what it offers, what it believes the run is."""

    host: str
    devices: Devices
    run_id: str | None = None
    signature: str | None = None
    address: str | None = None
    data_path: str | None = None
    gpu_ram_share: float | None = None
    gpu_names: tuple[str, ...] = ()
    agent: str | None = None


class Ticketed(NamedTuple):
    """A request from an admitted member: world poll, heartbeat or exit report."""

    ticket: str
    wait_s: float | None = None  # world poll
    running: bool = False  # heartbeat: this host's ranks are up
    code: int | None = None  # exit report
    detail: str | None = None  # exit report


def decode(body: bytes) -> dict[str, Any]:
    """The JSON object in body (an empty body is an empty object)."""
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except UnicodeDecodeError:
        raise BadRequest("the request body is not UTF-8 text; send a JSON object.") from None
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"the request body is not valid JSON ({_short(exc)}); send a JSON object.") from None
    if not isinstance(value, dict):
        raise BadRequest(f"the request body must be a JSON object, not {type(value).__name__}.")
    return value


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def _string(obj: dict[str, Any], key: str, limit: int, *, pattern: re.Pattern[str] | None = None,
            what: str = "a string") -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"field {key!r} must be {what}, not {type(value).__name__}.")
    if not value or len(value) > limit:
        raise BadRequest(f"field {key!r} must be 1 to {limit} characters long.")
    if pattern is not None and not pattern.match(value):
        raise BadRequest(f"field {key!r} must be {what}.")
    if _CONTROL_RE.search(value):
        raise BadRequest(f"field {key!r} contains control characters.")
    if not value.isprintable():  # lone surrogates, other unprintable code points
        raise BadRequest(f"field {key!r} contains unprintable characters.")
    return value


def _required(obj: dict[str, Any], key: str, limit: int, *, what: str) -> str:
    value = _string(obj, key, limit, what=what)
    if value is None:
        raise BadRequest(f"field {key!r} is required ({what}).")
    return value


def _check_protocol(obj: dict[str, Any]) -> None:
    version = obj.get("protocol", PROTOCOL)
    if isinstance(version, bool) or not isinstance(version, int):
        raise BadRequest("field 'protocol' must be a whole number.")
    if version != PROTOCOL:
        raise BadRequest(f"protocol {version} is not spoken here (this controller speaks protocol {PROTOCOL}); "
                         f"use an fdl of the same release on both ends.")


def _no_token(obj: dict[str, Any]) -> None:
    if "token" in obj:
        raise BadRequest("a request never carries the token itself: it is proved by signing the request (the "
                         "X-Fdl-Proof header); use an fdl of the same release on both ends.")


def parse_hello(obj: dict[str, Any]) -> Hello:
    """Validate a hello (POST /join)."""
    _check_protocol(obj)
    _no_token(obj)
    host = _required(obj, "host", MAX_HOST, what="a host name (letters, digits, '.', '-', '_')")
    if not is_valid_host(host):
        raise BadRequest("field 'host' must be a host name or address (letters, digits, '.', '-', '_').")
    raw_devices = obj.get("devices")
    if raw_devices is None:
        raise BadRequest("field 'devices' is required: GPU ids like \"0,1\" or [0, 1], or \"cpu:N\".")
    if isinstance(raw_devices, str) and raw_devices.strip() == "all":
        raise BadRequest("field 'devices' must name the devices offered (\"0,1\" or \"cpu:N\"), not 'all'.")
    if (isinstance(raw_devices, str) and len(raw_devices) > 4096) or (isinstance(raw_devices, list) \
            and len(raw_devices) > 1024):
        raise BadRequest("field 'devices' is too long.")
    if not isinstance(raw_devices, (str, list, int)) or isinstance(raw_devices, bool):
        raise BadRequest("field 'devices' must be GPU ids like \"0,1\" or [0, 1], or \"cpu:N\".")
    try:
        devices = parse_devices(raw_devices)
    except ValueError as exc:
        raise BadRequest(f"field 'devices': {exc}.") from None
    address = _string(obj, "address", MAX_HOST, what="a host name or address")
    if address is not None and not is_valid_host(address):
        raise BadRequest("field 'address' must be a host name or IP address.")
    data_path = _string(obj, "data_path", MAX_PATH, what="an absolute path")
    if data_path is not None and not data_path.startswith("/"):
        raise BadRequest("field 'data_path' must be an absolute path.")
    share = obj.get("gpu_ram_share")
    if share is not None:
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not math.isfinite(share) \
                or not 0 < share <= 1:
            raise BadRequest("field 'gpu_ram_share' must be a fraction above 0 and at most 1.")
        share = float(share)
    names = obj.get("gpu_names") or []
    if not isinstance(names, list) or len(names) > MAX_GPU_NAMES \
            or not all(isinstance(n, str) and 0 < len(n) <= 128 for n in names):
        raise BadRequest(f"field 'gpu_names' must be a list of at most {MAX_GPU_NAMES} short strings.")
    return Hello(
        host=host,
        devices=devices,
        run_id=_string(obj, "run_id", MAX_ID, pattern=_ID_RE, what="a run id (letters, digits, '.', '-', '_')"),
        signature=_string(obj, "signature", MAX_ID, pattern=_ID_RE, what="a model signature (hex)"),
        address=address,
        data_path=data_path,
        gpu_ram_share=share,
        gpu_names=tuple(n for n in names if n.isprintable()),
        agent=_string(obj, "agent", 100),
    )


def parse_ticketed(obj: dict[str, Any], *, kind: str) -> Ticketed:
    """Validate a world poll (kind 'world'), heartbeat ('heartbeat') or exit report ('exit')."""
    _check_protocol(obj)
    ticket = _required(obj, "ticket", 200, what="the ticket the hello returned")
    if kind == "world":
        wait = obj.get("wait_s")
        if wait is not None:
            if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not math.isfinite(wait) \
                    or not 0 <= wait <= MAX_WAIT_S:
                raise BadRequest(f"field 'wait_s' must be a number of seconds from 0 to {MAX_WAIT_S:g}.")
            wait = float(wait)
        return Ticketed(ticket=ticket, wait_s=wait)
    if kind == "heartbeat":
        running = obj.get("running", False)
        if not isinstance(running, bool):
            raise BadRequest("field 'running' must be true or false.")
        return Ticketed(ticket=ticket, running=running)
    code = obj.get("code")
    if isinstance(code, bool) or not isinstance(code, int) or not -255 <= code <= 255:
        raise BadRequest("field 'code' is required: the exit code, a whole number from -255 to 255.")
    return Ticketed(ticket=ticket, code=code, detail=_string(obj, "detail", MAX_DETAIL))


def parse_start(obj: dict[str, Any]) -> None:
    """Validate a start request (POST /start): its proof, if any, is in its headers."""
    _check_protocol(obj)
    _no_token(obj)


def hello_body(hello: Hello) -> dict[str, Any]:
    """The JSON object a client sends for hello (the inverse of parse_hello)."""
    body: dict[str, Any] = {"protocol": PROTOCOL, "host": hello.host, "devices": str(hello.devices)}
    for key in ("run_id", "signature", "address", "data_path", "gpu_ram_share", "agent"):
        value = getattr(hello, key)
        if value is not None:
            body[key] = value
    if hello.gpu_names:
        body["gpu_names"] = list(hello.gpu_names)
    return body


#: The only variables a rank's environment may take from the controller's answer: what
#: torch.distributed's env:// rendezvous and torchrun's environment contract name, and fdl's own
#: (docs/controller.md, "The world assignment"). The agent refuses an answer that sets anything else
#: (LD_PRELOAD, PATH, PYTHONPATH, ...): the controller decides ranks, never what code they load.
RANK_ENV_NAMES = frozenset({
    # torch.distributed (env://) and torchrun's contract
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
    # fdl's own
    FDL_RUN_ID, FDL_CONTROLLER, FDL_DATA_PATH, FDL_HOST, FDL_NODE_RANK, FDL_NUM_NODES, FDL_BACKEND, FDL_DEVICE,
    FDL_GPU_RAM_SHARE,
})
MAX_ENV_VALUE = 4096


def refused_rank_env(env: object) -> list[str]:
    """The names in a rank environment from the controller that a rank may not take (empty: all allowed).
    Anything not a mapping of allowed names to short printable strings is refused."""
    if not isinstance(env, dict):
        return ["(not a mapping)"]
    bad = []
    for name, value in env.items():
        if name not in RANK_ENV_NAMES or not isinstance(value, str) or len(value) > MAX_ENV_VALUE \
                or "\x00" in value:
            bad.append(str(name)[:64])
    return sorted(bad)
