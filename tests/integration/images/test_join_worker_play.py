"""The flodl.fdl.join_worker playbook straight from ansible-playbook against a testbed host: the index install path,
and the refusals a user meets (each names what was wrong, and nothing is written)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from fdl import resources
from tests.conftest import REPO
from tests.integration.images.conftest import BIN, tool_env

pytestmark = [pytest.mark.testbed(hosts=1), pytest.mark.slow]
PLAYBOOK = "flodl.fdl.join_worker"  # the collection playbook, from the collection fdl runs


class Play:
    def __init__(self, testbed, wheelhouse: Path, tmp: Path):
        self.host = testbed.hosts[0]
        self.tmp = tmp
        self.root = f"{self.host.home}/play"
        self.inventory = tmp / "hosts.yml"
        self.inventory.write_text(yaml.safe_dump({"all": {"hosts": {"w1": {
            "ansible_host": self.host.address, "ansible_port": self.host.port, "ansible_user": self.host.user,
            "ansible_ssh_private_key_file": str(self.host.key),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={testbed.known_hosts}"}}}}))
        self.base = {
            "fdl_join_worker_install_from": "index", "fdl_join_worker_package": "fdl==0.1.0",
            "fdl_join_worker_pip_extra_args": ["--no-index", "--find-links", str(wheelhouse)],
            "fdl_join_worker_venv": f"{self.root}/opt/fdl", "fdl_join_worker_link": "",
            "fdl_join_worker_user": self.host.user, "fdl_join_worker_create_user": False,
            "fdl_join_worker_config_dir": f"{self.root}/var/lib/fdl-join",
            "fdl_join_worker_env_file": f"{self.root}/etc/fdl/join.env",
            "fdl_join_worker_env_file_owner": self.host.user,
            "fdl_join_worker_unit_dir": f"{self.root}/etc/systemd/system",
            "fdl_join_worker_controller": f"{testbed.gateway}:27137", "fdl_join_worker_start": False,
        }

    def run(self, **changes) -> tuple[int, str]:
        variables = {k: v for k, v in {**self.base, **changes}.items() if v is not None}
        extra = self.tmp / "vars.json"
        extra.write_text(json.dumps(variables))
        env = tool_env(self.tmp / "home", {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                                           "ANSIBLE_COLLECTIONS_PATH": str(resources.collections_path())})
        done = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(self.inventory), str(PLAYBOOK),
                               "-e", f"@{extra}"], capture_output=True, text=True, env=env, timeout=600)
        return done.returncode, done.stdout + done.stderr

    def exists(self, path: str) -> bool:
        return self.host.ssh(f"test -e {self.root}/{path}", check=False).returncode == 0


@pytest.fixture
def play(testbed, wheelhouse, short_tmp):
    p = Play(testbed, wheelhouse, short_tmp)
    yield p
    testbed.hosts[0].ssh(f"rm -rf {p.root}", check=False)


def test_refusals_name_the_problem_and_write_nothing(play):
    rc, out = play.run(fdl_join_worker_start=True)
    assert rc == 2 and "systemd is not running on w1" in out and "fdl_join_worker_start: false" in out, out
    rc, out = play.run(fdl_join_worker_controller=None)
    assert rc == 2 and "fdl_join_worker_controller is required" in out, out
    rc, out = play.run(fdl_join_worker_join_extra={"token": "leak"}, fdl_join_worker_token="hunter2secret")
    assert rc == 2 and "fdl_join_worker_join_extra carries token" in out and "hunter2secret" not in out, out
    rc, out = play.run(fdl_join_worker_install_from="wheel")
    assert rc == 2 and "fdl_join_worker_wheel is empty" in out, out
    rc, out = play.run(fdl_join_worker_config_dir="var/lib/fdl-join")
    assert rc == 2 and "must be absolute: var/lib/fdl-join" in out, out
    # regression: a Python without venv (Debian's python3 lacks python3-venv) failed later, inside pip's task
    rc, out = play.run(fdl_join_worker_python="/bin/false")
    assert rc == 2 and "/bin/false on w1 cannot create fdl's virtualenv" in out and "python3-venv" in out, out
    rc, out = play.run(fdl_join_worker_probe_timer=True, fdl_join_worker_probe_interval_s=5)
    assert rc == 2 and "fdl_join_worker_probe_interval_s of 10 or more (got 5)" in out, out
    rc, out = play.run(fdl_join_worker_install_from="tarball")
    assert rc == 2 and "fdl_join_worker_install_from" in out and "wheel, index" in out, out  # argument specs
    assert not play.exists("")


def test_index_install_and_a_join_block_fdl_rejects_never_lands(play):
    rc, out = play.run(fdl_join_worker_devices="cpu:2")
    assert rc == 0, out
    config = "var/lib/fdl-join/fdl.yml"
    before = play.host.ssh(f"cat {play.root}/{config}").stdout
    assert yaml.safe_load(before)["join"]["devices"] == "cpu:2"
    assert play.host.ssh(f"{play.root}/opt/fdl/bin/fdl --version").stdout.strip().endswith("0.1.0")

    rc, out = play.run(fdl_join_worker_devices="gpu-zero")
    assert rc == 2, out
    assert "join.devices" in out and "expected GPU ids" in out, out  # fdl's own message, from the validation
    assert play.host.ssh(f"cat {play.root}/{config}").stdout == before
