"""main() pauses the cyclic garbage collector for brief commands only, and leaves it as it found it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import fdl_env

# fdl.cli.main imports typer, whose import warns under this click: run it in its own interpreter.
SCRIPT = """
import gc
import fdl.cli.probe
from fdl.cli.context import collector_paused, resume_collector
from fdl.cli.main import main

seen = []
fdl.cli.probe.collect_reports = lambda options: seen.append(gc.isenabled()) or []
assert gc.isenabled()
assert main(["probe", "--json"]) == 0
print("@@ local probe ran with the collector on:", seen, "| on afterwards:", gc.isenabled())

with collector_paused():
    paused = gc.isenabled()
    resume_collector()
    resumed = gc.isenabled()
print("@@ paused:", paused, "| resumed:", resumed, "| after:", gc.isenabled())

gc.disable()
with collector_paused():
    resume_collector()
    resumed = gc.isenabled()
assert main(["--help"]) == 0
print("@@ caller had it off: resumed:", resumed, "| after main:", gc.isenabled())
"""


def test_brief_commands_pause_the_collector_and_every_caller_gets_its_state_back(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=fdl_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line[3:] for line in done.stdout.splitlines() if line.startswith("@@ ")]
    assert lines == [
        "local probe ran with the collector on: [False] | on afterwards: True",
        "paused: False | resumed: True | after: True",
        "caller had it off: resumed: False | after main: False",
    ], done.stdout
