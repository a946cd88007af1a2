"""The supported platforms as the tests see them: interpreters, the controller matrix, its venvs.

The matrix (docs/ansible.md, "Supported platforms") is a list of controller combinations, a Python and
an ansible-core line. Each gets a virtual environment holding fdl installed from its wheel, built once
and kept in a cache outside the repository, keyed by the interpreter and the constraints, so a rerun
only reinstalls fdl itself. Interpreters come from `FDL_TEST_PYTHON_<major>_<minor>` when set, else
`python<major>.<minor>` on PATH, else pyenv's versions; a missing one fails the test under CI=true and
skips it elsewhere, saying how to get it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from fdl.collection import COMMAND_ANSIBLE_CORE_LINES
from tests.conftest import IN_CI, REPO


@dataclass(frozen=True)
class Combo:
    """One controller combination: a Python and the ansible-core line installed with it."""

    python: str  # "3.12"
    ansible: str  # "2.21": the ansible-core line

    @property
    def id(self) -> str:
        return f"py{self.python}-core{self.ansible}"


# The newest ansible-core line each controller Python gets from `pip install fdl` (ansible-core 2.20+
# requires Python 3.12 on the controller; pyproject.toml caps the lines at <2.22).
NEWEST = {"3.11": "2.19", "3.12": "2.21", "3.13": "2.21"}
LINES = COMMAND_ANSIBLE_CORE_LINES  # fdl/collection.py states them
MATRIX = [Combo(py, line) for py in NEWEST for line in LINES
          if tuple(map(int, line.split("."))) <= tuple(map(int, NEWEST[py].split(".")))]
# What the default test run covers: the oldest and the newest combination.
DEFAULT = [Combo("3.11", "2.19"), Combo("3.13", "2.21")]
# ansible-core 2.20 and later run modules on Python 3.9+; 2.19 still on 3.8.
TARGET_PYTHONS = ("3.8", "3.13")


def selected_combos() -> list[Combo]:
    """The combinations this run tests: all under FDL_MATRIX=all (scripts/test.sh --matrix), else DEFAULT."""
    return MATRIX if os.environ.get("FDL_MATRIX") == "all" else DEFAULT


def _version_of(python: str) -> str | None:
    try:
        done = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _pyenv_root() -> Path:
    found = os.environ.get("PYENV_ROOT")
    if found:
        return Path(found)
    pyenv = shutil.which("pyenv")
    if pyenv:
        done = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30)
        if done.returncode == 0 and done.stdout.strip():
            return Path(done.stdout.strip())
    from tests.conftest import real_home

    return real_home() / ".pyenv"


def find_python(version: str) -> Path | None:
    """A working interpreter of this major.minor, or None. Each candidate is run: a pyenv shim on PATH
    can exist and fail (exit 127) for a version it does not hold."""
    env_name = "FDL_TEST_PYTHON_" + version.replace(".", "_")
    candidates = []
    if os.environ.get(env_name):
        candidates.append(os.environ[env_name])
    if "{}.{}".format(*sys.version_info[:2]) == version:
        candidates.append(sys.executable)
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(on_path)
    versions = _pyenv_root() / "versions"
    if versions.is_dir():
        for tree in sorted(versions.glob(f"{version}.*"), reverse=True):
            if re.fullmatch(re.escape(version) + r"\.\d+", tree.name):
                candidates.append(str(tree / "bin" / f"python{version}"))
    for candidate in candidates:
        if _version_of(candidate) == version:
            return Path(candidate)
    return None


def require_python(version: str) -> Path:
    """The interpreter of this version; missing: fail under CI, skip elsewhere, saying how to get it."""
    found = find_python(version)
    if found is not None:
        return found
    reason = (f"Python {version} was not found (FDL_TEST_PYTHON_{version.replace('.', '_')}, python{version} "
              f"on PATH, or pyenv's versions/{version}.*). The platform tests need every supported Python: "
              f"install it with `pyenv install {version}` (or your distribution's python{version} package), "
              f"or point FDL_TEST_PYTHON_{version.replace('.', '_')} at one (docs/ansible.md, "
              f"\"Supported platforms\")")
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


def build_wheel(dest: Path) -> Path:
    """fdl's wheel from this checkout, as a user installs it."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dest), str(REPO)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (wheel,) = Path(dest).glob("fdl-*.whl")
    return wheel


def cache_root() -> Path:
    """Where matrix venvs are kept: FDL_MATRIX_CACHE, else ~/.cache/fdl-test/matrix of whoever runs the tests
    (never in the repo, nor in the home of the run)."""
    from tests.conftest import real_cache

    if os.environ.get("FDL_MATRIX_CACHE"):
        return Path(os.environ["FDL_MATRIX_CACHE"])
    return real_cache() / "fdl-test" / "matrix"


def constraints(combo: Combo) -> str:
    """pip constraints for a combination: none for the newest line (the resolver must find it alone)."""
    if NEWEST[combo.python] == combo.ansible:
        return ""
    major, minor = combo.ansible.split(".")
    return f"ansible-core>={combo.ansible},<{major}.{int(minor) + 1}\n"


def _requirements() -> str:
    """fdl's declared dependencies: a change to them means a fresh venv."""
    text = (REPO / "pyproject.toml").read_text()
    match = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    return match.group(1) if match else text


def matrix_venv(combo: Combo, wheel: Path) -> Path:
    """The combination's venv with this wheel installed; built on first use, reused after.

    Built in place with a marker written last (a venv cannot be moved once made): a directory without
    the marker is an interrupted build and is started over.
    """
    python = require_python(combo.python)
    full = subprocess.run([str(python), "-c", "import sys; print(sys.version)"], capture_output=True,
                          text=True, check=True).stdout.strip()
    wanted = constraints(combo)
    key = hashlib.sha256("\0".join([str(Path(python).resolve()), full, wanted, _requirements()]).encode())
    venv = cache_root() / f"{combo.id}-{key.hexdigest()[:12]}"
    marker = venv / ".fdl-matrix-complete"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if not marker.exists():
        shutil.rmtree(venv, ignore_errors=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        made = subprocess.run([str(python), "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300)
        assert made.returncode == 0, f"{python} -m venv failed: {made.stderr}"
        extra = []
        if wanted:
            (venv / "constraints.txt").write_text(wanted)
            extra = ["-c", str(venv / "constraints.txt")]
        done = subprocess.run([*pip, *extra, str(wheel)], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"pip install of the wheel into {venv} failed:\n{done.stderr[-4000:]}"
        marker.write_text(wanted)
    else:  # the dependencies are in place; this checkout's fdl replaces the last one
        done = subprocess.run([*pip, "--no-deps", "--force-reinstall", str(wheel)], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"reinstalling the wheel into {venv} failed:\n{done.stderr[-4000:]}"
    return venv


def installed_version(venv: Path, distribution: str) -> str:
    done = subprocess.run([str(venv / "bin" / "python"), "-c",
                           f"from importlib.metadata import version; print(version({distribution!r}))"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def portable_python(version: str, dest: Path) -> Path:
    """A copy of an interpreter that other accounts can run, behind a wrapper that finds its libpython.

    pyenv's builds live in root's home, which testbed users cannot enter, and link libpython with an
    rpath into it. The copy leaves out the test suite and site-packages (a target host needs neither),
    and the wrapper sets LD_LIBRARY_PATH to the copy's lib/. Returns the wrapper.
    """
    python = require_python(version)
    done = subprocess.run([str(python), "-c", "import sys, sysconfig; print(sys.base_prefix); "
                           "print(sysconfig.get_config_var('LDLIBRARY') or '')"],
                          capture_output=True, text=True, check=True)
    prefix, ldlibrary = (Path(done.stdout.splitlines()[0]), done.stdout.splitlines()[1])
    copy = dest / f"python{version}"
    if not (copy / "bin" / f"python{version}").exists():
        (copy / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(python).resolve(), copy / "bin" / f"python{version}")
        stdlib = prefix / "lib" / f"python{version}"
        skip = shutil.ignore_patterns("test", "tests", "site-packages", "idlelib", "tkinter", "turtledemo",
                                      "ensurepip", "__pycache__", "config-*")
        shutil.copytree(stdlib, copy / "lib" / f"python{version}", ignore=skip, symlinks=True)
        (copy / "lib" / f"python{version}" / "site-packages").mkdir(exist_ok=True)
        for lib in (prefix / "lib").glob(f"{ldlibrary}*") if ldlibrary else ():
            shutil.copy2(lib, copy / "lib" / lib.name)
    wrapper = dest / f"python{version}-wrapper"
    wrapper.write_text(f"#!/bin/sh\nLD_LIBRARY_PATH={copy / 'lib'}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} "
                       f"exec {copy / 'bin' / f'python{version}'} \"$@\"\n")
    wrapper.chmod(0o755)
    subprocess.run(["chmod", "-R", "a+rX", str(dest)], check=True)
    return wrapper
