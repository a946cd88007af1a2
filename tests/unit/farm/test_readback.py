"""What join-config generates is read back and checked before it is written (issue 36, finding 1 and Deliver 1):
a render that loses a key, comments one out or changes one fails the wizard, never a worker at boot."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from fdl.errors import FdlError
from fdl.farm import readback
from tests.conftest import IN_CI

JOIN = {"controller": "127.0.0.1:1337", "ssh": "op@10.0.0.1:2222", "identity": "/etc/fdl/b300/key",
        "known_hosts": "/etc/fdl/b300/known_hosts", "token_file": "/etc/fdl/b300/token",
        "source": "rsync://op@10.0.0.1:2222:/tree", "persist": True}
MARKER = {"door": "b", "served": "/home/op/.flodl/run"}
GOOD = """\
# Worker side of farm b300
# fdl-farm-shape: door=b served=/home/op/.flodl/run
join:
  controller: 127.0.0.1:1337
  ssh: op@10.0.0.1:2222
  identity: /etc/fdl/b300/key
  known_hosts: /etc/fdl/b300/known_hosts
  token_file: /etc/fdl/b300/token
  source: rsync://op@10.0.0.1:2222:/tree
  persist: true
"""
# What templates/farm/worker.yml.j2 rendered on main (issue 36, finding 1): trim_blocks ate the newline after
# the ssh: line's `{% endif %}`, so identity: sat in that line's comment.
BROKEN = GOOD.replace("  ssh: op@10.0.0.1:2222\n  identity: /etc/fdl/b300/key\n",
                      "  ssh: op@10.0.0.1:2222  # the door on the controller box  identity: /etc/fdl/b300/key\n")


def refused(excinfo: pytest.ExceptionInfo[FdlError]) -> str:
    assert excinfo.value.exit_code == 1 and "Nothing was written" in excinfo.value.message
    return excinfo.value.message


def test_a_good_worker_yml_reads_back():
    readback.check_worker_yml(GOOD, JOIN, MARKER)


def test_the_identity_commented_into_the_ssh_line_is_caught():
    with pytest.raises(FdlError, match=r"join\.identity missing \(lost or commented out\)") as excinfo:
        readback.check_worker_yml(BROKEN, JOIN, MARKER)
    refused(excinfo)


@pytest.mark.parametrize("edit, says", [
    (lambda t: t.replace("  known_hosts: /etc/fdl/b300/known_hosts\n", ""), "join.known_hosts missing"),
    (lambda t: t.replace("  token_file:", "  # token_file:"), "join.token_file missing"),
    (lambda t: t.replace("persist: true", "persist: 'yes'"), "expected true or false"),
    (lambda t: t.replace("127.0.0.1:1337", "127.0.0.1:1338"), "join.controller reads back as"),
    (lambda t: t + "  host: extra\n", "join.host not meant to be there"),
    (lambda t: t + "  devicez: all\n", "unknown key 'join.devicez'"),
    (lambda t: t + "publish: {bin: x}\n", "not just join:"),
    (lambda t: t.replace("# fdl-farm-shape: door=b", "# fdl-farm-shape: door=a"), "fdl-farm-shape line"),
    (lambda t: t.replace("join:\n", "join:\n  - x\n", 1), "invalid YAML"),
])
def test_each_way_a_render_can_go_wrong_is_refused(edit, says):
    with pytest.raises(FdlError, match=says) as excinfo:
        readback.check_worker_yml(edit(GOOD), JOIN, MARKER)
    refused(excinfo)


def _cloud_init(fdl_yml: str = GOOD, key: str = "-----BEGIN KEY-----\nAAAA\n-----END KEY-----\n") -> tuple[str, dict]:
    files = {"/etc/fdl/b300/key": readback.CloudFile(key, "0600", "flodl:flodl", defer=True),
             "/etc/fdl/b300/fdl.yml": readback.CloudFile(fdl_yml, "0600", "flodl:flodl", defer=True),
             "/etc/systemd/system/flodl-join.service": readback.CloudFile("[Unit]\nDescription=x\n", "0644")}
    doc = {"users": ["default", {"name": "flodl"}],
           "write_files": [{"path": path, "permissions": f.permissions, **({"owner": f.owner} if f.owner else {}),
                            **({"defer": True} if f.defer else {}), "content": f.content}
                           for path, f in files.items()],
           "runcmd": [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", "flodl-join.service"]]}
    return "#cloud-config\n" + yaml.safe_dump(doc, sort_keys=False), files


def test_good_user_data_reads_back():
    text, files = _cloud_init()
    readback.check_cloud_init(text, files, "flodl", "flodl-join.service")


@pytest.mark.parametrize("edit, says", [
    (lambda t: t.replace("#cloud-config\n", "# cloud-config\n"), "not #cloud-config"),
    (lambda t: t.replace("name: flodl", "name: other"), "does not create the agent's account"),
    (lambda t: t.replace("path: /etc/fdl/b300/key", "path: /etc/fdl/b300/id"), "write_files lacks"),
    (lambda t: t.replace("identity: /etc/fdl/b300/key", "identity: /etc/fdl/b300/kee"), "not the rendered file"),
    (lambda t: t.replace("permissions: '0600'", "permissions: '0644'", 1), "mode 0644"),
    (lambda t: t.replace("--now", "--later"), "does not enable and start"),
])
def test_user_data_that_lost_or_changed_a_file_is_refused(edit, says):
    text, files = _cloud_init()
    with pytest.raises(FdlError, match=says) as excinfo:
        readback.check_cloud_init(edit(text), files, "flodl", "flodl-join.service")
    refused(excinfo)


def test_cloud_inits_own_schema_judges_the_user_data_and_no_secret_is_shown(tmp_path):
    """With cloud-init installed (scripts/apt-test.txt; under CI=true it must be), its own schema refuses
    user-data that fdl's checks alone would pass, and what it says is shown without the secrets."""
    if shutil.which("cloud-init") is None:
        if IN_CI:
            pytest.fail("cloud-init is not installed (scripts/apt-test.txt lists it)")
        pytest.skip("cloud-init is not installed")
    text, files = _cloud_init(key="-----BEGIN KEY-----\nSECRETSECRETSECRET\n-----END KEY-----\n")
    assert readback.cloud_init_schema(text) is None
    bad = text + "ntp: {enabled: maybe}\nwrite_files_extra: SECRETSECRETSECRET\n"
    said = readback.cloud_init_schema(bad, secrets=("SECRETSECRETSECRET",))
    assert said is not None and "SECRETSECRETSECRET" not in said
    with pytest.raises(FdlError, match="cloud-init's own schema refuses it"):
        readback.check_cloud_init(bad, files, "flodl", "flodl-join.service")


def test_the_drop_in_reads_back_as_sshd_reads_it():
    text = "# c\nPort 2222\n\nMatch LocalPort 2222\n    PermitTTY no\n"
    readback.check_dropin(text, 2222, [2222], None)
    with pytest.raises(FdlError, match="Port lines read back as"):
        readback.check_dropin(text.replace("Port 2222", "# Port 2222"), 2222, [2222], None)
    with pytest.raises(FdlError, match="Match blocks read back as"):
        readback.check_dropin(text, 2222, [2222], "fdl-b300")


def test_known_hosts_overlay_and_selftest_read_back(tmp_path: Path):
    readback.check_known_hosts("[h]:2222 ssh-ed25519 AAAA\n", ["[h]:2222 ssh-ed25519 AAAA"])
    with pytest.raises(FdlError, match="not the door's host keys"):
        readback.check_known_hosts("", ["[h]:2222 ssh-ed25519 AAAA"])
    overlay = "cluster:\n  controller:\n    host: 10.0.0.1\n    join: {token_file: .fdl/b300/token}\n"
    readback.check_overlay(overlay, ".fdl/b300/token", "10.0.0.1", 1337, "fdl.b300.yml")
    with pytest.raises(FdlError, match="token_file is not"):
        literal = overlay.replace("token_file: .fdl/b300/token", "token: 5f0c1e8a9b2d4c6e8f0a1b3c5d7e9f1a")
        readback.check_overlay(literal, ".fdl/b300/token", "10.0.0.1", 1337, "fdl.b300.yml")
    readback.check_selftest("#!/bin/sh\necho ok\n")
    with pytest.raises(FdlError, match="sh -n refuses it"):
        readback.check_selftest("if then fi\n")
