"""scripts/build-collection says which Python it needs and fails in one paragraph, never with a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "build-collection"
NEEDS = "It needs Python 3.11 or newer with ansible-core and nvidia-ml-py"


def build(out: Path, python: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON"))}
    env["PYTHON"] = python
    return subprocess.run([str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=120)


def test_a_python_without_pynvml_is_named_with_what_to_install(tmp_path):
    """ansible-core is there, nvidia-ml-py is not (this interpreter without its site-packages)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    (bin_dir / "ansible-galaxy").symlink_to(Path(sys.executable).parent / "ansible-galaxy")
    done = build(tmp_path / "out", str(python))
    said = " ".join(done.stderr.split())
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "pynvml (the nvidia-ml-py package) is not installed" in said and "pip install nvidia-ml-py" in said
    assert NEEDS in said, said
    assert not list((tmp_path / "out").glob("*.tar.gz")) and done.stdout == ""


def test_a_missing_python_or_ansible_galaxy_is_named(tmp_path):
    done = build(tmp_path / "out", str(tmp_path / "no-such-python"))
    assert done.returncode == 1 and "no Python at" in done.stderr and NEEDS in " ".join(done.stderr.split())
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)  # fdl's Python, but no ansible-galaxy beside it or on PATH
    env_path = os.environ.get("PATH", "")
    try:
        os.environ["PATH"] = "/usr/bin:/bin"
        done = build(tmp_path / "out", str(bare / "python"))
    finally:
        os.environ["PATH"] = env_path
    assert done.returncode == 1 and "no ansible-galaxy" in done.stderr and "Traceback" not in done.stderr
