"""The fdl_join_door role through ansible-playbook, against localhost and a real loopback sshd.

Every path the role writes is pointed into the test's own directory (the
sshd_config.d/ its sshd Includes, its AuthorizedKeysFile), and the handler
reloads that sshd with SIGHUP: the machine's /etc/ssh is never touched.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fdl import resources
from tests.conftest import need_root_or_skip
from tests.farm_render import rendered_dropin
from tests.integration.loopback_sshd import Listener, LoopbackSshd, free_ports

pytestmark = pytest.mark.slow
PLAYBOOK = "flodl.fdl.join_door"  # the collection playbook, from the collection fdl runs
FOREIGN = (b"# operator's keys, by hand\r\n"
           b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIForeignForeignForeignForeignForeignForeig01 me@laptop\r\n"
           b"   \r\n"
           b'command="echo \\"a b\\"",no-pty ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ== ci  \r\n'
           b"#last line, no newline")


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fdl-farm-lab", "-f", str(path)],
                   check=True)
    return (path.parent / (path.name + ".pub")).read_text().strip()


class Play:
    def __init__(self, sshd: LoopbackSshd, door_port: int, controller_port: int):
        self.sshd = sshd
        self.door_port = door_port
        self.controller_port = controller_port
        self.inventory = sshd.base / "inventory.yml"
        self.inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))

    def vars(self, public_key: str, **extra) -> dict:
        base = {
            "fdl_join_door_label": "lab", "fdl_join_door_door": "tunnel-only",
            "fdl_join_door_port": self.door_port, "fdl_join_door_controller_port": self.controller_port,
            "fdl_join_door_public_key": public_key,
            "fdl_join_door_authorized_keys": str(self.sshd.authorized_keys),
            "fdl_join_door_sshd_config": str(self.sshd.config),
            "fdl_join_door_sshd_config_dir": str(self.sshd.dropins),
            "fdl_join_door_reload_command": f"kill -HUP {self.sshd.pid()}",
        }
        base.update(extra)
        return base

    def run(self, variables: dict) -> tuple[int, dict, str]:
        extra = self.sshd.base / "vars.json"
        extra.write_text(json.dumps(variables))
        env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_RETRY_FILES_ENABLED="0",
                   ANSIBLE_HOST_KEY_CHECKING="false", ANSIBLE_STDOUT_CALLBACK="default",
                   ANSIBLE_COLLECTIONS_PATH=str(resources.collections_path()))
        done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(self.inventory),
                               str(PLAYBOOK), "-e", f"@{extra}"], capture_output=True, text=True, env=env,
                              timeout=300)
        recap = re.search(r"localhost\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", done.stdout)
        names = ("ok", "changed", "unreachable", "failed")
        counts = dict(zip(names, map(int, recap.groups()), strict=True)) if recap else {}
        return done.returncode, counts, done.stdout + done.stderr


@pytest.fixture
def play():
    need_root_or_skip("runs its own sshd on loopback")
    sshd = LoopbackSshd()
    listener = None
    try:
        sshd.start()
        door_port, controller_port = free_ports(2, taken={sshd.port})
        listener = Listener(controller_port)
        sshd.authorized_keys.write_bytes(FOREIGN)
        os.chmod(sshd.authorized_keys, 0o600)
        yield Play(sshd, door_port, controller_port)
    finally:
        if listener:
            listener.close()
        sshd.stop()


def test_role_installs_the_door_reloads_sshd_and_keeps_foreign_lines(play, tmp_path):
    key = tmp_path / "key"
    public = _keygen(key)
    rc, counts, out = play.run(play.vars(public))
    assert rc == 0 and counts["failed"] == 0, out
    assert "RUNNING HANDLER" in out and "Reload sshd with the configured command" in out
    installed = (play.sshd.dropins / "01-fdl-lab.conf").read_text()

    # the same drop-in the wizard renders, header aside
    wizard = rendered_dropin("tunnel-only", label="lab", door_port=play.door_port,
                             controller_port=play.controller_port, explicit_ports=[play.sshd.port])
    strip = lambda text: text.split("#\n", 2)[2]  # noqa: E731 - drop the '# managed' frame
    assert strip(installed) == strip(wizard)

    # foreign lines byte for byte; ours appended after the last line gained its CRLF
    data = play.sshd.authorized_keys.read_bytes()
    assert data.startswith(FOREIGN + b"\r\n")
    assert data[len(FOREIGN) + 2:].endswith(b" fdl-farm-lab\r\n") and data.count(b"fdl-farm-lab") == 1

    # the reloaded sshd serves the door
    play.sshd.wait_listening([play.door_port])
    fwd = play.sshd.ssh(key, play.door_port, "-W", f"127.0.0.1:{play.controller_port}", "127.0.0.1")
    assert fwd.returncode == 0 and fwd.stdout == "fdl-controller-hello\n", fwd.stderr
    shell = play.sshd.ssh(key, play.door_port, "127.0.0.1", "echo ran")
    assert "ran" not in shell.stdout and shell.returncode not in (0, 255)

    # idempotent: nothing changes, no reload
    rc, counts, out = play.run(play.vars(public))
    assert rc == 0 and counts["changed"] == 0, out
    assert play.sshd.authorized_keys.read_bytes() == data


def test_role_rotation_replaces_the_old_line_in_place(play, tmp_path):
    old_pub = _keygen(tmp_path / "old")
    new_pub = _keygen(tmp_path / "new")
    assert play.run(play.vars(old_pub, fdl_join_door_door="b", fdl_join_door_served=str(play.sshd.base)))[0] == 0
    play.sshd.authorized_keys.write_bytes(play.sshd.authorized_keys.read_bytes() + b"# added later\r\n")
    rc, _, out = play.run(play.vars(new_pub, fdl_join_door_door="b", fdl_join_door_served=str(play.sshd.base),
                                    fdl_join_door_retired_keys=[old_pub]))
    assert rc == 0, out
    lines = play.sshd.authorized_keys.read_bytes().split(b"\r\n")
    assert old_pub.split()[1].encode() not in b"".join(lines)
    assert lines[-3].endswith(new_pub.split()[1].encode() + b" fdl-farm-lab")
    assert lines[-2] == b"# added later" and lines[-1] == b""
    assert b"exec /usr/bin/rrsync -ro -munge " + str(play.sshd.base).encode() + b"'\"" in lines[-3]
    old = tmp_path / "old"
    refused = play.sshd.ssh(old, play.door_port, "-W", f"127.0.0.1:{play.controller_port}", "127.0.0.1")
    assert refused.returncode == 255 and "Permission denied" in refused.stderr


def test_with_the_wizards_header_the_installed_dropin_is_its_review_copy_byte_for_byte(play, tmp_path):
    from fdl.farm.render import DROPIN_MANAGED

    public = _keygen(tmp_path / "key")
    rc, _, out = play.run(play.vars(public, fdl_join_door_managed=DROPIN_MANAGED))
    assert rc == 0, out
    # the review copy is the role's render entry point's; the installed file, its main entry point's
    wizard = rendered_dropin("tunnel-only", label="lab", door_port=play.door_port,
                             controller_port=play.controller_port, explicit_ports=[play.sshd.port])
    assert (play.sshd.dropins / "01-fdl-lab.conf").read_text() == wizard


def test_the_key_part_alone_changes_the_key_file_and_nothing_of_sshd(play, tmp_path):
    """What `fdl join-config --install-key` runs as the invoking account: no drop-in, no reload, no facts, and
    no sshd configuration needed at all."""
    public = _keygen(tmp_path / "key")
    pid = play.sshd.pid()
    rc, counts, out = play.run(play.vars(public, fdl_join_door_privileged=False,
                                         fdl_join_door_sshd_config=str(tmp_path / "no-such-sshd_config")))
    assert rc == 0 and counts["failed"] == 0 and counts["changed"] == 1, out
    assert "Gathering Facts" not in out and "RUNNING HANDLER" not in out
    assert not (play.sshd.dropins / "01-fdl-lab.conf").exists() and play.sshd.pid() == pid
    data = play.sshd.authorized_keys.read_bytes()
    assert data.startswith(FOREIGN + b"\r\n") and data.count(b"fdl-farm-lab") == 1


def test_the_privileged_part_alone_leaves_the_key_file_byte_for_byte(play, tmp_path):
    """What the wizard's printed `ansible-playbook ... --become` line runs: the drop-in and the reload only."""
    public = _keygen(tmp_path / "key")
    before = play.sshd.authorized_keys.read_bytes()
    rc, counts, out = play.run(play.vars(public, fdl_join_door_install_key=False))
    assert rc == 0 and counts["failed"] == 0, out
    assert "RUNNING HANDLER" in out and (play.sshd.dropins / "01-fdl-lab.conf").exists()
    assert play.sshd.authorized_keys.read_bytes() == before


def test_a_configuration_sshd_rejects_is_never_put_in_place(play, tmp_path):
    public = _keygen(tmp_path / "key")
    assert play.run(play.vars(public))[0] == 0
    before = (play.sshd.dropins / "01-fdl-lab.conf").read_bytes()
    pid = play.sshd.pid()
    (play.sshd.dropins / "00-broken.conf").write_text("NoSuchDirective yes\n")
    rc, counts, out = play.run(play.vars(public, fdl_join_door_controller_port=play.controller_port + 1))
    assert rc != 0 and counts["failed"] == 1, out
    assert "failed to validate" in out
    assert (play.sshd.dropins / "01-fdl-lab.conf").read_bytes() == before
    assert "RUNNING HANDLER" not in out and play.sshd.pid() == pid


def test_keys_under_etc_ssh_are_refused_before_anything_changes(play, tmp_path):
    public = _keygen(tmp_path / "key")
    rc, counts, out = play.run(play.vars(public, fdl_join_door_authorized_keys="/etc/ssh/authorized_keys.d/root"))
    assert rc != 0 and counts["failed"] == 1
    assert "never one under /etc/ssh" in out
    assert not (play.sshd.dropins / "01-fdl-lab.conf").exists()


def _validate_command(candidate: Path, sshd: LoopbackSshd) -> list[str]:
    """The role's validate: line, rendered and split exactly as Ansible's copy module runs it."""
    role_vars = yaml.safe_load((resources.roles_dir() / "fdl_join_door/vars/main.yml").read_text())
    text = role_vars["_fdl_join_door_validate"]
    text = text.replace("{{ fdl_join_door_sshd_binary }}", "/usr/sbin/sshd") \
        .replace("{{ fdl_join_door_sshd_config }}", str(sshd.config))
    return shlex.split(text % str(candidate))


def test_the_validate_command_judges_the_candidate_inside_the_whole_configuration(tmp_path):
    need_root_or_skip("sshd -t reads host keys")
    sshd = LoopbackSshd()
    try:
        good = tmp_path / "good.conf"
        good.write_text(rendered_dropin("a", label="lab", door_port=22998, controller_port=1337,
                                        explicit_ports=[sshd.port]))
        bad = tmp_path / "bad.conf"
        bad.write_text("Match LocalPort 22998\n    Subsystem sftp /x\n")  # Subsystem is not allowed in Match (9.2)
        dup = tmp_path / "dup.conf"
        dup.write_text("Subsystem sftp internal-sftp\n")  # the main file defines it again: sshd refuses
        assert subprocess.run(_validate_command(good, sshd), capture_output=True).returncode == 0
        for candidate in (bad, dup):
            done = subprocess.run(_validate_command(candidate, sshd), capture_output=True, text=True)
            assert done.returncode != 0, candidate.read_text()
    finally:
        sshd.stop()


def _sftp(sshd: LoopbackSshd, key: Path, port: int, user: str, script: str):
    return subprocess.run(["sftp", "-b", "-", *sshd.ssh_opts(key, port)[:-2], "-o", f"User={user}", "-P", str(port),
                           "127.0.0.1"], input=script, capture_output=True, text=True, timeout=30)


def test_role_builds_a_working_jailed_door_a_and_removes_an_unjailed_key(play, tmp_path):
    """regression: door a's key went into the operator's own file, where its sftp could read anything."""
    import shutil
    import tempfile

    key = tmp_path / "key"
    public = _keygen(key)
    served = play.sshd.base / "data"
    (served / "tree").mkdir(parents=True)
    (served / "tree" / "train.rs").write_text("fn main() {}\n")
    (served / "tree" / "out").symlink_to("/etc")
    # what an earlier fdl installed for door a: the farm key in the operator's file, unjailed
    old = f'restrict,port-forwarding,permitopen="127.0.0.1:1",command="internal-sftp -R -d {served}" {public}'
    play.sshd.authorized_keys.write_bytes(FOREIGN + b"\r\n" + old.encode() + b"\r\n")
    base = Path(tempfile.mkdtemp(prefix="fdl-doors-test-", dir="/var/lib"))  # root-owned chain, reachable
    os.chmod(base, 0o755)
    fstab = tmp_path / "fstab"
    mountpoint = base / "lab" / "jail" / "data"
    subprocess.run(["userdel", "fdl-lab"], capture_output=True)
    try:
        variables = play.vars(public, fdl_join_door_door="a", fdl_join_door_served=str(served),
                              fdl_join_door_jail_base=str(base), fdl_join_door_fstab=str(fstab))
        rc, counts, out = play.run(variables)
        assert rc == 0 and counts["failed"] == 0, out
        assert "Removed the farm key from" in out
        assert play.sshd.authorized_keys.read_bytes() == FOREIGN + b"\r\n"  # only the unjailed line went
        assert fstab.read_text() == f"{served} {mountpoint} none bind,ro 0 0\n"
        keys = base / "lab" / ".ssh" / "authorized_keys"
        assert keys.read_text().endswith(" fdl-farm-lab\n") and public.split()[1] in keys.read_text()
        assert oct(keys.stat().st_mode & 0o777) == "0o600" and keys.stat().st_uid != 0

        play.sshd.wait_listening([play.door_port])
        # The handler's SIGHUP makes sshd re-execute itself; until it has, the port may still answer with the
        # configuration from before the drop-in: try the first read a few times before judging.
        for _attempt in range(20):
            read = _sftp(play.sshd, key, play.door_port, "fdl-lab", f"pwd\nget tree/train.rs {tmp_path / 'got'}\n")
            if read.returncode == 0:
                break
            time.sleep(0.5)
        assert read.returncode == 0 and (tmp_path / "got").read_text() == "fn main() {}\n", read.stderr
        assert "Remote working directory: /data" in read.stdout
        for escape in ("/etc/hostname", "../../../../etc/hostname", "tree/out/hostname",
                       str(play.sshd.authorized_keys)):
            done = _sftp(play.sshd, key, play.door_port, "fdl-lab", f"get {escape} {tmp_path / 'x'}\n")
            assert done.returncode != 0 and not (tmp_path / "x").exists(), escape
        write = _sftp(play.sshd, key, play.door_port, "fdl-lab", "mkdir tree/new\n")
        assert write.returncode != 0 and not (served / "tree" / "new").exists()
        fwd = play.sshd.ssh(key, play.door_port, "-l", "fdl-lab", "-W", f"127.0.0.1:{play.controller_port}",
                            "127.0.0.1")
        assert fwd.returncode == 0 and fwd.stdout == "fdl-controller-hello\n", fwd.stderr
        # the same key as the operator's account: nothing left to let it in
        refused = play.sshd.ssh(key, play.door_port, "127.0.0.1", "true")
        assert refused.returncode == 255 and "Permission denied" in refused.stderr

        rc, counts, out = play.run(variables)  # converged: nothing changes
        assert rc == 0 and counts["changed"] == 0, out
    finally:
        subprocess.run(["umount", str(mountpoint)], capture_output=True)
        subprocess.run(["userdel", "fdl-lab"], capture_output=True)
        subprocess.run(["groupdel", "fdl-lab"], capture_output=True)
        if not os.path.ismount(mountpoint):
            shutil.rmtree(base, ignore_errors=True)
