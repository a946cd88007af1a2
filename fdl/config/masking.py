"""What `fdl config show` masks: the places people put secrets in a configuration.

- A value under a name that says secret (the last text key of its path, so list items count too):
  SECRET, PASSWORD, PASSWD, PASSPHRASE or CREDENTIAL anywhere in the name; and as a word part of it
  (parts split at '_', '-', '.' and camelCase; a part may end in the word, `APIKEY`, `HFTOKEN`):
  KEY/KEYS, TOKEN/TOKENS, PASS, AUTH/OAUTH (and AUTHORIZATION, AUTHTOKEN). A part that is an ordinary
  word merely containing one of them stays readable: KEYBOARD, MONKEY, TURKEY, TOKENIZER, AUTHOR,
  BYPASS, PASSTHROUGH; so do true, false and null, and a number under a name that says secret only
  through a plural (MAX_TOKENS: 4096, NUM_KEYS: 8: a count, where API_KEYS: [...] is masked).
- Text holding private key material (`-----BEGIN ... PRIVATE KEY-----`).
- The userinfo of a URL anywhere in a text value (`postgres://u:pw@db/x`, `https://TOKEN@host/...`),
  except a bare login name on a scheme that logs in with ssh (`rsync://op@host:/tree`, `ssh://`,
  `sftp://`, `sshfs://`, `git+ssh://`), which carries no secret and is how a worker names its door.
- The value of a command-line flag whose name says secret by the same rule, or that is one of the common
  secret flags whatever the rule says (`--bearer`, `--cookie`, `-p`, `--pw`, `--pwd`, `--session`, `--jwt`,
  `--otp`, `--sig`, `--signature`; `-u`/`--user` when the value is `user:password`): in an `args:` list the
  item after `--wandb-key` (unless it is itself a long flag), and `--password=X` or `-p X` in any text value
  (the `X`), including `run:` and `build:` lines.
- HTTP credentials in text: the credential of `Authorization: Bearer X` (any scheme word, or none), of
  `Proxy-Authorization:`, of a header whose name says secret (`X-Api-Key: X`, `Private-Token: X`), the
  whole of `Cookie:` / `Set-Cookie:`, and the word after a lone `Bearer`.
- Values shaped like secrets, whatever their name: a whole value or a word in a text value that is
  - a token with a well-known prefix (`ghp_`, `github_pat_`, `glpat-`, `hf_`, `sk-`, `xoxb-`, `AKIA`, ...),
  - 32 or more hex digits (128 bits and up) mixing digits and letters,
  - a JSON Web Token (`eyJ...`.`...`.`...`),
  - 22 or more characters of base64 (128 bits and up; `+ / _ -` and `=` padding) that mix at least two of
    upper case, lower case and digits and change between them as random text does: a word-by-word
    identifier (`TransformerEncoderLayer2x`, `bert-base-uncased-squad2`) or a path (`target/release/x`) is
    no secret.
  Digests stay readable: nothing under a key named like one (sha256, sha, digest, checksum, hash, commit,
  fingerprint, ref, rev, revision) is judged by shape, nor hex after `#` (a git ref) or `sha256:`.

A whole value is masked when its name says secret, it holds key material, it is the item after a
secret flag in an `args:` list, or it is itself shaped like a secret; otherwise only the parts found are
replaced with `<redacted>`. The URL rule alone is fdl.hostside.redact.strip_userinfo, which errors that echo
a URL use. Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..hostside.redact import REDACTED, strip_userinfo

KeyPath = tuple[Any, ...]

_ANYWHERE = ("secret", "password", "passwd", "passphrase", "credential")
_PART_ENDINGS = ("key", "keys", "token", "tokens", "pass")  # a word part equal to one, or ending in one
# Ordinary words that end in one of those (or start like auth) and say nothing about secrets.
_ORDINARY = frozenset({
    "monkey", "donkey", "turkey", "hockey", "jockey", "whiskey", "lackey", "flunkey", "malarkey",
    "monkeys", "donkeys", "turkeys", "jockeys", "whiskeys",
    "bypass", "compass", "surpass", "overpass", "underpass", "trespass", "encompass",
    "author", "authors", "authored", "authoring", "authorship",
})
_SPLIT_RE = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_KEY_MATERIAL = ("PRIVATE KEY-----", "PRIVATE KEY BLOCK-----")
# Flags that carry a secret whatever the name rule says (a password for sshpass/mysql, curl's cookie jar...).
_SECRET_FLAGS = frozenset({"bearer", "cookie", "cookies", "p", "pw", "pwd", "session", "sessionid", "jwt", "otp",
                           "sig", "signature"})
_USER_FLAGS = frozenset({"u", "user"})  # secret only as `user:password`
# Headers: the credential after the scheme word (Authorization), the whole value (Cookie), or one word.
_AUTH_HEADER_RE = re.compile(r"(?i)\b((?:proxy-)?authorization\s*:\s*)((?:[A-Za-z][A-Za-z0-9-]*[ \t]+)?)"
                             r"([^\s'\"]+)")
_COOKIE_HEADER_RE = re.compile(r"(?i)\b((?:set-)?cookie\s*:\s*)([^'\"\r\n]+)")
_HEADER_RE = re.compile(r"(?<![A-Za-z0-9_-])([A-Za-z][A-Za-z0-9_-]*)(\s*:[ \t]*)([^\s'\"]+)")
_BEARER_RE = re.compile(r"(?i)\b(bearer[ \t]+)([^\s'\"<]+)")
# Secret shapes.
_RUN_RE = re.compile(r"(?<![A-Za-z0-9+/_-])([A-Za-z0-9+/_-]{20,})(={0,2})(?![A-Za-z0-9+/_=-])")
_JWT_RE = re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*")
_PREFIXES = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "hf_", "sk-", "sk_live_", "sk_test_",
             "rk_live_", "xoxb-", "xoxp-", "xoxa-", "xoxr-", "xoxs-", "AKIA", "ASIA", "npm_", "pypi-", "dop_v1_")
_HEX_RE = re.compile(r"[0-9A-Fa-f]{32,}")
_WORD_RE = re.compile(r"[A-Z][a-z]+|[a-z]+|[A-Z]+")  # the letters of a word, as words run
_SEPARATORS_RE = re.compile(r"[-_]")
_PATH_PART_RE = re.compile(r"[a-z][a-z0-9_.-]{2,}")
_DIGEST_NAMES = frozenset({"sha", "sha1", "sha256", "sha512", "md5", "digest", "checksum", "hash", "commit",
                           "fingerprint", "ref", "rev", "revision"})
_DIGEST_BEFORE = ("#", "sha1:", "sha256:", "sha512:", "md5:")
# NAME=value in a shell line (`export HF_TOKEN=...`, `DB_PASS=x ./train`), for a NAME that says secret.
_ASSIGN_RE = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|'[^']*'|[^\s'\"]+)")
_FLAG_VALUE_RE = re.compile(r"(?<![^\s'\"])(--?[A-Za-z][A-Za-z0-9_.-]*)=(\"[^\"]*\"|'[^']*'|[^\s'\"]+)")
_FLAG_SPACE_RE = re.compile(r"(?<![^\s'\"])(--?[A-Za-z][A-Za-z0-9_.-]*)([ \t]+)(\"[^\"]*\"|'[^']*'|[^\s'\"-][^\s'\"]*)")


_NONE, _PLURAL, _SECRET = 0, 1, 2


def _part_kind(part: str) -> int:
    if part in _ORDINARY:
        return _NONE
    if part.startswith(("auth", "oauth")):
        return _SECRET
    if part.endswith(("keys", "tokens")):
        return _PLURAL
    return _SECRET if part.endswith(_PART_ENDINGS) else _NONE


def _name_kind(name: Any) -> int:
    """_SECRET for a name that says secret; _PLURAL when it says so only through KEYS or TOKENS (a list of
    keys, or a count: MAX_TOKENS); _NONE otherwise."""
    if not isinstance(name, str) or not name:
        return _NONE
    lowered = name.lower()
    if any(word in lowered for word in _ANYWHERE):
        return _SECRET
    return max((_part_kind(part.lower()) for part in _SPLIT_RE.split(name) if part), default=_NONE)


def secret_name(name: Any) -> bool:
    """True for a key name (an env variable, a config key, a flag without its dashes) that says secret."""
    return _name_kind(name) != _NONE


def _flag_says_secret(flag: str) -> bool:
    name = flag.lstrip("-")
    return secret_name(name) or name.lower() in _SECRET_FLAGS


def _flag_hides(flag: str, value: str) -> bool:
    """Whether `value`, given to `flag`, is masked: a secret flag's value, or `user:password` after -u/--user."""
    name = flag.lstrip("-").lower()
    if name in _USER_FLAGS:
        return ":" in value.strip("'\"")
    return _flag_says_secret(flag)


def _path_like(run: str) -> bool:
    """A path rather than base64: absolute, or starting with a lower-case word, as at least half its parts do
    (target/release/x)."""
    parts = [part for part in run.split("/") if part]
    words = sum(bool(_PATH_PART_RE.fullmatch(part)) for part in parts)
    return run.startswith("/") or (bool(parts) and bool(_PATH_PART_RE.fullmatch(parts[0])) and 2 * words >= len(parts))


def _random_looking(text: str, least: int) -> bool:
    """At least `least` characters mixing two of upper case, lower case and digits, whose letters come in the
    short runs of random text (an average under 3), not in words (`TransformerEncoderLayer2x`)."""
    if len(text) < least:
        return False
    upper, lower = any(c.isupper() for c in text), any(c.islower() for c in text)
    if upper + lower + any(c.isdigit() for c in text) < 2:
        return False
    words = _WORD_RE.findall(text)
    runs = 3 if upper and lower else 2  # lower case and digits alone: names like cu128_sm90_nccl2275 are common
    return bool(words) and sum(map(len, words)) < runs * len(words)


def secret_shaped(word: str) -> bool:
    """Whether one word looks like a secret whatever it is called (the shapes in the module docstring)."""
    word = word.strip()
    if _JWT_RE.fullmatch(word):
        return True
    match = _RUN_RE.fullmatch(word)
    if match is None:
        return False
    run, padding = match.group(1), match.group(2)
    if run.startswith(_PREFIXES):
        return True
    if _HEX_RE.fullmatch(run):
        return any(c.isdigit() for c in run) and any(c.isalpha() for c in run)
    if padding:  # standard base64 of a key of 16 bytes or more, padded: no name ends in '='
        classes = sum((any(c.isupper() for c in run), any(c.islower() for c in run), any(c.isdigit() for c in run)))
        if len(word) % 4 == 0 and len(word) >= 24 and classes >= 2:
            return True
    if "/" in run and _path_like(run):
        return False
    parts = [part for part in _SEPARATORS_RE.split(run) if part]
    return any(_random_looking(part, 16) for part in parts) or _random_looking("".join(parts), 20)


def mask_text(text: str, *, shapes: bool = True) -> str:
    """`text` with the userinfo of its URLs, its HTTP credentials, the values of its secret `--flag=X` /
    `--flag X`, and (with shapes) its secret-shaped words replaced."""
    def flag(match: re.Match[str]) -> str:
        if not _flag_hides(match.group(1), match.group(3) if match.re is _FLAG_SPACE_RE else match.group(2)):
            return match.group(0)
        return f"{match.group(1)}{match.group(2) if match.re is _FLAG_SPACE_RE else '='}{REDACTED}"

    def header(match: re.Match[str]) -> str:
        name = match.group(1)
        if not secret_name(name) or name.lower() in ("authorization", "proxy-authorization"):
            return match.group(0)
        return f"{name}{match.group(2)}{REDACTED}"

    def shape(match: re.Match[str]) -> str:
        before = out[:match.start()]
        if before.endswith(_DIGEST_BEFORE) or not secret_shaped(match.group(0)):
            return match.group(0)
        return REDACTED

    out = strip_userinfo(text)
    out = _AUTH_HEADER_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", out)
    out = _COOKIE_HEADER_RE.sub(lambda m: f"{m.group(1)}{REDACTED}", out)
    out = _HEADER_RE.sub(header, out)
    out = _BEARER_RE.sub(lambda m: f"{m.group(1)}{REDACTED}", out)
    out = _ASSIGN_RE.sub(lambda m: f"{m.group(1)}={REDACTED}" if secret_name(m.group(1)) else m.group(0), out)
    out = _FLAG_VALUE_RE.sub(flag, out)
    out = _FLAG_SPACE_RE.sub(flag, out)
    if shapes:
        out = _JWT_RE.sub(REDACTED, out)
        out = _RUN_RE.sub(shape, out)
    return out


@dataclass(frozen=True)
class Mask:
    """How one value is shown: wholly redacted, or with the secret parts replaced (`shown`)."""

    whole: bool
    shown: str | None = None


def _last_name(path: KeyPath) -> Any:
    for part in reversed(path):
        if isinstance(part, str):
            return part
    return None


def find_masks(data: Any) -> dict[KeyPath, Mask]:
    """Every scalar of a configuration that `config show` masks, by key path."""
    found: dict[KeyPath, Mask] = {}

    def walk(value: Any, path: KeyPath) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(sub, path + (key,))
            return
        if isinstance(value, list):
            args = path[-1:] == ("args",)
            secret_next = False
            flag = ""
            for index, sub in enumerate(value):
                scalar = not isinstance(sub, (dict, list)) and sub is not None
                if secret_next and scalar and isinstance(sub, str) and re.match(r"--[A-Za-z]", sub):
                    secret_next = False  # a flag follows a flag: the first took no value
                if secret_next and scalar and _flag_hides(flag, str(sub)):
                    found[path + (index,)] = Mask(whole=True)  # the value of `--wandb-key X`, `-u user:pw`
                    secret_next = False
                    continue
                secret_next = args and isinstance(sub, str) and sub.startswith("-") and "=" not in sub \
                    and (_flag_says_secret(sub) or sub.lstrip("-").lower() in _USER_FLAGS)
                flag = sub if secret_next else ""
                walk(sub, path + (index,))
            return
        if value is None or isinstance(value, bool):  # nothing to hide in null, true or false
            return
        kind = _name_kind(_last_name(path))
        shapes = not any(isinstance(part, str) and part.lower() in _DIGEST_NAMES for part in path)
        if kind == _SECRET or (kind == _PLURAL and not isinstance(value, (int, float))):
            found[path] = Mask(whole=True)  # a number under MAX_TOKENS or NUM_KEYS is a count
        elif isinstance(value, str):
            if any(mark in value for mark in _KEY_MATERIAL) or (shapes and secret_shaped(value)):
                found[path] = Mask(whole=True)
            else:
                shown = mask_text(value, shapes=shapes)
                if shown != value:
                    found[path] = Mask(whole=False, shown=shown)

    walk(data, ())
    return found
