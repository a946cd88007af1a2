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
- The value of a command-line flag whose name says secret by the same rule: in an `args:` list the
  item after `--wandb-key` (unless it is itself a long flag), and `--password=X` in any text value
  (the `X`), including `run:` and `build:` lines.

A whole value is masked when its name says secret, it holds key material, or it is the item after a
secret flag in an `args:` list; otherwise only the part found is replaced with `<redacted>`.
Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

KeyPath = tuple[Any, ...]
REDACTED = "<redacted>"

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
# scheme://userinfo@host: the userinfo is everything up to the last '@' before the authority ends.
_URL_RE = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://)([^\s/?#]*)@")
_LOGIN_SCHEMES = frozenset({"ssh", "rsync", "sftp", "sshfs", "git+ssh", "ssh+git", "scp"})
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
    return secret_name(flag.lstrip("-"))


def mask_text(text: str) -> str:
    """`text` with the userinfo of its URLs and the values of its secret-named `--flag=X` / `--flag X` replaced."""
    def url(match: re.Match[str]) -> str:
        scheme, userinfo = match.group(1), match.group(2)
        if ":" not in userinfo and scheme[:-3].lower() in _LOGIN_SCHEMES:
            return match.group(0)
        return f"{scheme}{REDACTED}@"

    def flag(match: re.Match[str]) -> str:
        if not _flag_says_secret(match.group(1)):
            return match.group(0)
        return f"{match.group(1)}{match.group(2) if match.re is _FLAG_SPACE_RE else '='}{REDACTED}"

    out = _URL_RE.sub(url, text)
    out = _FLAG_VALUE_RE.sub(flag, out)
    return _FLAG_SPACE_RE.sub(flag, out)


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
            for index, sub in enumerate(value):
                scalar = not isinstance(sub, (dict, list)) and sub is not None
                if secret_next and scalar and not (isinstance(sub, str) and re.match(r"--[A-Za-z]", sub)):
                    found[path + (index,)] = Mask(whole=True)  # the value of `--wandb-key X`
                    secret_next = False
                    continue
                secret_next = args and isinstance(sub, str) and sub.startswith("-") and "=" not in sub \
                    and _flag_says_secret(sub)
                walk(sub, path + (index,))
            return
        if value is None or isinstance(value, bool):  # nothing to hide in null, true or false
            return
        kind = _name_kind(_last_name(path))
        if kind == _SECRET or (kind == _PLURAL and not isinstance(value, (int, float))):
            found[path] = Mask(whole=True)  # a number under MAX_TOKENS or NUM_KEYS is a count
        elif isinstance(value, str):
            if any(mark in value for mark in _KEY_MATERIAL):
                found[path] = Mask(whole=True)
            else:
                shown = mask_text(value)
                if shown != value:
                    found[path] = Mask(whole=False, shown=shown)

    walk(data, ())
    return found
