"""The host doctor, per platform: facts are injected, findings and fixes are checked.

The facts describe machines this test does not run on (Fedora with SELinux
and firewalld, macOS, an older Debian); `diagnose()` is pure, so each
platform's spelling of every fix is checked without that platform.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fdl.farm.doctor import HostFacts, diagnose, gather_facts
from fdl.hostside.farm.sshd_config import scan

DEBIAN = HostFacts(system="Linux", distro="debian", package_manager="apt", init="systemd",
                   ssh_units=("ssh.service", "ssh.socket"), ssh_socket_active=False, sshd_path="/usr/sbin/sshd",
                   door_listening=True, door_banner="SSH-2.0-OpenSSH_9.2p1 Debian-2", rrsync_path="/usr/bin/rrsync",
                   served="/srv/run", served_is_dir=True)
FEDORA = HostFacts(system="Linux", distro="fedora", package_manager="dnf", init="systemd",
                   ssh_units=("sshd.service",), sshd_path="/usr/sbin/sshd", door_listening=False,
                   rrsync_path=None, served="/srv/run", served_is_dir=False, selinux="enforcing",
                   selinux_ssh_ports=(22,), semanage_path="/usr/sbin/semanage", firewall="firewalld",
                   firewall_active=True, firewall_port_open=False)
MACOS = HostFacts(system="Darwin", package_manager="brew", init="launchd", sshd_path="/usr/sbin/sshd",
                  remote_login=False, door_listening=False, rrsync_path=None, served="/Users/op/.flodl/run",
                  served_is_dir=True)


def by_name(findings):
    return {f.name: f for f in findings}


def test_a_ready_debian_box_is_all_green():
    found = by_name(diagnose(DEBIAN, door="b", door_port=2222))
    assert {f.status for f in found.values()} == {"ok"}
    assert "SSH-2.0" in found["listener"].message


def test_debian_missing_sshd_says_apt_and_ssh_service():
    found = by_name(diagnose(replace(DEBIAN, sshd_path=None, door_listening=False), door="b", door_port=2222))
    assert found["sshd"].status == "error"
    assert found["sshd"].hint == "sudo apt-get install -y openssh-server && sudo systemctl enable --now ssh"


def test_debian_ssh_socket_holding_the_listener_is_named_with_its_fix():
    found = by_name(diagnose(replace(DEBIAN, ssh_socket_active=True, door_listening=False), door="a",
                             door_port=2222))
    assert found["ssh.socket"].status == "error"
    assert "Port directive is ignored" in found["ssh.socket"].message
    assert found["ssh.socket"].hint.startswith("sudo systemctl disable --now ssh.socket && "
                                               "sudo systemctl enable --now ssh.service")
    assert found["listener"].hint.endswith("sudo systemctl reload ssh")


def test_old_debian_ships_rrsync_only_as_documentation():
    found = by_name(diagnose(replace(DEBIAN, rrsync_path=None, rrsync_doc_copy=True), door="b", door_port=2222))
    assert "gunzip -c /usr/share/doc/rsync/scripts/rrsync.gz > /usr/local/bin/rrsync" in found["rrsync"].hint


def test_debian_ufw_active_and_closed():
    found = by_name(diagnose(replace(DEBIAN, firewall="ufw", firewall_active=True, firewall_port_open=False),
                             door="tunnel-only", door_port=2222))
    assert found["firewall"].status == "warning" and found["firewall"].hint == "sudo ufw allow 2222/tcp"
    assert "rrsync" not in found and "served" not in found  # tunnel-only needs neither


def test_fedora_spells_dnf_sshd_service_firewalld_and_semanage():
    found = by_name(diagnose(FEDORA, door="b", door_port=2222))
    assert found["rrsync"].hint == "sudo dnf install -y rsync rsync-rrsync"
    assert found["listener"].hint.endswith("sudo systemctl reload sshd")
    assert found["selinux"].status == "error"
    assert found["selinux"].hint == "sudo semanage port -a -t ssh_port_t -p tcp 2222"
    assert "never" in found["selinux"].message or "mention SELinux" in found["selinux"].message
    assert found["firewall"].hint == ("sudo firewall-cmd --permanent --add-port=2222/tcp && "
                                      "sudo firewall-cmd --reload")
    assert found["served"].status == "warning" and "fdl publish" in found["served"].hint


def test_fedora_without_semanage_installs_it_first_and_an_unknown_label_is_a_warning():
    found = by_name(diagnose(replace(FEDORA, semanage_path=None, selinux_ssh_ports=None), door="tunnel-only",
                             door_port=2222))
    assert found["selinux"].status == "warning"
    assert found["selinux"].hint == ("sudo dnf install -y policycoreutils-python-utils && "
                                     "sudo semanage port -a -t ssh_port_t -p tcp 2222")


def test_selinux_already_labelled_port_is_fine():
    found = by_name(diagnose(replace(FEDORA, selinux_ssh_ports=(22, 2222)), door="tunnel-only", door_port=2222))
    assert found["selinux"].status == "ok"


def test_macos_remote_login_and_brew():
    found = by_name(diagnose(MACOS, door="b", door_port=2222))
    assert found["sshd"].status == "error" and found["sshd"].hint == "sudo systemsetup -setremotelogin on"
    assert found["rrsync"].hint == "brew install rsync"
    assert "launchctl kickstart -k system/com.openssh.sshd" in found["listener"].hint
    assert "Remote Login" in found["listener"].hint


def test_something_else_on_the_door_port_is_an_error():
    found = by_name(diagnose(replace(DEBIAN, door_banner="HTTP/1.1 400 Bad Request"), door="b", door_port=2222))
    assert found["listener"].status == "error" and "not an ssh daemon" in found["listener"].message


def _config(tmp_path: Path, main: str, dropins: dict[str, str] | None = None):
    (tmp_path / "sshd_config.d").mkdir(exist_ok=True)
    for name, text in (dropins or {}).items():
        (tmp_path / "sshd_config.d" / name).write_text(text)
    (tmp_path / "sshd_config").write_text(main.replace("@D", str(tmp_path)))
    target = str(tmp_path / "sshd_config.d" / "01-fdl-x.conf")
    return scan(str(tmp_path / "sshd_config"), virtual=(target, ["Port 2222", "Match LocalPort 2222"])), target


def test_a_config_that_never_reads_sshd_config_d_is_an_error(tmp_path):
    cfg, target = _config(tmp_path, "Port 22\n")
    found = by_name(diagnose(replace(DEBIAN, sshd_config=cfg, dropin_target=target), door="b", door_port=2222))
    assert found["sshd-config"].status == "error"
    assert f"Include {tmp_path}/sshd_config.d/*.conf" in found["sshd-config"].hint


def test_settings_read_before_the_dropin_are_named(tmp_path):
    cfg, target = _config(tmp_path, "Include @D/sshd_config.d/*.conf\n", {"00-x.conf": "AllowTcpForwarding yes\n"})
    found = by_name(diagnose(replace(DEBIAN, sshd_config=cfg, dropin_target=target), door="b", door_port=2222))
    assert found["sshd-config"].status == "warning" and "allowtcpforwarding yes" in found["sshd-config"].message


@pytest.mark.parametrize("subsystem, exists, status, hint", [
    ("Subsystem sftp /usr/lib/openssh/sftp-server\n", False, "error", "sudo apt-get install -y openssh-sftp-server"),
    ("Subsystem sftp /usr/lib/openssh/sftp-server\n", True, "ok", None),
    ("Subsystem sftp internal-sftp\n", False, "ok", None),
    ("", False, "error", "Subsystem sftp internal-sftp"),
])
def test_door_a_needs_an_sftp_subsystem_whose_program_exists(tmp_path, subsystem, exists, status, hint):
    cfg, target = _config(tmp_path, "Include @D/sshd_config.d/*.conf\n" + subsystem)
    facts = replace(DEBIAN, sshd_config=cfg, dropin_target=target,
                    existing_files=frozenset({"/usr/lib/openssh/sftp-server"} if exists else set()))
    found = by_name(diagnose(facts, door="a", door_port=2222))
    assert found["sftp"].status == status
    if hint:
        assert hint in found["sftp"].hint


def test_gather_facts_observes_this_machine_without_changing_it(tmp_path):
    """The real observer on this Debian box: read-only, and what it sees is consistent."""
    cfg = tmp_path / "sshd_config"
    cfg.write_text("Port 22\nSubsystem sftp internal-sftp\n")
    facts = gather_facts(door_port=22999, served=str(tmp_path), sshd_config=str(cfg))
    assert facts.system == "Linux" and facts.served_is_dir
    assert facts.sshd_config is not None and facts.sshd_config.ports() == [22]
    assert cfg.read_text() == "Port 22\nSubsystem sftp internal-sftp\n"
