"""Shared test helpers: run the real `fdl` entry point as a user would."""

from __future__ import annotations

import ast
import atexit
import fcntl
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI") == "true"

# The variables that steer the tests themselves; every other FDL_* variable is fdl's, and is cleared below.
TEST_CONTROLS = ("FDL_TEST", "FDL_TESTBED_", "FDL_MATRIX", "FDL_CRASH_SEED")


def docstring_ids(tree: ast.AST) -> set[int]:
    """ids of a parsed module's string constants that are docstrings (of the module, its classes and functions):
    the source scans (variable names, directories, deployments) let prose name what code may not spell."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def code_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant of a module that is not a docstring (f-string parts included): what
    the source scans hold to the one place a name or a directory is spelled."""
    tree = ast.parse(path.read_text(), str(path))
    skip = docstring_ids(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip]


def repo_relative(path: Path) -> str:
    """A repository file's path as the repository names it (fdl/hostside/paths.py)."""
    return path.relative_to(REPO).as_posix()


def fdl_modules() -> list[Path]:
    """Every Python module of the fdl package (the shipped data under _share excluded)."""
    return sorted(p for p in (REPO / "fdl").rglob("*.py") if "_share" not in p.parts)


def descendants(pid: int) -> list[int]:
    """Every process below pid (children, theirs, ...), read from /proc; sorted."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return sorted(found)


def real_home() -> Path:
    """The home of whoever runs the suite (tests run with HOME set to a home of the run's own)."""
    return Path(os.environ.get("FDL_TEST_REAL_HOME") or os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir)


def real_cache() -> Path:
    """Their cache directory: for the test tooling's own slow-to-build caches (venvs of other ansible-core
    lines), never for fdl's."""
    return Path(os.environ.get("FDL_TEST_REAL_CACHE") or real_home() / ".cache")


_RUN_LOCK: list[int] = []


def _remove_killed_runs(runs: Path) -> None:
    """Remove what runs that were killed left behind (their exit handlers never ran): a living run holds the
    lock on its directory's .lock, so a directory whose lock can be taken belongs to no run any more."""
    for old in runs.glob("run-*"):
        try:
            fd = os.open(old / ".lock", os.O_RDWR)
        except OSError:  # being made by a run starting now, or not one of these
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # alive
            os.close(fd)
            continue
        try:
            runtime = Path((old / ".runtime").read_text())
            if runtime.parent == Path(tempfile.gettempdir()) and runtime.name.startswith("fdl-test-rt-"):
                shutil.rmtree(runtime, ignore_errors=True)
        except OSError:
            pass
        shutil.rmtree(old, ignore_errors=True)
        os.close(fd)


def _a_home_of_this_run() -> None:
    """Point HOME and the XDG base directories at directories of this run, removed at its end.

    So no test reads or leaves anything in the caches, state or configuration of whoever runs the suite
    (fdl's cache dir and config cache, ~/.flodl, the launcher's live records), nor in another clone's run on
    the same machine. A test that needs a particular home still sets its own. The home is made under the
    real one (whose parents are not world-writable, as sshd's StrictModes wants of a key file below it);
    the runtime directory under the temp dir, where its sockets' paths stay short. The toolchains that live
    in the real home (rustup, cargo, pyenv) stay reachable through their own variables, and fdl's own
    variables from the caller's environment (FDL_PORT, FDL_ENV, LIBTORCH, ...) do not reach the tests.
    """
    if os.environ.get("FDL_TEST_REAL_HOME"):  # a run's own process (or one it started) already has its home
        return
    home, cache = real_home(), os.environ.get("XDG_CACHE_HOME")
    for name, sub in (("RUSTUP_HOME", ".rustup"), ("CARGO_HOME", ".cargo"), ("PYENV_ROOT", ".pyenv")):
        if not os.environ.get(name) and (home / sub).is_dir():
            os.environ[name] = str(home / sub)
    runs = home / ".cache" / "fdl-test" / "runs"
    try:
        runs.mkdir(parents=True, exist_ok=True, mode=0o700)
        _remove_killed_runs(runs)
        run = Path(tempfile.mkdtemp(prefix="run-", dir=runs))
    except OSError:  # a read-only home: the temp dir it is
        run = Path(tempfile.mkdtemp(prefix="fdl-test-run-"))
    runtime = Path(tempfile.mkdtemp(prefix="fdl-test-rt-"))
    (run / ".runtime").write_text(str(runtime))
    _RUN_LOCK.append(os.open(run / ".lock", os.O_RDWR | os.O_CREAT, 0o600))  # held while this run lives
    fcntl.flock(_RUN_LOCK[0], fcntl.LOCK_EX)
    atexit.register(shutil.rmtree, run, True)
    atexit.register(shutil.rmtree, runtime, True)
    for name in [n for n in os.environ if n.startswith("FDL_") and not n.startswith(TEST_CONTROLS)]:
        del os.environ[name]
    for name in ("LIBTORCH", "LIBTORCH_PATH"):
        os.environ.pop(name, None)
    own = run / "home"
    os.environ.update(FDL_TEST_REAL_HOME=str(home), FDL_TEST_REAL_CACHE=cache or str(home / ".cache"),
                      HOME=str(own), XDG_CACHE_HOME=str(own / ".cache"), XDG_CONFIG_HOME=str(own / ".config"),
                      XDG_DATA_HOME=str(own / ".local" / "share"), XDG_STATE_HOME=str(own / ".local" / "state"),
                      XDG_RUNTIME_DIR=str(runtime))
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        Path(os.environ[name]).mkdir(parents=True, mode=0o700)


_a_home_of_this_run()

# A suite started in the background by a script (`scripts/test.sh --quick &` in a shell without job control)
# inherits SIGINT ignored, and so would every fdl it starts; the tests that press Ctrl-C on one need it
# delivered as at a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# fdl records the farm credentials it mints in $XDG_STATE_HOME/fdl/farms (fdl.farm.minted): the suite's go to a
# directory of this run too, never to the state of whoever runs the tests (a test can still point it elsewhere).
if not os.environ.get("XDG_STATE_HOME"):
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="fdl-test-state-")
    atexit.register(shutil.rmtree, os.environ["XDG_STATE_HOME"], True)

pytest_plugins = ["tests.testbed.plugin"]  # the SSH testbed fixtures (tests/testbed/README.md)


def fdl_env(extra: dict | None = None) -> dict:
    """The environment for an fdl subprocess: this checkout first on the import path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("FDL_ENV", None)
    env.pop("FDL_DEBUG", None)
    env.update(extra or {})
    return env


def run_fdl(*args: str, cwd: Path | str | None = None, env: dict | None = None, input: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `python -m fdl ARGS` in cwd and capture its output (text)."""
    return subprocess.run([sys.executable, "-m", "fdl", *args], cwd=cwd, env=fdl_env(env), input=input,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def fdl():
    return run_fdl


def need_root_or_skip(reason: str) -> None:
    """Tests needing root run in CI (root there); elsewhere they skip, saying why. Never skip in CI."""
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail(f"CI must run this test as root: {reason}")
        pytest.skip(f"needs root: {reason}")


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory):
    """A fake libnvidia-ml.so.1 built once per session; `.env("H100:9.0:80G")` scripts its devices
    (and points FDL_PROBE_ROOT at a healthy scripted host: /proc/modules, /dev/nvidia*)."""
    from tests.fakes import FakeNvml, build_fake_nvml, make_host_root

    return FakeNvml(build_fake_nvml(tmp_path_factory.mktemp("fake-nvml")),
                    make_host_root(tmp_path_factory.mktemp("fake-host-root")))


@pytest.fixture
def fake_nccl(tmp_path_factory):
    """Factory: fake_nccl("2.27.5") -> a directory holding a loadable libnccl.so.2 of that version."""
    from tests.fakes import build_fake_nccl

    def build(version: str = "2.27.5", *, reported: str | None = None) -> Path:
        dest = tmp_path_factory.mktemp("fake-nccl")
        build_fake_nccl(dest, version, reported=reported)
        return dest

    return build


def build_collection(out: Path, python: str | None = None) -> Path:
    """scripts/build-collection OUTDIR: the flodl.fdl tarball, built as a release is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["PYTHON"] = python or sys.executable
    done = subprocess.run([str(REPO / "scripts" / "build-collection"), str(out)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    tarball = Path(done.stdout.strip().splitlines()[-1])
    assert tarball.is_file() and tarball.name.startswith("flodl-fdl-"), done.stdout
    return tarball


def install_collection(tarball: Path, collections: Path, python: str | None = None) -> Path:
    """`ansible-galaxy collection install TARBALL -p COLLECTIONS` into an empty path; returns COLLECTIONS."""
    galaxy = Path(python or sys.executable).parent / "ansible-galaxy"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["HOME"] = str(collections.parent)
    # The test venv holds fdl as an editable install, so this clone (and its collection source) is on sys.path,
    # where ansible-galaxy would find flodl.fdl "already installed"; a user's Python has no clone on it.
    env["ANSIBLE_COLLECTIONS_SCAN_SYS_PATH"] = "False"
    # Run away from the clone: from its root, its ansible.cfg puts its own flodl.fdl (the links in
    # ansible_collections/) on the collections path, and ansible-galaxy would find it "already installed".
    collections.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([str(galaxy), "collection", "install", "--offline", "-p", str(collections), str(tarball)],
                          capture_output=True, text=True, env=env, cwd=collections.parent, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (collections / "ansible_collections" / "flodl" / "fdl" / "MANIFEST.json").is_file()
    return collections


@pytest.fixture(scope="session")
def collection_tarball(tmp_path_factory) -> Path:
    return build_collection(tmp_path_factory.mktemp("collection-build"))


@pytest.fixture(scope="session")
def installed_collection(collection_tarball, tmp_path_factory) -> Path:
    """A collections path holding only flodl.fdl, installed from its tarball (world-readable for testbed users)."""
    base = tmp_path_factory.mktemp("collection-install")
    path = install_collection(collection_tarball, base / "collections")
    for folder in (base, *[p for p in path.rglob("*") if p.is_dir()], path):
        os.chmod(folder, 0o755)
    return path
