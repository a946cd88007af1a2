"""Parsers of the small network values fdl reads everywhere: host names and addresses, `host[:port]`,
login names; a mirror's base URL and a sha256 pin.

Each is strict (a pattern must match the whole text: `$` would also match
before a trailing newline, so every pattern here is used with fullmatch) and
raises or answers without side effects; the config schema, the join options,
the controller's wire protocol and the publish spec all use them.
"""

from __future__ import annotations

import ipaddress
import re

from ..hostside.redact import strip_userinfo

#: The controller's port when an address names none.
DEFAULT_PORT = 1337

_HOST_RE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9_])?")
_LOGIN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9._-]{0,31}\$?")
_PORT_RE = re.compile(r"[1-9][0-9]{0,4}")  # ASCII digits, no sign, no leading zero
# An IPv6 zone (fe80::1%eth0) names an interface: interface-name characters only.
_SCOPE_RE = re.compile(r"[A-Za-z0-9._-]{1,15}")
_URL_RE = re.compile(r"https?://[^\s/?#@]+(/[^\s?#]*)?")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def is_valid_host(text: object) -> bool:
    """A host name or an IP address (IPv6 possibly in brackets, its zone an interface name); nothing else."""
    if not isinstance(text, str):
        return False
    if _HOST_RE.fullmatch(text):
        return True
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    address, percent, scope = bare.partition("%")
    if percent and (":" not in address or not _SCOPE_RE.fullmatch(scope)):
        return False
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        return False
    return True


def is_login_name(text: str) -> bool:
    """A POSIX login name (letters, digits, '.', '-', '_'; a trailing '$' for machine accounts)."""
    return _LOGIN_RE.fullmatch(text) is not None


def unicast_problem(text: str) -> str | None:
    """Why an IP address cannot be a worker's address (None: a host name, or an address a worker can have)."""
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        ip = ipaddress.ip_address(bare.partition("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_unspecified:
        return "the unspecified address (it names no host: 'any address' when listening)"
    if ip.is_multicast:
        return "a multicast address"
    if isinstance(ip, ipaddress.IPv4Address) and (
            ip == ipaddress.IPv4Address("255.255.255.255") or ip in ipaddress.IPv4Network("240.0.0.0/4")):
        return "a broadcast or reserved address"
    return None


def split_host_port(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """Parse host[:port] (IPv6 as [addr]:port); raises ValueError with a reason."""
    text = text.strip()
    if text.startswith("["):
        host, _bracket, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError("expected [address]:port")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if not host or not is_valid_host(host):
        raise ValueError(f"{host!r} is not a host name or IP address")
    if port_text == "":
        return host, default_port
    if not _PORT_RE.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"port {port_text!r} is not a number from 1 to 65535")
    return host, int(port_text)


def mirror_problem(url: str) -> str | None:
    """Why a mirror URL is unusable, or None when it is an http:// or https:// base URL."""
    if not _URL_RE.fullmatch(url):
        return (f"{strip_userinfo(url)!r} is not an http:// or https:// base URL (no spaces, query, fragment or "
                f"user name; e.g. https://mirror.example/libtorch)")
    return None


def is_sha256(text: str) -> bool:
    """A SHA-256 digest as 64 lower-case hex digits."""
    return bool(_HEX64.fullmatch(text))
