"""What this user minted on this box: the record that lets `fdl join-config` trust a farm's key and token.

A farm directory can arrive from elsewhere (a clone with a force-added `.fdl/LABEL/`, a copied tarball),
holding a key pair and a token someone else knows; every check of the files themselves passes for such a
copy. So when fdl mints a farm's credentials it records, in a private state directory of the user's own,
the key's SHA256 fingerprint and a SHA-256 hash of the token; a re-run reuses credentials only when that
record matches both. The record holds no secret (the token is 256 bits of entropy: its hash reveals nothing).

    $XDG_STATE_HOME/fdl/farms/<hash of the fingerprint>.json   (default ~/.local/state/fdl/farms/)

The directories are 0700 and the records 0600, written atomically (fdl.hostside.fsio). A record is believed only
when the file and the two directories fdl made (fdl/, fdl/farms/) belong to this user and nobody else can
write them; anything else counts as no record.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import stat
import time
from pathlib import Path

from fdl.errors import FdlError
from fdl.hostside.fsio import atomic_write
from fdl.hostside.paths import state_dir

FORMAT = 1


def farms_dir() -> Path:
    return state_dir() / "farms"


def key_fingerprint(public_key: str) -> str:
    """OpenSSH's SHA256 fingerprint (`SHA256:...`, as `ssh-keygen -l -E sha256` prints it) of `TYPE BLOB [comment]`."""
    fields = public_key.split()
    if len(fields) < 2:
        raise ValueError("not an OpenSSH public key line")
    blob = base64.b64decode(fields[1], validate=True)
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.strip().encode()).hexdigest()


def _record_path(fingerprint: str) -> Path:
    return farms_dir() / f"{hashlib.sha256(fingerprint.encode()).hexdigest()[:40]}.json"


def _private_dir(path: Path) -> None:
    """Create `path` (and missing parents) 0700; narrow fdl's own directories to 0700; refuse foreign ones."""
    missing = []
    here = path
    while not here.exists():
        missing.append(here)
        here = here.parent
    for directory in reversed(missing):
        os.mkdir(directory, 0o700)
    for directory in (path.parent, path):  # fdl/ and fdl/farms/: fdl's own
        info = os.lstat(directory)
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise FdlError(f"{directory} is not a directory of this user's own, and fdl keeps its record of the "
                           f"farm credentials it minted there. Nothing was replaced.",
                           hint=f"remove or fix {directory} (a directory you own, mode 0700), or point "
                                f"XDG_STATE_HOME at a private directory, then run again")
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(directory, 0o700)


def record(public_key: str, token: str, *, label: str, farm_dir: Path) -> Path:
    """Remember that this user minted this key pair and token here (0600, atomically). Raises FdlError."""
    fingerprint = key_fingerprint(public_key)
    path = _record_path(fingerprint)
    entry = {"format": FORMAT, "fingerprint": fingerprint, "token_sha256": token_hash(token), "label": label,
             "farm_dir": str(farm_dir), "minted_epoch": int(time.time())}
    try:
        _private_dir(path.parent)
        atomic_write(path, json.dumps(entry, indent=2) + "\n", 0o600)
    except OSError as exc:
        raise FdlError(f"cannot record the farm's new credentials in {path.parent}: {exc.strerror}. Without that "
                       f"record a later run could not tell them from planted ones. Nothing was replaced.",
                       hint="make that directory writable (or set XDG_STATE_HOME to a private directory), then "
                            "run again") from None
    return path


def forget(public_key: str) -> None:
    """Drop the record of a key pair (a rotation replaced it); best effort."""
    try:
        _record_path(key_fingerprint(public_key)).unlink()
    except (OSError, ValueError):
        pass


def _trusted_bytes(path: Path) -> bytes | None:
    """The record's bytes, when it and fdl's state directories are this user's own and nobody else's to write."""
    me = os.getuid()
    try:
        for place, kind in ((path.parent.parent, stat.S_ISDIR), (path.parent, stat.S_ISDIR), (path, stat.S_ISREG)):
            info = os.lstat(place)
            if info.st_uid != me or info.st_mode & 0o022 or not kind(info.st_mode):
                return None
        with open(path, "rb") as handle:
            return handle.read(64 * 1024)
    except OSError:
        return None


def check(public_key: str, token: str) -> str | None:
    """None when this user minted this key and token on this box (the record matches both), else why not."""
    try:
        fingerprint = key_fingerprint(public_key)
    except ValueError:
        return "its public key cannot be read"
    path = _record_path(fingerprint)
    raw = _trusted_bytes(path)
    if raw is None:
        return (f"there is no record of fdl minting key {fingerprint} for this user on this box (looked in "
                f"{path.parent})")
    try:
        entry = json.loads(raw)
        matches = (entry.get("format") == FORMAT and hmac.compare_digest(str(entry["fingerprint"]), fingerprint)
                   and hmac.compare_digest(str(entry["token_sha256"]), token_hash(token)))
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"fdl's record for key {fingerprint} ({path}) cannot be read"
    if not matches:
        return f"the token is not the one fdl minted with key {fingerprint} (record {path})"
    return None
