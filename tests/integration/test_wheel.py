"""A built wheel, installed away from the clone, still finds the shipped Ansible content."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_wheel_carries_playbooks_roles_templates_plugins(tmp_path: Path) -> None:
    wheel_dir = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir), str(REPO)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    (wheel,) = wheel_dir.glob("fdl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for kind in ("playbooks", "roles", "templates", "inventory_plugins", "packer"):
        assert any(n.startswith(f"fdl/_share/{kind}/") for n in names), kind
    assert "fdl/controller/page.html" in names  # the controller's status page (GET /)
    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                              str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr
    probe = ("import fdl.resources as r; print(r.share_dir()); print(r.PACKAGE_DIR); "
             "from fdl.controller.server import status_page; assert b'state.json' in status_page().body")
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    share, package = out.stdout.split()
    assert Path(package) == target / "fdl"
    assert Path(share) == target / "fdl" / "_share"
    assert (Path(share) / "playbooks").is_dir()
