"""Door key lines and the sshd drop-in each door gets."""

from __future__ import annotations

import pytest

from fdl.hostside.farm.authorized_keys import line_identity, parse_public_key
from fdl.hostside.farm.doors import (
    DoorError,
    door_account,
    dropin_name,
    dropin_scan_lines,
    dropin_vars,
    jail,
    key_line,
    known_hosts_lines,
    port_lines,
)
from tests.farm_render import rendered_dropin

PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOursOursOursOursOursOursOursOursOursOurs01 fdl-farm-b300"


def test_door_a_key_runs_the_builtin_sftp_server_read_only_in_the_jail_and_permits_one_forward():
    """regression: the key ran `internal-sftp -R -d <served>` unjailed; now the path is the one inside the chroot."""
    line = key_line("a", PUB, label="b300", controller_port=1337, served="/flodl/data")
    assert line.startswith('restrict,port-forwarding,permitopen="127.0.0.1:1337",'
                           'command="internal-sftp -R -d /data" ssh-ed25519 ')
    assert line.endswith(" fdl-farm-b300")
    assert line_identity(line.encode()) == parse_public_key(PUB)


def test_door_a_jail_is_a_root_owned_chain_for_an_account_of_its_own():
    cell = jail("b300")
    assert cell.account == "fdl-b300"
    assert (cell.home, cell.root, cell.data) == ("/var/lib/fdl-doors/b300", "/var/lib/fdl-doors/b300/jail",
                                                 "/var/lib/fdl-doors/b300/jail/data")
    assert cell.authorized_keys == "/var/lib/fdl-doors/b300/.ssh/authorized_keys"
    for bad in ("B300", "x" * 29):
        with pytest.raises(DoorError, match="account"):
            door_account(bad)


def test_door_a_dropin_jails_its_account_on_every_port():
    text = rendered_dropin("a", label="b300", door_port=2222, controller_port=1337, explicit_ports=[22])
    block = text.split("Match User fdl-b300\n", 1)[1]
    directives = [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert "ChrootDirectory /var/lib/fdl-doors/b300/jail" in directives
    assert "ForceCommand internal-sftp -R -d /data" in directives
    assert "AuthorizedKeysFile /var/lib/fdl-doors/b300/.ssh/authorized_keys" in directives
    assert "PermitOpen 127.0.0.1:1337" in directives and "PermitTTY no" in directives
    assert not any(d.startswith("Match") for d in directives)  # no LocalPort: the jail holds on port 22 too


def test_door_b_runs_rrsync_read_only_on_the_served_directory_behind_the_guard():
    line = key_line("b", PUB, label="b300", controller_port=1400, served="/home/op/.flodl/run/",
                    rrsync="/usr/bin/rrsync")
    command = line.split('command="', 1)[1].split('"', 1)[0]
    assert command.startswith("/bin/sh -c 'case $SSH_ORIGINAL_COMMAND in ")
    assert command.endswith("; exec /usr/bin/rrsync -ro -munge /home/op/.flodl/run'")  # regression: -munge
    assert 'permitopen="127.0.0.1:1400"' in line and line.startswith("restrict,")
    assert line_identity(line.encode()) == parse_public_key(PUB)


@pytest.mark.parametrize("request_line, refused", [
    ("rsync --server --sender -vlogDtpre.iLsfxCIvu . /tree/", False),
    ("rsync --server --sender -vlogDtpre.iLsfxCIvu --copy-unsafe-links . /tree/", True),
    ("rsync --server --sender -logDtpre.iLsfxCIvu --copy-unsafe-links --munge-links . /tree/", True),
    ("rsync --server --sender -logDtpre.iLsfxCIvu --files-from=- --from0 . /tree/", True),
    ("rsync --server --sender -logDtpre.iLsfxCIvu\t--copy-unsafe-links . /tree/", True),  # any white space
    ("rsync --server --sender -logDtpre.iLsfxCIvu --copy-links . /tree/", True),
    ("rsync --server --sender -logDtpre.iLsfxCIvu --keep-dirlinks . /tree/", True),
])
@pytest.mark.parametrize("login_shell", ["/bin/sh", "/bin/bash"])
def test_door_b_guard_refuses_link_following_options_before_rrsync_runs(tmp_path, request_line, refused,
                                                                          login_shell):
    """The guard itself, run as sshd runs a key's command: the login shell with -c, SSH_ORIGINAL_COMMAND set."""
    import os
    import subprocess

    fake = tmp_path / "rrsync"
    fake.write_text('#!/bin/sh\necho "rrsync ran: $*"\n')
    fake.chmod(0o755)
    line = key_line("b", PUB, label="b300", controller_port=1337, served="/srv/run", rrsync=str(fake))
    command = line.split('command="', 1)[1].split('"', 1)[0]
    done = subprocess.run([login_shell, "-c", command], capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "SSH_ORIGINAL_COMMAND": request_line})
    if refused:
        assert done.returncode == 1 and "rrsync ran" not in done.stdout
        assert "fdl door b: rsync options that follow links or read a file list are refused" in done.stderr
    else:
        assert done.returncode == 0 and done.stdout == "rrsync ran: -ro -munge /srv/run\n"


def test_tunnel_only_has_no_command_and_no_pty():
    line = key_line("tunnel-only", PUB, label="b300", controller_port=1337)
    assert line.split(" ")[0] == 'restrict,port-forwarding,permitopen="127.0.0.1:1337"'
    assert "command=" not in line and "pty" not in line


@pytest.mark.parametrize("served", ["relative/dir", "/with space", '/quo"te', "/a/../b", "/x/..", "/$(id)"])
def test_served_paths_that_would_need_quoting_are_refused(served):
    with pytest.raises(DoorError, match="served directory"):
        key_line("b", PUB, label="x", controller_port=1337, served=served)


def test_unknown_door_and_bad_label_are_refused():
    with pytest.raises(DoorError, match="unknown door"):
        key_line("c", PUB, label="x", controller_port=1)
    with pytest.raises(DoorError, match="label"):
        key_line("tunnel-only", PUB, label="../x", controller_port=1)


def test_port_lines_keep_the_implicit_22_only_when_no_port_is_set_anywhere():
    assert [p.port for p in port_lines(2222, [])] == [22, 2222]
    assert [p.port for p in port_lines(2222, [22])] == [2222]
    assert [p.port for p in port_lines(2222, [2200, 2222])] == []


@pytest.mark.parametrize("door, forced", [("a", False), ("b", False), ("tunnel-only", True)])
def test_dropin_scopes_with_match_localport_and_forces_a_command_only_for_tunnel_only(door, forced):
    text = rendered_dropin(door, label="b300", door_port=2222, controller_port=1337, explicit_ports=[22])
    directives = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert directives[:2] == ["Port 2222", "Match LocalPort 2222"]
    assert ("Match User fdl-b300" in text) is (door == "a")
    directives = directives[:directives.index("Match User fdl-b300")] if door == "a" else directives
    assert "PermitOpen 127.0.0.1:1337" in directives and "AllowTcpForwarding local" in directives
    assert "PermitTTY no" in directives
    assert any(d.startswith("ForceCommand ") for d in directives) is forced


def test_dropin_name_sorts_early():
    assert dropin_name("b300") == "01-fdl-b300.conf"


def test_the_scan_lines_are_the_drop_ins_port_lines_and_match_block():
    values = dropin_vars("b", label="b300", door_port=2222, controller_port=1337, explicit_ports=[])
    assert dropin_scan_lines(values) == ["Port 22", "Port 2222", "Match LocalPort 2222"]


def test_known_hosts_lines_pin_the_door_under_the_name_ssh_looks_up():
    keys = ["ssh-ed25519 AAAAC3Nza host@box", "ecdsa-sha2-nistp256 AAAAE2Vj", "ssh-ed25519 AAAAC3Nza again"]
    assert known_hosts_lines("10.0.0.1", 2222, keys) == ["[10.0.0.1]:2222 ssh-ed25519 AAAAC3Nza",
                                                         "[10.0.0.1]:2222 ecdsa-sha2-nistp256 AAAAE2Vj"]
    assert known_hosts_lines("door", 22, keys[:1]) == ["door ssh-ed25519 AAAAC3Nza"]
