"""`ansible-test sanity` on every ansible-core line the collection claims, offline, as the tests run it.

ansible-test runs each sanity test in a virtual environment of its own (~/.ansible/test/venv), which it fills
with pip from its own pinned requirement files, after bootstrapping pip with a get-pip.py it downloads from
ci-files.testing.ansible.com. None of that may reach a network while the tests run, so each line gets, once,
in a cache of the test tooling's own (FDL_TEST_CACHE, else ~/.cache/fdl-test of whoever runs the tests: never
the home's ~/.ansible or pip caches), made from the package index by the first run:

    venv/     a virtual environment of the line's controller Python holding ansible-core (SANITY_LINES pins it)
    wheels/   every package ansible-test installs into its sanity venvs (its requirement files for each sanity
              test, and the pip, setuptools and wheel it bootstraps them with), downloaded from the index
    home/     the HOME ansible-test runs with: its sanity venvs (kept between runs), a pip.conf that installs
              from wheels/ alone (no index), and at the path ansible-test reads first, a stand-in for the
              get-pip.py it would download, which installs pip from wheels/

Then `ansible-test sanity` runs without --requirements, and, when the suite runs as root, in a network
namespace of its own (`unshare --net`), so a download it still tried would fail the test. A missing
interpreter fails the test under CI=true and skips it elsewhere (tests/platforms.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fdl.collection import ANSIBLE_CORE_LINES
from tests.conftest import IN_CI, real_cache
from tests.platforms import require_python

# ansible-core line: (controller Python the tests run it on, the release installed). 2.20 and later need
# Python 3.12 on the controller; the two newest lines take the two newest Pythons, so both are covered.
SANITY_LINES = {
    "2.17": ("3.11", "2.17.14"),
    "2.18": ("3.11", "2.18.19"),
    "2.19": ("3.11", "2.19.14"),
    "2.20": ("3.12", "2.20.10"),
    "2.21": ("3.13", "2.21.5"),
}
assert tuple(SANITY_LINES) == ANSIBLE_CORE_LINES, "a line the collection claims has no sanity run"

# Stand-in for ansible-test's downloaded get-pip.py: the pip it asks for, from the wheel directory alone.
GET_PIP = '''\
"""Stand-in for get-pip.py (fdl's tests/ecosystem.py): installs what ansible-test asks for from {wheels}."""
import subprocess
import sys

args = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, {pip!r}, "install", "--no-index", "--find-links", {wheels!r}, *args]))
'''

# ansible-test's own pins for the packages it bootstraps a sanity venv with: read from the ansible-test of the
# venv (test tooling reading its tool's data; printed as "name==version" lines).
_BOOTSTRAP = """\
import sys, types
from ansible_test._internal.python_requirements import get_venv_packages
version = "%d.%d" % sys.version_info[:2]
for name, release in get_venv_packages(types.SimpleNamespace(version=version)).items():
    print(f"{name}=={release}")
"""


@dataclass(frozen=True)
class SanityEnv:
    """One ansible-core line's prepared environment."""

    line: str
    python: str  # "3.11"
    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "venv" / "bin"

    @property
    def home(self) -> Path:
        return self.root / "home"


def cache_root() -> Path:
    return Path(os.environ.get("FDL_TEST_CACHE") or real_cache() / "fdl-test") / "ansible-test"


def _run(argv: list[str], what: str, timeout: float = 900) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{what} failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
    return done.stdout


def _locked(path: Path) -> int:
    """An exclusive lock on `path` (another run preparing or running the same line waits)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def prepare(line: str) -> tuple[SanityEnv, int]:
    """The line's environment, made on first use (from the index), and a lock held on it until released with
    os.close: ansible-test writes its sanity venvs into the shared home while it runs."""
    version, release = SANITY_LINES[line]
    interpreter = require_python(version)
    full = _run([str(interpreter), "-c", "import sys; print(sys.version)"], f"{interpreter} --version").strip()
    key = hashlib.sha256("\0".join([str(Path(interpreter).resolve()), full, release, GET_PIP]).encode())
    root = cache_root() / f"core{line}-py{version}-{key.hexdigest()[:12]}"
    lock = _locked(root.parent / f"{root.name}.lock")
    try:
        if not (root / ".complete").is_file():
            _build(root, Path(interpreter), release)
    except BaseException:
        os.close(lock)
        raise
    return SanityEnv(line, version, root), lock


def _build(root: Path, interpreter: Path, release: str) -> None:
    shutil.rmtree(root, ignore_errors=True)
    venv, wheels, home = root / "venv", root / "wheels", root / "home"
    _run([str(interpreter), "-m", "venv", str(venv)], f"{interpreter} -m venv")
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", "-q", f"ansible-core=={release}"], f"installing ansible-core {release}")
    test_pkg = Path(_run([python, "-c", "import ansible_test, os; print(os.path.dirname(ansible_test.__file__))"],
                         "finding ansible-test").strip())
    for requirements in sorted((test_pkg / "_data" / "requirements").glob("sanity.*.txt")):
        _run([*pip, "download", "-q", "-d", str(wheels), "-r", str(requirements)], f"downloading {requirements.name}")
    bootstrap = _run([python, "-c", _BOOTSTRAP], "reading ansible-test's bootstrap pins").split()
    _run([*pip, "download", "-q", "--no-deps", "-d", str(wheels), *bootstrap], "downloading pip")
    pip_release = next(spec.split("==")[1] for spec in bootstrap if spec.startswith("pip=="))
    (pip_wheel,) = wheels.glob(f"pip-{pip_release}-*.whl")
    cache = home / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True)
    (cache / f"get_pip_{pip_release.replace('.', '_')}.py").write_text(
        GET_PIP.format(pip=str(pip_wheel / "pip"), wheels=str(wheels)))
    # ansible-test passes no PIP_* variable to its pip, but HOME: the user's pip.conf there wins over the machine's
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text(f"[global]\nno-index = true\nfind-links = {wheels}\n"
                                                       f"disable-pip-version-check = true\n")
    (root / ".complete").write_text(release + "\n")


def offline_prefix() -> list[str]:
    """`unshare --net` as root (a network namespace with no interface but loopback), else nothing."""
    unshare = shutil.which("unshare")
    if os.geteuid() == 0 and unshare:
        return [unshare, "--net"]
    assert not IN_CI, "CI runs the suite as root: ansible-test must run in a namespace without a network"
    return []


def run_sanity(env: SanityEnv, collection: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    """`ansible-test sanity` in the installed collection's directory, on the line's controller Python."""
    shell = {"PATH": f"{env.bin}:/usr/local/bin:/usr/bin:/bin", "HOME": str(env.home), "LANG": "C.UTF-8"}
    return subprocess.run([*offline_prefix(), str(env.bin / "ansible-test"), "sanity", "--python", env.python,
                           "--color", "no"], cwd=collection, env=shell, capture_output=True, text=True,
                          timeout=timeout)
