"""pytest fixtures for the `fdl nccl` tests (import them by name into a test module)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.nccl import build_fake_nvml


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory) -> Path:
    """Directory holding a freshly compiled fake libnvidia-ml.so.1."""
    return build_fake_nvml(tmp_path_factory.mktemp("fdln10-nvml"))


@pytest.fixture
def nccl_project(tmp_path) -> Path:
    """A project whose libtorch variants bundle NCCL 2.26.2 and 2.27.5."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
    for variant, version in (("precompiled/cu126", "2.26.2"), ("precompiled/cu128", "2.27.5")):
        lib = root / "libtorch" / variant / "lib"
        lib.mkdir(parents=True)
        (lib / f"libnccl.so.{version}").write_bytes(b"\x7fELF")
        (lib / "libnccl.so.2").symlink_to(f"libnccl.so.{version}")
    return root

