"""A farm's credentials: an ed25519 key pair from ssh-keygen and a token from OS entropy.

Both live in the farm directory, 0600, and are reused on every re-run until
a rotation replaces them together. Neither is ever printed: reports carry
paths and the key's fingerprint.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fdl.errors import FdlError
from fdl.farm.authorized_keys import AuthorizedKeysError, KeyIdentity, atomic_write, parse_public_key

KEY_NAME, PUB_NAME, TOKEN_NAME = "key", "key.pub", "token"
TOKEN_BYTES = 32


@dataclass(frozen=True)
class Credentials:
    key: Path
    public: Path
    token_file: Path
    public_key: str  # `ssh-ed25519 AAAA... comment` (public, fine to embed)
    identity: KeyIdentity
    fingerprint: str

    def token(self) -> str:
        return self.token_file.read_text().strip()


def new_token() -> str:
    """64 hex digits from the OS entropy source, or a refusal: never a weaker fallback."""
    try:
        return os.urandom(TOKEN_BYTES).hex()  # what secrets.token_hex does, looked up at call time
    except (OSError, NotImplementedError) as exc:
        raise FdlError(
            f"the operating system's entropy source failed ({exc}); fdl does not mint an admission token "
            f"from anything weaker. Nothing was written.",
            hint="check that /dev/urandom (getrandom) works in this environment, then run again",
        ) from None


def _keygen() -> str:
    path = shutil.which("ssh-keygen")
    if path is None:
        raise FdlError(
            "ssh-keygen was not found, and the farm key comes from it. Nothing was written.",
            hint="install the OpenSSH client (apt-get install openssh-client, dnf install openssh-clients; "
                 "macOS ships it)",
        )
    return path


def fingerprint(public: Path) -> str:
    try:
        out = subprocess.run([_keygen(), "-l", "-E", "sha256", "-f", str(public)], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
    except (subprocess.SubprocessError, OSError):
        return "unknown"
    return out[1] if len(out) > 1 else "unknown"


def load(farm_dir: Path) -> Credentials | None:
    """The farm's existing credentials, None when there are none, an error when half of them is missing."""
    key, public, token = farm_dir / KEY_NAME, farm_dir / PUB_NAME, farm_dir / TOKEN_NAME
    present = [p for p in (key, public, token) if p.exists()]
    if not present:
        return None
    if len(present) != 3:
        missing = ", ".join(p.name for p in (key, public, token) if not p.exists())
        raise FdlError(
            f"the farm in {farm_dir} is incomplete: {missing} missing. Re-running cannot reuse half a credential.",
            hint="run again with --regen to mint a new key and token together (workers holding the old ones "
                 "will need the new ones)",
        )
    text = public.read_text().strip()
    try:
        identity = parse_public_key(text)
    except AuthorizedKeysError:
        raise FdlError(f"{public} is not an OpenSSH public key; it was edited or damaged.",
                       hint="run again with --regen to mint a new key and token") from None
    token_text = token.read_text().strip()
    if len(token_text) < 32 or any(c not in "0123456789abcdef" for c in token_text):
        raise FdlError(f"{token} does not hold a token fdl minted (64 hex digits).",
                       hint="run again with --regen to mint a new key and token")
    return Credentials(key, public, token, text, identity, fingerprint(public))


def mint(farm_dir: Path, label: str) -> Credentials:
    """A new key pair and token, moved into place together (old ones, if any, replaced)."""
    token = new_token()  # before anything touches the disk: an entropy failure writes nothing
    keygen = _keygen()
    with tempfile.TemporaryDirectory(prefix=".keygen-", dir=farm_dir) as tmp:
        tmp_key = Path(tmp) / "key"
        try:
            subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"fdl-farm-{label}",
                            "-f", str(tmp_key)], capture_output=True, text=True, timeout=60, check=True)
        except subprocess.CalledProcessError as exc:
            raise FdlError(f"ssh-keygen failed: {(exc.stderr or exc.stdout).strip()}. Nothing was replaced.") from None
        except (subprocess.SubprocessError, OSError) as exc:
            raise FdlError(f"ssh-keygen could not run: {exc}. Nothing was replaced.") from None
        os.chmod(tmp_key, 0o600)
        atomic_write(str(farm_dir / TOKEN_NAME), (token + "\n").encode(), 0o600)
        os.replace(tmp_key, farm_dir / KEY_NAME)
        os.replace(tmp_key.with_suffix(".pub"), farm_dir / PUB_NAME)
        os.chmod(farm_dir / PUB_NAME, 0o600)
    creds = load(farm_dir)
    assert creds is not None
    return creds
