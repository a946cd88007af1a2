"""Source specs: where a training tree comes from.

One parser for both sides of a published run: `fdl publish` resolves a spec
into its served tree, and `fdl join --source` (the worker) pulls one. The
spellings:

    file:///abs/path                        a directory on this box
    rsync://[user@]host[:port]:/abs/path    a tree pulled over ssh with rsync
    git+https://host/owner/repo#<ref>       a pinned checkout (tag, branch or commit)
    git+ssh://[user@]host/owner/repo#<ref>
    git+http://host/owner/repo#<ref>
    git+file:///abs/repo#<ref>              a repository on this box (a mirror;
                                            also what the tests fetch from)

The scheme names the tool that moves the bytes: `rsync://` means rsync over
ssh, never the port-873 rsync daemon. A git source must name its ref: without
one the remote's default branch would decide what gets built, which is no pin.

Credentials never leave the controller through a spec: a git URL's userinfo
(`git+https://oauth2:TOKEN@host/o/r#main`) is taken out of it when it is
parsed. `GitSource.spec` and `.url` carry the URL without it (the spec as git
itself anonymizes a URL: no userinfo at all), and `.credentials` holds the
decoded user and password, which fdl.publish.fetch hands to git through a
credential helper of that one fetch, never on a command line. Every error
shows the spec without its userinfo.

A spec that does not parse raises `SourceSpecError`. Its exit code is 1 (what
`fdl publish` documents); for a worker, a spec that does not parse is
permanent (fdl.agent.permanent says so, before its first dial).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import unquote

from fdl.config.parse import is_valid_host
from fdl.errors import FdlError

FORMS = ("file:///abs/path, rsync://[user@]host[:port]:/abs/path, or "
         "git+https://host/owner/repo#<tag|branch|sha>")
_USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9._-]{0,31}")
# What a git ref may look like here: the characters git allows in ref names that
# are also safe on a command line. Never a leading '-', which git would read as
# an option.
_REF_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/+-]{0,254}")
_GIT_TRANSPORTS = ("https", "http", "ssh", "file")
_MAX_SPEC = 4096


class SourceSpecError(FdlError):
    """A source spec does not parse."""


@dataclass(frozen=True)
class FileSource:
    """A directory on this box."""

    path: str  # absolute
    spec: str

    kind = "file"


@dataclass(frozen=True)
class RsyncSource:
    """A directory on another box, pulled with rsync over ssh."""

    host: str
    path: str  # absolute on the remote side (or rooted at an rrsync directory)
    user: str | None
    port: int | None
    spec: str

    kind = "rsync"

    @property
    def remote(self) -> str:
        """rsync's spelling of the remote directory: [user@]host:/path."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user + '@' if self.user else ''}{host}:{self.path}"

    def at(self, path: str) -> str:
        """The spec of another directory on the same host, same login and port."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = f":{self.port}" if self.port is not None else ""
        return f"rsync://{self.user + '@' if self.user else ''}{host}{port}:{path}"


@dataclass(frozen=True)
class GitCredentials:
    """The user and password a git URL carried, decoded; never printed (no repr), never written anywhere."""

    username: str = field(repr=False)
    password: str | None = field(repr=False, default=None)


@dataclass(frozen=True)
class GitSource:
    """A repository at a pinned ref, fetched with git."""

    url: str  # what git is given: https://..., ssh://..., file:///... (no password, ever)
    ref: str
    spec: str  # the spec as written, less the URL's userinfo: what reports, logs and the manifest carry
    credentials: GitCredentials | None = field(default=None, repr=False, compare=False)

    kind = "git"


SourceSpec = FileSource | RsyncSource | GitSource


def split_userinfo(text: str) -> tuple[str, str | None]:
    """(the URL without the userinfo of its authority, that userinfo or None): git's anonymization.

    Everything from after `scheme://` up to the last '@' before the authority ends (at '/', '?' or '#') is
    userinfo; git keeps none of it when it prints a URL, so neither does fdl. Text that is no URL is returned
    as it is.
    """
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text, None
    ends = [i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i != -1]
    at = rest.rfind("@", 0, min(ends) if ends else len(rest))
    if at == -1:
        return text, None
    return f"{scheme}{sep}{rest[at + 1:]}", rest[:at]


def anonymize_url(text: str) -> str:
    """A URL (or spec) as it may be shown, logged or recorded: without userinfo."""
    return split_userinfo(text)[0]


def _fail(spec: str, why: str) -> SourceSpecError:
    spec = anonymize_url(spec)
    shown = spec if len(spec) <= 200 else spec[:197] + "..."
    return SourceSpecError(f"source spec '{shown}' does not parse: {why}.", hint=f"The forms are {FORMS}.")


def parse_source_spec(spec: str) -> SourceSpec:
    """Parse a source spec; raises SourceSpecError naming what was wrong."""
    if not isinstance(spec, str):
        raise _fail(repr(spec), "expected text")
    text = spec.strip()
    if not text:
        raise _fail(spec, "it is empty")
    if len(text) > _MAX_SPEC:
        raise _fail(text, f"it is longer than {_MAX_SPEC} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise _fail(text, "it contains control characters")
    scheme, sep, rest = text.partition("://")
    if not sep:
        if text.startswith("/"):
            raise _fail(text, f"it names no transport; a directory on this box is file://{text}")
        raise _fail(text, "it names no transport (scheme://...)")
    scheme = scheme.lower()
    if scheme == "file":
        return _parse_file(text, rest)
    if scheme == "rsync":
        return _parse_rsync(text, rest)
    if scheme.startswith("git+"):
        return _parse_git(text, scheme[4:], rest)
    if scheme in _GIT_TRANSPORTS or scheme == "git":
        raise _fail(text, f"a git repository is spelled git+{scheme if scheme != 'git' else 'https'}://...#<ref>")
    raise _fail(text, f"unknown scheme '{scheme}://'")


def _clean_abs_path(text: str, path: str, what: str) -> str:
    if not path.startswith("/"):
        raise _fail(text, f"{what} must be an absolute path (starting with '/')")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _fail(text, f"{what} must not contain '..'")
    return "/" + "/".join(parts)


def _parse_file(text: str, rest: str) -> FileSource:
    if rest.startswith("localhost/"):
        rest = rest[len("localhost"):]
    if "#" in rest or "?" in rest:
        raise _fail(text, "a file:// path takes no '#' or '?' part")
    if not rest.startswith("/"):
        raise _fail(text, "a file:// path must be absolute: three slashes, as in file:///srv/train")
    return FileSource(path=_clean_abs_path(text, rest, "the path"), spec=text)


def _parse_rsync(text: str, rest: str) -> RsyncSource:
    user = None
    at = rest.find("@")
    if at != -1 and all(i == -1 or at < i for i in (rest.find("["), rest.find("/"))):
        user, rest = rest[:at], rest[at + 1:]
        if ":" in user:
            raise _fail(text, "an rsync:// spec takes a login name, never a password (ssh logs in with a key: "
                              "--identity)")
        if not _USER_RE.fullmatch(user):
            raise _fail(text, f"'{user}' is not a login name")
    if rest.startswith("["):  # [v6-address][:port]:/path
        host, close, after = rest[1:].partition("]")
        if not close:
            raise _fail(text, "an IPv6 address opened with '[' is never closed")
        if not after.startswith(":"):
            raise _fail(text, "the host must be followed by ':' and the remote path")
        after = after[1:]
    else:
        host, colon, after = rest.partition(":")
        if not colon:
            raise _fail(text, "expected [user@]host[:port]:/abs/path (the ':' before the path is missing)")
    if not host:
        raise _fail(text, "it names no host")
    if not is_valid_host(host):
        raise _fail(text, f"'{host}' is not a host name or IP address")
    port = None
    head, colon, tail = after.partition(":")
    if colon and head and not head.startswith("/"):
        if not re.fullmatch(r"[0-9]{1,5}", head) or not 1 <= int(head) <= 65535:
            raise _fail(text, f"port '{head}' is not a number from 1 to 65535")
        port = int(head)
        after = tail
    elif not after.startswith("/"):
        port_like = re.fullmatch(r"([0-9]+)(/.*)?", after, re.DOTALL)
        if port_like:
            raise _fail(text, f"after port {port_like.group(1)} comes ':' and then the absolute remote path "
                              f"(rsync://{host}:{port_like.group(1)}:{port_like.group(2) or '/path'})")
        raise _fail(text, "the remote path must be absolute (host:/path)")
    path = _clean_abs_path(text, after, "the remote path")
    return RsyncSource(host=host, path=path, user=user, port=port, spec=text)


def _parse_git(text: str, transport: str, rest: str) -> GitSource:
    if transport not in _GIT_TRANSPORTS:
        raise _fail(text, f"git+{transport}:// is not a git transport fdl fetches "
                          f"(git+https, git+http, git+ssh, git+file)")
    location, hash_, ref = rest.partition("#")
    spec, userinfo = split_userinfo(text)
    credentials = None
    if userinfo is not None:
        if transport == "file":
            raise _fail(text, "a git+file:// path takes no user or password")
        user, colon, password = userinfo.partition(":")
        decoded = (unquote(user), unquote(password) if colon else None)
        if any(ord(ch) < 32 or ord(ch) == 127 for part in decoded if part for ch in part):
            raise _fail(text, "the user or password in the URL holds control characters once decoded")
        if transport == "ssh":
            if colon:
                raise _fail(text, "a git+ssh:// URL takes a login name, never a password (ssh logs in with a "
                                  "key: --identity)")
        else:
            credentials = GitCredentials(decoded[0], decoded[1])
            location = split_userinfo(f"{transport}://{location}")[0].partition("://")[2]
    if not hash_:
        raise _fail(text, "it names no ref; add #<tag|branch|sha> (the remote's default branch moves, "
                          "so it is no pin)")
    if not ref:
        raise _fail(text, "it ends at '#' with no ref")
    if not _REF_RE.fullmatch(ref) or ".." in ref or ref.endswith((".lock", "/", ".")) or "//" in ref:
        raise _fail(text, f"'{ref}' is not a git tag, branch or commit")
    if not location:
        raise _fail(text, "it names no repository")
    if any(ch.isspace() for ch in location):
        raise _fail(text, "the repository location contains white space")
    if transport == "file":
        if not location.startswith("/"):
            raise _fail(text, "a git+file:// repository path must be absolute: git+file:///srv/repo#ref")
        location = _clean_abs_path(text, location, "the repository path")
        return GitSource(url=f"file://{location}", ref=ref, spec=text)
    hostpart = location.split("/", 1)[0]
    host = hostpart.rsplit("@", 1)[-1]
    host = host.split("]", 1)[0] + "]" if host.startswith("[") else host.split(":", 1)[0]
    if not host or not is_valid_host(host):
        raise _fail(text, f"'{host}' is not a host name")
    if "/" not in location or not location.split("/", 1)[1]:
        raise _fail(text, "it names a host but no repository path")
    return GitSource(url=f"{transport}://{location}", ref=ref, spec=spec, credentials=credentials)
