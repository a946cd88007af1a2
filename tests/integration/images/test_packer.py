"""packer/worker.pkr.hcl: `packer validate`, and a real bake with the null builder against a testbed host.

Debian's packer 1.6 carries the ansible provisioner built in; the provisioner runs flodl.fdl's join_worker playbook
with this checkout's roles over real SSH, and the test then reads what landed on the host.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fdl import collection, resources
from tests.conftest import REPO
from tests.integration.images.conftest import tool_env

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


def docs_lines() -> list[str]:
    """docs/images.md's `packer validate` / `packer build` block, line by line (continuations joined)."""
    doc = (REPO / "docs" / "images.md").read_text()
    blocks = [block.split("```", 1)[0] for block in doc.split("```sh\n")[1:]]
    (block,) = [block for block in blocks if "packer build" in block]
    return block.replace("\\\n", " ").splitlines()


def clone_of_this_checkout(dest: Path) -> Path:
    """The checkout's files (tracked, and new ones git does not ignore; links as links), nothing built."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    for name in filter(None, files):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        if (REPO / name).is_symlink():
            os.symlink(os.readlink(REPO / name), dest / name)
        elif (REPO / name).is_file():
            shutil.copy2(REPO / name, dest / name)
    return dest


def test_the_docs_packer_lines_name_every_required_variable():
    """Each packer line of docs/images.md gives every variable the template requires (those without a default)."""
    template = TEMPLATE.read_text()
    required = [name for name, body in re.findall(r'variable "(\w+)" \{(.*?)\n\}', template, re.S)
                if "default" not in body]
    assert sorted(required) == ["collections", "join_vars", "ssh_host", "ssh_private_key_file"], required
    lines = [line for line in docs_lines() if line.startswith("packer ")]
    assert [line.split()[1] for line in lines] == ["validate", "build"], lines
    for line in lines:
        for name in required:
            assert f"-var {name}=" in line, f"docs/images.md: `{line.split()[1]}` lacks -var {name}=..."


@pytest.mark.slow
@pytest.mark.testbed(hosts=1)
def test_the_docs_packer_lines_run_as_written_and_bake_a_testbed_host(testbed, wheelhouse, short_tmp):
    """docs/images.md's block, run by bash in a copy of this checkout, with one edit the reader makes too: the
    machine to bake (host=...). The testbed host's port, user and known_hosts come as PKR_VAR_* (the doc names
    that way), and the login key sits where the block looks for it ($HOME/.ssh/id_ed25519). The null builder
    then bakes the worker onto the host: Packer's ansible provisioner runs flodl.fdl's join_worker playbook over
    real SSH."""
    host = testbed.hosts[0]
    root = f"{host.home}/baked"
    token = "fdlpackertoken" + "3c" * 12
    clone = clone_of_this_checkout(short_tmp / "clone")
    (clone / "worker-vars.yml").write_text(yaml.safe_dump({
        # the image's paths go under one directory of the host user's, so the bake needs no root; fdl's
        # dependencies come from the suite's wheelhouse (the host may not reach the index)
        "fdl_join_worker_pip_extra_args": ["--no-index", "--find-links", str(wheelhouse)],
        "fdl_join_worker_venv": f"{root}/opt/fdl", "fdl_join_worker_link": "",
        "fdl_join_worker_user": host.user, "fdl_join_worker_create_user": False,
        "fdl_join_worker_config_dir": f"{root}/var/lib/fdl-join",
        "fdl_join_worker_env_file": f"{root}/etc/fdl/join.env", "fdl_join_worker_env_file_owner": host.user,
        "fdl_join_worker_unit_dir": f"{root}/etc/systemd/system",
        "fdl_join_worker_controller": f"{testbed.gateway}:27137", "fdl_join_worker_devices": "cpu:2",
        "fdl_join_worker_token": token,
    }))
    home = short_tmp / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    shutil.copy(host.key, home / ".ssh" / "id_ed25519")
    os.chmod(home / ".ssh" / "id_ed25519", 0o600)
    lines = docs_lines()
    (assign,) = [i for i, line in enumerate(lines) if line.startswith("host=10.0.0.5 ")]
    lines[assign] = lines[assign].replace("host=10.0.0.5", f"host={host.address}", 1)
    env = tool_env(home, {"CHECKPOINT_DISABLE": "1", "PACKER_CACHE_DIR": str(home / "packer_cache"),
                          "PKR_VAR_ssh_port": str(host.port), "PKR_VAR_ssh_username": host.user,
                          "PKR_VAR_ssh_known_hosts": str(testbed.known_hosts), "PKR_VAR_become": "false"})
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(lines)], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=1200)
    out = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)  # packer colours its output, as written
    assert done.returncode == 0, out[-6000:]
    assert "Build 'null.worker' finished" in out
    assert token not in out
    wheel = clone / "dist" / f"fdl-{collection.version()}-py3-none-any.whl"
    assert wheel.is_file(), sorted(p.name for p in (clone / "dist").iterdir())  # the doc's wheel name holds

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
