"""`fdl join` takes its token out of its environment once read (fdl.agent.secrecy).

regression (issue 37, finding 7): the agent kept FDL_JOIN_TOKEN in os.environ for its whole life, and the value
stayed in its initial environment block, which /proc/<agent>/environ shows whatever os.environ says later.
Each check runs in a fresh interpreter started with the token in its environment, as `fdl join` is.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import fdl_env

TOKEN = "5ea1" * 16
CHILD = r'''
import ctypes, json, os, subprocess, sys
from fdl.agent.secrecy import seal
remains = seal()
with open("/proc/self/environ", "rb") as f:
    block = f.read().split(b"\0")
child = subprocess.run(["/usr/bin/env"], capture_output=True, text=True).stdout
print(json.dumps({
    "remains": remains,
    "in_os_environ": "FDL_JOIN_TOKEN" in os.environ,
    "proc_entries": [e.decode() for e in block if e.startswith(b"FDL_JOIN_TOKEN=")],
    "proc_holds_value": sys.argv[1].encode() in b"\0".join(block),
    "child_env": child,
    "dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0),
    "other_vars_intact": os.environ.get("KEEP_ME") == "yes" and b"KEEP_ME=yes" in block,
}))
'''


def run_sealed() -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, TOKEN], capture_output=True, text=True, timeout=60,
                          env=fdl_env({"FDL_JOIN_TOKEN": TOKEN, "KEEP_ME": "yes"}))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_token_leaves_the_environment_and_the_initial_block_that_proc_shows() -> None:
    seen = run_sealed()
    assert seen["remains"] == []
    assert not seen["in_os_environ"]
    assert seen["proc_entries"] == ["FDL_JOIN_TOKEN="]  # the name stays in the block; its value is gone
    assert not seen["proc_holds_value"]
    assert TOKEN not in seen["child_env"] and "FDL_JOIN_TOKEN" not in seen["child_env"]
    assert seen["other_vars_intact"]  # nothing else in the block was touched


def test_the_agent_is_closed_to_its_own_account() -> None:
    assert run_sealed()["dumpable"] == 0  # prctl(PR_GET_DUMPABLE): no /proc/<pid>/environ, mem or ptrace for peers
