"""Reading sshd_config as sshd does: Include globs, Match scope, first value wins."""

from __future__ import annotations

from pathlib import Path

from fdl.hostside.farm.sshd_config import scan


def _layout(tmp_path: Path, main: str, dropins: dict[str, str]) -> Path:
    (tmp_path / "sshd_config.d").mkdir()
    for name, text in dropins.items():
        (tmp_path / "sshd_config.d" / name).write_text(text)
    path = tmp_path / "sshd_config"
    path.write_text(main.replace("@D", str(tmp_path)))
    return path


def test_ports_subsystem_and_key_files_through_includes(tmp_path):
    main = _layout(tmp_path, "Include @D/sshd_config.d/*.conf\nPort 22\nSubsystem\tsftp\t/usr/lib/sftp\n"
                             "Match User bob\n  Port 99\n", {"10-a.conf": "Port=2200 # trailing\n",
                                                             "20-b.conf": "AuthorizedKeysFile .ssh/a .ssh/b\n"})
    result = scan(str(main))
    assert result.ports() == [2200, 22]
    assert result.subsystem("sftp") == "/usr/lib/sftp"
    assert result.authorized_keys_files() == [".ssh/a", ".ssh/b"]


def test_relative_include_is_relative_to_the_main_files_directory(tmp_path):
    main = _layout(tmp_path, "Include sshd_config.d/*.conf\n", {"x.conf": "Port 2022\n"})
    assert scan(str(main)).ports() == [2022]


def test_a_match_block_ends_with_the_file_that_opened_it(tmp_path):
    main = _layout(tmp_path, "Include @D/sshd_config.d/*.conf\nX11Forwarding yes\n",
                   {"01-door.conf": "Match LocalPort 2222\n  PermitTTY no\n"})
    result = scan(str(main))
    x11 = result.top("x11forwarding")
    assert len(x11) == 1 and not x11[0].in_match
    assert result.top("permittty") == []


def test_virtual_dropin_is_read_at_its_sorted_place_and_shadowing_is_found(tmp_path):
    main = _layout(tmp_path, "Include @D/sshd_config.d/*.conf\nPasswordAuthentication no\n",
                   {"00-early.conf": "PermitTTY yes\n", "50-cloud-init.conf": "PasswordAuthentication yes\n"})
    target = str(tmp_path / "sshd_config.d" / "01-fdl-x.conf")
    result = scan(str(main), virtual=(target, ["Match LocalPort 2222", "PermitTTY no"]))
    assert result.virtual_read
    shadow = result.shadowing(target)
    assert [(d.keyword, d.value) for d in shadow] == [("permittty", "yes")]  # 50-cloud-init comes after ours


def test_a_dropin_directory_nobody_includes_is_not_read(tmp_path):
    main = _layout(tmp_path, "Port 22\n", {})
    result = scan(str(main), virtual=(str(tmp_path / "sshd_config.d" / "01-fdl-x.conf"), ["Port 2222"]))
    assert not result.virtual_read


def test_an_include_inside_match_is_conditional(tmp_path):
    main = _layout(tmp_path, "Match User x\nInclude @D/sshd_config.d/*.conf\n", {"a.conf": "Port 7\n"})
    assert scan(str(main)).ports() == []


def test_unreadable_main_is_reported_not_raised(tmp_path):
    result = scan(str(tmp_path / "nope"))
    assert result.unreadable == [str(tmp_path / "nope")] and result.ports() == []
