"""molecule scenarios (molecule/*) against testbed hosts over real SSH: converge, idempotence, verify.

The default driver creates nothing: the testbed is the machine. Each scenario's inventory names one host
of the module's testbed, with the paths and inputs its converge and verify read. The scenarios run the
roles in place, from this clone (its ansible.cfg: roles/, and the clone as flodl.fdl through
ansible_collections/), as `molecule test -s NAME` does on its own (tests/integration/images/test_molecule_alone.py).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.integration.images.conftest import BIN, fdl_wheel, tool_env

pytestmark = [pytest.mark.testbed(hosts=2), pytest.mark.slow]
ANSI = re.compile(r"\x1b\[[0-9;]*m|\x1b\]8;;[^\x1b]*\x1b\\")


def host_vars(host, **extra) -> dict:
    return {"ansible_host": host.address, "ansible_port": host.port, "ansible_user": host.user,
            "ansible_ssh_private_key_file": str(host.key), "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={host.bed.known_hosts}", **extra}


def molecule(scenario: str, inventory: dict, tmp: Path,
             steps: tuple[str, ...] = ("converge", "idempotence", "verify")) -> str:
    path = tmp / "inventory.yml"
    path.write_text(yaml.safe_dump(inventory))
    env = tool_env(tmp / "home", {"FDL_MOLECULE_INVENTORY": str(path)})
    done = subprocess.run([str(BIN / "molecule"), "test", "-s", scenario], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    out = ANSI.sub("", done.stdout + done.stderr)
    at = out.find("fatal:") if "fatal:" in out else len(out)
    assert done.returncode == 0, out[max(0, at - 2000):at + 4000] + "\n...\n" + out[-3000:]
    for step in steps:
        done_line = rf"{scenario} (?:➜|>) {step}: Executed: Successful"
        assert re.search(done_line, out), f"{step} did not run:\n{out[-4000:]}"
    return out


def test_join_worker_bakes_a_worker_that_systemd_and_fdl_accept(testbed, wheelhouse, short_tmp):
    host = testbed.hosts[0]
    token = "fdlmoleculetoken" + "7f" * 12
    inventory = {"all": {"children": {"workers": {"hosts": {"worker": host_vars(
        host, fdl_molecule_root=f"{host.home}/image", fdl_molecule_wheel=str(fdl_wheel(wheelhouse)),
        fdl_molecule_wheelhouse=str(wheelhouse), fdl_molecule_key=str(host.key), fdl_molecule_token=token,
        fdl_molecule_door=f"{testbed.gateway}:27222")}}}}}
    out = molecule("fdl_join_worker", inventory, short_tmp)
    assert token not in out  # no_log on every task that handles it
    assert not Path(f"{host.home}/image").exists()  # destroy removed the image root


def test_join_door_opens_a_door_sshd_confines(testbed, short_tmp):
    host = testbed.hosts[1]
    key = short_tmp / "farm"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "farm", "-f", str(key)], check=True)
    inventory = {"all": {"children": {"doors": {"hosts": {"door": host_vars(
        host, fdl_molecule_root=f"{host.home}/door", fdl_molecule_sshd_port=27022, fdl_molecule_door_port=27222,
        fdl_molecule_controller_port=27137,
        fdl_molecule_public_key=(short_tmp / "farm.pub").read_text().strip())}}}}}
    out = molecule("fdl_join_door", inventory, short_tmp)
    assert "RUNNING HANDLER [fdl_join_door : Reload sshd with the configured command]" in out
    assert not Path(f"{host.home}/door").exists()
    left = host.ssh(f"pgrep -u {host.user} -f '[s]shd -f {host.home}/door/'", check=False)
    assert left.returncode == 1, f"destroy left the scenario's sshd running: {left.stdout}"


def test_probe_reports_on_a_host_and_changes_nothing(testbed, short_tmp):
    """The testbed host has no GPU: the report must say so, and fail the task only when asked to."""
    host = testbed.hosts[0]
    inventory = {"all": {"children": {"workers": {"hosts": {"h1": host_vars(
        host, fdl_molecule_storage=str(testbed.storage), fdl_molecule_plain=str(host.home))}}}}}
    out = molecule("fdl_probe", inventory, short_tmp)
    assert "Check the failure is the host's verdict, naming the failing checks" in out  # the branch for errors
    assert re.search(r'"msg": "h1: NOT READY \(\d+ errors?\): gpu: ', out), out[-3000:]  # the verdict line


def test_nccl_builds_through_a_docker_stand_in(testbed, short_tmp):
    """Docker stand-in (tests/fakes/docker_standin.py): there is no Docker engine on these machines."""
    host = testbed.hosts[1]
    docker = testbed.shared / "fdlmol-bin" / "docker"
    docker.parent.mkdir(exist_ok=True)
    docker.write_text("#!/usr/bin/python3\n" + (REPO / "tests" / "fakes" / "docker_standin.py").read_text())
    docker.chmod(0o755)
    docker.parent.chmod(0o755)
    inventory = {"all": {"children": {"buildboxes": {"hosts": {"buildbox": host_vars(
        host, fdl_molecule_root=f"{host.home}/nccl", fdl_molecule_docker=str(docker))}}}}}
    molecule("fdl_nccl", inventory, short_tmp, steps=("converge", "side_effect", "verify"))
    assert not Path(f"{host.home}/nccl").exists()


def test_dispatch_stages_a_run_the_supervisor_then_runs(testbed, short_tmp):
    host = testbed.hosts[0]
    program = short_tmp / "train.sh"
    program.write_text('#!/bin/sh\necho "rank $RANK of $WORLD_SIZE epochs=$2"\n')
    program.chmod(0o755)
    rsh = " ".join(host.ssh_argv()[:-1])  # ssh with the testbed's key and known hosts, without user@address
    inventory = {"all": {"children": {"nodes": {"hosts": {"node-a": host_vars(
        host, fdl_molecule_root=f"{host.home}/launch", fdl_molecule_artifact=str(program),
        fdl_molecule_artifact_sha256=hashlib.sha256(program.read_bytes()).hexdigest(),
        fdl_molecule_rsh=rsh)}}}}}
    out = molecule("fdl_dispatch", inventory, short_tmp)
    assert "Ship the binary with rsync, sending only what changed" in out
    assert not Path(f"{host.home}/launch").exists()


def test_prebuild_builds_per_host_on_the_launching_machine(short_tmp):
    """No testbed: the builds run here, one per roster host (local connection)."""
    project = short_tmp / "project"
    project.mkdir()
    inventory = {"all": {"children": {"roster": {"hosts": {
        "node-a": {"fdl_arch": "precompiled/cu128", "fdl_molecule_project": str(project)},
        "node-b": {"fdl_arch": "builds/sm61", "fdl_molecule_project": str(project)}}}}}}
    molecule("fdl_prebuild", inventory, short_tmp, steps=("converge", "side_effect", "verify"))
    assert sorted(p.name for p in project.iterdir()) == []  # destroy removed the outputs
