"""pytest fixtures for the `fdl nccl` tests (import them by name into a test module)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes import make_libtorch


@pytest.fixture
def nccl_project(tmp_path) -> Path:
    """A project whose libtorch variants bundle NCCL 2.26.2 and 2.27.5 (loadable fakes, ncclGetVersion)."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
    make_libtorch(root / "libtorch", "precompiled/cu126", cuda="12.6", nccl="2.26.2")
    make_libtorch(root / "libtorch", "precompiled/cu128", nccl="2.27.5")
    return root
