"""The fdl_probe role reads `fdl_probe_devices` with the parser `fdl probe --devices` uses
(fdl.hostside.checks.devices): the same declaration means the same thing on every path, and one the command
line refuses fails the role's task with the same reason. Issue 38 item 13: "cpu:two" was accepted by the role
and the host judged as a GPU host.

The role runs from this checkout in place (its ansible.cfg), through real ansible-playbook, on this machine
over the local connection, as an Ansible user runs it; HOME is a temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_fdl

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def play(tmp_path: Path, devices: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """playbooks/probe.yml with fdl_probe_devices=devices on localhost; (the run, the probe task's result)."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"[fdl_workers]\nthis-box ansible_connection=local "
                         f"ansible_python_interpreter={sys.executable}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "FDL_", "XDG_"))}
    env.update(HOME=str(tmp_path), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", NO_COLOR="1",
               ANSIBLE_CALLBACK_RESULT_INDENTATION="0", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               FDL_LIBTORCH_FROM_PYTORCH="0")
    done = subprocess.run([str(BIN / "ansible-playbook"), "-v", "-i", str(inventory), "playbooks/probe.yml",
                           "-e", json.dumps({"fdl_probe_devices": devices, "fdl_probe_skip_mount": True,
                                             "fdl_probe_fail_on_error": False})],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    task = done.stdout.split("TASK [fdl_probe : Probe the GPUs", 1)[-1].split("TASK [", 1)[0]
    for line in task.splitlines():  # `ok: [this-box] => {...}` or `fatal: [this-box]: FAILED! => {...}`
        if line.startswith(("ok: [this-box] => {", "fatal: [this-box]: FAILED! => {")):
            return done, dict(json.loads(line.split(" => ", 1)[1]), failed=line.startswith("fatal:"))
    return done, None


def test_the_role_refuses_a_declaration_the_command_line_refuses_with_the_same_reason(tmp_path: Path) -> None:
    command_line = run_fdl("probe", "--devices", "cpu:two", cwd=tmp_path)
    assert command_line.returncode == 2
    reason = "'cpu:two': cpu:N needs N from 1 to 256"
    assert f"--devices {reason}" in command_line.stderr

    done, result = play(tmp_path, "cpu:two")
    assert done.returncode != 0, done.stdout[-3000:]
    assert result is not None and result.get("failed") is True, done.stdout[-3000:]
    assert f"local_devices (fdl_probe_devices) {reason}" in result["msg"]
    assert "GPU ids (0,1), all, or cpu:N for N CPU ranks" in result["msg"]
    assert "report" not in result  # the host was not judged at all, as a GPU host or otherwise


def test_the_role_judges_a_cpu_declaration_as_the_command_line_does(tmp_path: Path) -> None:
    done, result = play(tmp_path, "cpu:2")
    assert result is not None and "report" in result, done.stdout[-3000:] + done.stderr[-2000:]
    checks = {c["name"]: c for c in result["report"]["checks"]}
    assert checks["gpu"]["status"] == "skipped" and checks["gpu"]["data"] == {"cpu_host": True, "declared": "cpu:2"}
    local = json.loads(run_fdl("probe", "--devices", "cpu:2", "--skip-mount", "--json", cwd=tmp_path,
                               env={"HOME": str(tmp_path), "FDL_LIBTORCH_FROM_PYTORCH": "0"}).stdout)
    assert [c["status"] for c in local["checks"]] == [c["status"] for c in result["report"]["checks"]]
