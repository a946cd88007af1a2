"""Shared test helpers: run the real `fdl` entry point as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI") == "true"

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
    done = subprocess.run([str(galaxy), "collection", "install", "--offline", "-p", str(collections), str(tarball)],
                          capture_output=True, text=True, env=env, timeout=300)
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
