"""A farm's credentials: an ed25519 key pair from ssh-keygen and a token from OS entropy.

Both live in the farm directory, 0600, and are reused on every re-run until
a rotation replaces them together. Neither is ever printed: reports carry
paths and the key's fingerprint.

Reuse is for what this user minted on this box, and nothing else: mint()
records the key's fingerprint and a hash of the token in the user's private
state (fdl.farm.minted) before the files are put in place, and vet() refuses
credentials without a matching record, files that group or others may read
(a clone or a copy leaves them so; fdl never narrows them itself: whoever
could read them may know them), and files tracked by git.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fdl.errors import FdlError
from fdl.farm import minted
from fdl.hostside.farm.authorized_keys import AuthorizedKeysError, KeyIdentity, parse_public_key
from fdl.hostside.fsio import atomic_write, fsync_dir

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
    problem = token_problem(token_text)
    if problem is not None:
        raise FdlError(f"{token} does not hold a token fdl would mint: {problem}.",
                       hint="run again with --regen to mint a new key and token")
    return Credentials(key, public, token, text, identity, fingerprint(public))


# --------------------------------------------------------------------------- trusting what was found

# Key types a farm key may be (fdl mints ed25519), and the least RSA size accepted.
_KEY_TYPES = {"ED25519", "ECDSA", "ED25519-SK", "ECDSA-SK", "RSA"}
MIN_RSA_BITS = 3072


def token_problem(text: str) -> str | None:
    """Why a token found on disk is not one fdl would mint (64 hex digits of OS entropy), or None."""
    if len(text) != 2 * TOKEN_BYTES or any(c not in "0123456789abcdef" for c in text):
        return f"it is not {2 * TOKEN_BYTES} lowercase hex digits"
    if len(set(text)) < 8:  # 64 random hex digits show all 16 values but for odds below 1e-30
        return f"it uses only {len(set(text))} distinct digits, which no random token does"
    for period in range(1, len(text) // 2 + 1):
        if text == (text[:period] * (len(text) // period + 1))[:len(text)]:
            return f"it repeats a {period}-digit pattern"
    return None


_REGEN = ("run again with --regen to mint a new key and token (workers holding the old ones will need the new "
          "worker.yml)")


def vet(cred: Credentials, farm_dir: Path) -> None:
    """Check credentials found on disk before reusing them; raise FdlError (naming --regen) on anything else.

    Each file must be a regular file (not a link) owned by this user, readable and writable by this user
    alone, and untracked by git; the private key an unencrypted key of a strong type that matches key.pub;
    and this user's record of what fdl minted on this box must hold this key's fingerprint and this token's
    hash. Modes are never narrowed here: a file others could read may be known to them.
    """
    uid = os.getuid()
    loose: list[str] = []
    for path in (cred.key, cred.public, cred.token_file):
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise FdlError(f"cannot inspect {path}: {exc.strerror}.") from None
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
            raise FdlError(f"{path} is {'a symbolic link' if stat.S_ISLNK(st.st_mode) else 'not a regular file'}; "
                           f"fdl reuses farm credentials only from plain files it could have written.", hint=_REGEN)
        if st.st_uid != uid:
            raise FdlError(f"{path} belongs to uid {st.st_uid}, not to you (uid {uid}): credentials someone else "
                           f"wrote are not reused.", hint=_REGEN)
        if stat.S_IMODE(st.st_mode) & 0o077:
            loose.append(f"{path} is {stat.S_IMODE(st.st_mode):04o}")
    if loose:
        raise FdlError(
            f"the farm's credentials are open to group or others ({'; '.join(loose)}): join-config writes them "
            f"0600, so these came from somewhere else (a clone or a copy leaves them so), and anyone who could read "
            f"them may know them. They are not reused, and their modes are left as they are, with --yes or without.",
            hint=_REGEN)
    tracked = _tracked_by_git(farm_dir, (cred.key, cred.public, cred.token_file))
    if tracked:
        raise FdlError(f"{', '.join(str(p) for p in tracked)} {'is' if len(tracked) == 1 else 'are'} tracked by git: "
                       f"a farm's key and token that are in a repository are known to whoever has a copy of it, so "
                       f"they are not reused.",
                       hint=f"{_REGEN}; and take them out of the repository (git rm --cached), since its history "
                            f"keeps them")
    listing = _keygen_listing(cred.public)
    if listing is None:
        raise FdlError(f"ssh-keygen cannot read {cred.public}.", hint=_REGEN)
    bits, kind = listing
    if kind not in _KEY_TYPES:
        raise FdlError(f"{cred.key} is a {kind} key; a farm key is ed25519 (or ECDSA, or RSA of at least "
                       f"{MIN_RSA_BITS} bits).", hint=_REGEN)
    if kind == "RSA" and bits < MIN_RSA_BITS:
        raise FdlError(f"{cred.key} is a {bits}-bit RSA key, too weak for a farm key (at least {MIN_RSA_BITS}).",
                       hint=_REGEN)
    derived = _public_of(cred.key)
    if derived is None:
        raise FdlError(f"{cred.key} is not an unencrypted OpenSSH private key (the agent starts unattended, so a "
                       f"farm key has no passphrase).", hint=_REGEN)
    if derived.split()[:2] != cred.public_key.split()[:2]:
        raise FdlError(f"{cred.key} and {cred.public} are not one key pair.", hint=_REGEN)
    why = minted.check(cred.public_key, cred.token())
    if why is not None:
        raise FdlError(
            f"the key and token in {farm_dir} were not minted by fdl for you on this box: {why}. fdl reuses only "
            f"credentials it minted itself (a farm made by an fdl from before this record existed counts as "
            f"foreign too: rotate it once).", hint=_REGEN)


def _tracked_by_git(farm_dir: Path, paths: tuple[Path, ...]) -> list[Path]:
    """The paths git tracks in the repository farm_dir belongs to (none: no git, or no repository).

    git runs with the repository's fsmonitor hook off (a copied repository's configuration is not ours to run)
    and with no GIT_DIR or GIT_WORK_TREE of the caller's.
    """
    git = shutil.which("git")
    if git is None:
        return []
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    try:
        done = subprocess.run([git, "-c", "core.fsmonitor=false", "-C", str(farm_dir), "ls-files", "-z", "--",
                               *(p.name for p in paths)], capture_output=True, timeout=30, env=env,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:  # not in a repository (or git refused it): nothing is tracked
        return []
    names = {os.path.basename(n) for n in done.stdout.decode(errors="replace").split("\0") if n}
    return [p for p in paths if p.name in names]


def _keygen_listing(public: Path) -> tuple[int, str] | None:
    """(bits, TYPE) from `ssh-keygen -l`, e.g. (256, "ED25519")."""
    try:
        out = subprocess.run([_keygen(), "-l", "-f", str(public)], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL)
    except (subprocess.SubprocessError, OSError):
        return None
    words = out.stdout.split()
    if out.returncode != 0 or len(words) < 3 or not words[0].isascii() or not words[0].isdigit():
        return None
    return int(words[0]), words[-1].strip("()").upper()


def _public_of(key: Path) -> str | None:
    """The public half of a private key, read through a private copy (ssh-keygen refuses a 0644 key file)."""
    try:
        data = key.read_bytes()
    except OSError:
        return None
    with tempfile.TemporaryDirectory(prefix=".vet-") as tmp:
        copy = Path(tmp) / "key"
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        try:
            out = subprocess.run([_keygen(), "-y", "-P", "", "-f", str(copy)], capture_output=True, text=True,
                                 timeout=30, stdin=subprocess.DEVNULL)
        except (subprocess.SubprocessError, OSError):
            return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


@dataclass
class Staged:
    """A new key pair and token, made in a private directory inside the farm directory and not in place yet:
    what the farm's files are rendered with before anything is written (commit() puts them in place, after
    recording them as this user's own; discard() drops them)."""

    farm_dir: Path
    label: str
    directory: Path
    token: str

    @property
    def key(self) -> Path:
        return self.directory / KEY_NAME

    @property
    def public_key(self) -> str:
        return (self.directory / PUB_NAME).read_text().strip()

    def commit(self) -> Credentials:
        """Record the pair and token as minted by this user here, then move them into place together."""
        farm_dir = self.farm_dir
        try:
            old_public: str | None = (farm_dir / PUB_NAME).read_text()
        except (OSError, UnicodeDecodeError):
            old_public = None
        # The record first: a crash after it leaves a record of a key never put in place (harmless), never a
        # key in place without its record.
        minted.record(self.public_key, self.token, label=self.label, farm_dir=farm_dir)
        atomic_write(str(farm_dir / TOKEN_NAME), (self.token + "\n").encode(), 0o600)
        os.replace(self.key, farm_dir / KEY_NAME)
        os.replace(self.directory / PUB_NAME, farm_dir / PUB_NAME)
        os.chmod(farm_dir / PUB_NAME, 0o600)
        fsync_dir(farm_dir)  # the renames themselves survive a crash
        if old_public is not None and old_public.split()[:2] != (farm_dir / PUB_NAME).read_text().split()[:2]:
            minted.forget(old_public)  # rotated out: that pair is no longer reused here
        creds = load(farm_dir)
        assert creds is not None
        return creds

    def discard(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def stage(farm_dir: Path, label: str) -> Staged:
    """A new key pair (ssh-keygen) and token (OS entropy) in a private directory of farm_dir; nothing replaced."""
    token = new_token()  # before anything touches the disk: an entropy failure writes nothing
    keygen = _keygen()
    directory = Path(tempfile.mkdtemp(prefix=".keygen-", dir=farm_dir))  # 0700
    staged = Staged(farm_dir, label, directory, token)
    try:
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"fdl-farm-{label}", "-f", str(staged.key)],
                       capture_output=True, text=True, timeout=60, check=True)
        os.chmod(staged.key, 0o600)
    except subprocess.CalledProcessError as exc:
        staged.discard()
        raise FdlError(f"ssh-keygen failed: {(exc.stderr or exc.stdout).strip()}. Nothing was replaced.") from None
    except (subprocess.SubprocessError, OSError) as exc:
        staged.discard()
        raise FdlError(f"ssh-keygen could not run: {exc}. Nothing was replaced.") from None
    return staged


def mint(farm_dir: Path, label: str) -> Credentials:
    """A new key pair and token, recorded as this user's own, then moved into place together (old ones replaced)."""
    staged = stage(farm_dir, label)
    try:
        return staged.commit()
    finally:
        staged.discard()
