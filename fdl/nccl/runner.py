"""Run a shipped playbook with ansible-runner (a stop-gap for fdl.nccl).

The shared driver, fdl/cluster/runner.py, is being written for the cluster
commands; once it is on main, `run_playbook` below should become a call to it
and this file should go. Until then it holds the few settings fdl relies on:
an absolute private data dir that is removed afterwards, fdl's own
ansible-playbook, the shipped roles on the roles path, live events.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fdl import resources
from fdl.errors import FdlError


@dataclass(frozen=True)
class RunOutcome:
    status: str  # successful | failed | canceled | timeout
    rc: int


def ansible_env() -> dict[str, str]:
    """Environment for ansible-playbook: this interpreter's tools first, fdl's roles on the roles path."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if (Path(bin_dir) / "ansible-playbook").exists() and bin_dir not in path.split(os.pathsep):
        path = os.pathsep.join(filter(None, [bin_dir, path]))
    return {
        "PATH": path,
        "ANSIBLE_ROLES_PATH": str(resources.roles_dir()),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "ANSIBLE_PIPELINING": "1",  # one ssh round trip per task instead of four
        "ANSIBLE_LOCALHOST_WARNING": "0",
        "ANSIBLE_DEPRECATION_WARNINGS": "0",
    }


def run_playbook(playbook: Path, *, inventory: dict, extravars: dict,
                 event_handler: Callable[[dict], bool] | None = None) -> RunOutcome:
    """Run one playbook over a dict inventory and report how it ended."""
    import ansible_runner  # noqa: PLC0415 - only the commands that drive Ansible pay for it

    env = ansible_env()
    if shutil.which("ansible-playbook", path=env["PATH"]) is None:
        raise FdlError("ansible-playbook is not installed next to fdl (it comes with the ansible-core "
                       "dependency), so the build cannot run.", hint="reinstall fdl: pip install --force-reinstall fdl")
    private = tempfile.mkdtemp(prefix="fdl-runner-")
    try:
        runner = ansible_runner.run(
            private_data_dir=os.path.abspath(private),
            playbook=str(playbook),
            inventory=inventory,
            extravars=extravars,
            envvars=env,
            event_handler=event_handler,
            quiet=True,
            settings={"pexpect_timeout": 0.2, "suppress_ansible_output": True},
        )
        return RunOutcome(status=str(runner.status), rc=int(runner.rc if runner.rc is not None else 1))
    finally:
        shutil.rmtree(private, ignore_errors=True)
