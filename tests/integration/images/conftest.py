"""Fixtures for the image and role tests: fdl's wheel with its dependencies, readable by testbed users."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import IN_CI, REPO, need_root_or_skip
from tests.integration.images import nspawn

BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    """fdl's wheel and every dependency as wheels, in a world-readable directory (a bake installs offline)."""
    path = Path(tempfile.mkdtemp(prefix="fdl-wheels-", dir="/tmp"))
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(path), str(REPO)],
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr
        os.chmod(path, 0o755)
        for wheel in path.iterdir():
            os.chmod(wheel, 0o644)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def fdl_wheel(wheelhouse: Path) -> Path:
    (wheel,) = wheelhouse.glob("fdl-*.whl")
    return wheel


def tool_env(home: Path, extra: dict | None = None) -> dict:
    """Environment for ansible, molecule and packer runs: this venv's tools first, a private home and cache."""
    env = dict(os.environ)
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
               ANSIBLE_NOCOLOR="1", NO_COLOR="1", ANSIBLE_FORCE_COLOR="0", PY_COLORS="0",
               ANSIBLE_HOST_KEY_CHECKING="true", ANSIBLE_RETRY_FILES_ENABLED="0")
    env.pop("ANSIBLE_CONFIG", None)
    env.update(extra or {})
    home.mkdir(parents=True, exist_ok=True)
    return env


def require_machines() -> None:
    """Booting a machine needs root and nspawn's tools: skip without them, fail under CI=true."""
    need_root_or_skip("systemd-nspawn boots a root file system and mounts overlays")
    missing = nspawn.missing_tools()
    if missing:
        reason = f"booting a worker image needs the Debian packages {', '.join(missing)} (scripts/apt-test.txt)"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
