"""packer/worker.pkr.hcl: `packer validate`, and a real bake with the null builder against a testbed host.

Debian's packer 1.6 carries the ansible provisioner built in; the provisioner runs flodl.fdl's join_worker playbook
with this checkout's roles over real SSH, and the test then reads what landed on the host.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fdl import resources
from tests.conftest import REPO
from tests.integration.images.conftest import fdl_wheel, tool_env

TEMPLATE = REPO / "packer" / "worker.pkr.hcl"


def packer(*args: str, home: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    exe = shutil.which("packer")
    if exe is None:
        pytest.fail("packer is needed (Debian package packer, in scripts/apt-test.txt)")
    env = tool_env(home, {"CHECKPOINT_DISABLE": "1", "PACKER_CACHE_DIR": str(home / "packer_cache")})
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=home)


def test_packer_validates_the_template_and_names_missing_variables(tmp_path):
    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    join_vars = tmp_path / "join.yml"
    join_vars.write_text("fdl_join_worker_controller: 10.0.0.1:1337\n")
    done = packer("validate", "-var", "ssh_host=10.0.0.5", "-var", f"ssh_private_key_file={key}",
                  "-var", f"join_vars={join_vars}", "-var", f"collections={resources.collections_path()}",
                  str(TEMPLATE), home=tmp_path / "home")
    assert done.returncode == 0, done.stdout + done.stderr
    bare = packer("validate", str(TEMPLATE), home=tmp_path / "home")
    assert bare.returncode == 1
    for name in ("ssh_host", "ssh_private_key_file", "join_vars", "collections"):
        assert f'Unset variable "{name}"' in bare.stdout + bare.stderr


@pytest.mark.slow
@pytest.mark.testbed(hosts=1)
def test_null_builder_bakes_the_worker_onto_a_testbed_host(testbed, wheelhouse, short_tmp):
    host = testbed.hosts[0]
    root = f"{host.home}/baked"
    token = "fdlpackertoken" + "3c" * 12
    join_vars = short_tmp / "join.yml"
    join_vars.write_text(yaml.safe_dump({
        # the image's paths go under one directory of the host user's, so the bake needs no root
        "fdl_join_worker_pip_extra_args": ["--no-index", "--find-links", str(wheelhouse)],
        "fdl_join_worker_venv": f"{root}/opt/fdl", "fdl_join_worker_link": "",
        "fdl_join_worker_user": host.user, "fdl_join_worker_create_user": False,
        "fdl_join_worker_config_dir": f"{root}/var/lib/fdl-join",
        "fdl_join_worker_env_file": f"{root}/etc/fdl/join.env", "fdl_join_worker_env_file_owner": host.user,
        "fdl_join_worker_unit_dir": f"{root}/etc/systemd/system",
        "fdl_join_worker_controller": f"{testbed.gateway}:27137", "fdl_join_worker_devices": "cpu:2",
        "fdl_join_worker_token": token,
    }))
    done = packer("build", "-color=false", "-var", f"ssh_host={host.address}", "-var", f"ssh_port={host.port}",
                  "-var", f"ssh_username={host.user}", "-var", f"ssh_private_key_file={host.key}",
                  "-var", f"ssh_known_hosts={testbed.known_hosts}", "-var", "become=false",
                  "-var", f"join_vars={join_vars}", "-var", f"collections={resources.collections_path()}",
                  "-var", f"fdl_wheel={fdl_wheel(wheelhouse)}", str(TEMPLATE), home=short_tmp / "home")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "Build 'null.worker' finished" in out
    assert token not in out

    # what landed, read on the host over SSH
    unit = f"{root}/etc/systemd/system/flodl-join.service"
    join = yaml.safe_load(host.ssh(f"cat {root}/var/lib/fdl-join/fdl.yml").stdout)["join"]
    assert join == {"controller": f"{testbed.gateway}:27137", "devices": "cpu:2", "persist": True}
    modes = host.ssh(f"stat -c '%a %U' {root}/var/lib/fdl-join/fdl.yml {root}/etc/fdl/join.env {unit}").stdout
    assert modes.split("\n")[:3] == [f"600 {host.user}", f"600 {host.user}", f"644 {host.user}"]
    text = host.ssh(f"cat {unit}").stdout
    assert f"ExecStart={root}/opt/fdl/bin/fdl join --persist\n" in text
    assert "RestartPreventExitStatus=2\n" in text and "systemctl --no-block poweroff; fi'\n" in text
    verify = host.ssh(f"systemd-analyze verify {unit}", check=False)
    assert verify.returncode == 0 and "flodl-join.service" not in verify.stderr, verify.stderr
    enabled = host.ssh(f"systemctl --root={root} is-enabled flodl-join.service", check=False)
    assert enabled.stdout.strip() == "enabled", enabled.stdout + enabled.stderr
    # started nowhere: an image build never starts the unit
    assert re.search(r"Enable and start the unit through the running systemd\] \**\n.*skipping: \[default\]", out)
    assert not host.ssh(f"pgrep -u {host.user} -f '[f]dl join --persist'", check=False).stdout.strip()
