"""The suite runs with a home of its own run (tests/conftest.py): whatever fdl caches, remembers or records goes
there, never into the home of whoever runs the tests, nor into another clone's run on the same machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import TEST_CONTROLS, fdl_env, real_home

WHERE = """
import json
from pathlib import Path
from fdl.hostside.paths import cache_dir
from fdl.controller.live import state_dir
print(json.dumps({"cache": str(cache_dir()), "live": str(state_dir()), "home": str(Path.home())}))
"""


def test_fdl_keeps_nothing_in_the_real_home(tmp_path: Path) -> None:
    home = Path(os.environ["HOME"])
    assert home != real_home() and home.is_dir() and (home.parent.stat().st_mode & 0o777) == 0o700
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME"):
        assert Path(os.environ[name]).is_relative_to(home), name
    runtime = Path(os.environ["XDG_RUNTIME_DIR"])
    assert runtime.stat().st_uid == os.getuid() and (runtime.stat().st_mode & 0o777) == 0o700
    done = subprocess.run([sys.executable, "-c", WHERE], env=fdl_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    paths = {key: Path(value) for key, value in json.loads(done.stdout).items()}
    assert paths["home"] == home and paths["cache"].is_relative_to(home) and paths["live"].is_relative_to(runtime)
    leftovers = [name for name in os.environ if name.startswith("FDL_") and not name.startswith(TEST_CONTROLS)]
    assert leftovers == []  # the caller's FDL_PORT, FDL_ENV, ... reach no test
