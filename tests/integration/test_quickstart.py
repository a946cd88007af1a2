"""scripts/quickstart.sh run whole, as a new user runs it from a fresh clone, on this GPU-less machine: the
probe fails as a GPU host, passes as a CPU host with the shared data path skipped, the demo trains on two CPU
ranks, and the summary says what the probe left out (issue 38 item 11: it skipped the data path silently).

The clone is this checkout's files. Its scripts/install.sh is replaced by one that links the clone's .venv to
the environment running the tests (fdl, its dependencies and PyTorch already installed there): the installer
is the one part that fetches packages, and the quickstart's own steps run as they are.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fdl.hostside.paths import DEFAULT_DATA_PATH
from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    dest = tmp_path / "clone"
    for name in filter(None, files):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    installer = dest / "scripts" / "install.sh"
    installer.write_text(f"#!/bin/sh\n# the test's stand-in: fdl is installed already\n"
                         f"cd \"$(dirname \"$0\")/..\" && ln -sfn {sys.prefix} .venv\n")
    installer.chmod(0o755)
    return dest


def test_the_quickstart_summary_says_the_probe_skipped_the_data_path(clone: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")  # the demo's ranks run PyTorch (the test environment installs 2.13.0)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FDL_", "LIBTORCH", "CUDA_", "XDG_"))}
    env.update(HOME=str(home), FDL_LIBTORCH_FROM_PYTORCH="1")
    done = subprocess.run(["bash", "scripts/quickstart.sh"], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=600)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "== fdl probe --cpu --skip-mount" in out
    lines = out.strip().splitlines()
    assert lines[-1].startswith("quickstart: OK: both ranks agree on checksum")
    summary = "\n".join(lines[lines.index(next(line for line in lines if line.startswith("fdl is installed in"))):])
    assert "skipped the shared data path (--skip-mount)" in summary
    assert f"fdl probe checks {DEFAULT_DATA_PATH}" in summary and "--data-path /path/to/your/data" in summary
