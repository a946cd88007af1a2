"""The farm overlay's token line, the training crate, and the farm's credentials."""

from __future__ import annotations

import os
import stat

import pytest
import yaml

from fdl.errors import FdlError
from fdl.farm import credentials, minted
from fdl.farm.overlay import OverlayEditError, has_token, point_at_token_file, read_crate, token_files

FILE = ".fdl/b300/token"


@pytest.mark.parametrize("before, after", [
    (b'# mine\ncluster:\n  controller:\n    join:\n      token: "old"  # keep this comment\n      start: manual\n',
     b'# mine\ncluster:\n  controller:\n    join:\n      token_file: .fdl/b300/token  # keep this comment\n'
     b"      start: manual\n"),
    (b"cluster:\r\n  controller:\r\n    join: {start: manual, token: 'x'}\r\n",
     b"cluster:\r\n  controller:\r\n    join: {start: manual, token_file: .fdl/b300/token}\r\n"),
    (b"join:\n  token: 1234\n", b"join:\n  token_file: .fdl/b300/token\n"),
    (b"cluster:\n  controller:\n    join:\n      token:\n", b"cluster:\n  controller:\n    join:\n      token_file: "
     b".fdl/b300/token\n"),
])
def test_a_literal_token_becomes_token_file_and_nothing_else_changes(before, after):
    assert point_at_token_file(before, FILE) == after
    assert token_files(after.decode()) == [FILE] and has_token(after)
    assert yaml.safe_load(after)  # still YAML


def test_both_token_lines_of_an_old_farm_overlay_move_to_the_file_and_nothing_else():
    before = (b"inherit-from: base\n# c\ncluster:\n  controller:\n    join:\n      token: aa\n"
              b"join:\n  token: 'bb'   # worker default\ncommands: {x: {run: y}}")
    after = point_at_token_file(before, FILE)
    assert after == before.replace(b"token: aa", b"token_file: " + FILE.encode()).replace(
        b"token: 'bb'", b"token_file: " + FILE.encode())
    assert point_at_token_file(after, FILE) is None  # nothing literal left: a re-run changes nothing


def test_an_overlay_without_a_token_is_left_alone():
    data = b"cluster:\n  controller: 10.0.0.1:1337\n"
    assert not has_token(data) and point_at_token_file(data, FILE) is None


def test_a_block_scalar_token_is_not_edited():
    with pytest.raises(OverlayEditError):
        point_at_token_file(b"join:\n  token: |\n    abc\n", FILE)


def test_crate_name_from_bin_then_package(tmp_path):
    assert read_crate(tmp_path) is None
    (tmp_path / "Cargo.toml").write_text('[package]\nname = "my-train"\n')
    assert read_crate(tmp_path).name == "my-train"
    (tmp_path / "Cargo.toml").write_text('[package]\nname = "lib"\n[[bin]]\nname = "train"\npath = "src/t.rs"\n')
    assert read_crate(tmp_path).bin == "train"
    (tmp_path / "Cargo.toml").write_text('[workspace]\nmembers = ["a"]\n')
    assert read_crate(tmp_path) is None
    (tmp_path / "Cargo.toml").write_text("not toml [")
    assert read_crate(tmp_path) is None


def test_mint_writes_0600_key_and_token_from_entropy(tmp_path):
    cred = credentials.mint(tmp_path, "lab")
    for path in (cred.key, cred.public, cred.token_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(cred.token()) == 64 and int(cred.token(), 16) >= 0
    assert cred.public_key.startswith("ssh-ed25519 ") and cred.public_key.endswith("fdl-farm-lab")
    assert cred.fingerprint.startswith("SHA256:")
    again = credentials.load(tmp_path)
    assert again.identity == cred.identity and again.token() == cred.token()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left behind


def test_rotation_replaces_key_and_token_together(tmp_path, state):
    first = credentials.mint(tmp_path, "lab")
    old_token = first.token()
    second = credentials.mint(tmp_path, "lab")
    assert second.identity != first.identity and second.token() != old_token
    assert minted.check(second.public_key, second.token()) is None
    assert minted.check(first.public_key, old_token) is not None  # the rotated-out pair's record is gone
    assert len(list((state / "fdl" / "farms").iterdir())) == 1


@pytest.fixture
def state(tmp_path_factory, monkeypatch):
    """A private XDG_STATE_HOME of this test's own."""
    root = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(root))
    return root


def test_minted_records_the_fingerprint_ssh_keygen_prints_and_a_hash_of_the_token(tmp_path, state):
    cred = credentials.mint(tmp_path, "lab")
    assert minted.key_fingerprint(cred.public_key) == cred.fingerprint  # the same as ssh-keygen -l -E sha256
    record = state / "fdl" / "farms"
    (entry,) = list(record.iterdir())
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE(record.stat().st_mode) == 0o700 and stat.S_IMODE(record.parent.stat().st_mode) == 0o700
    assert cred.token() not in entry.read_text()
    assert minted.check(cred.public_key, cred.token()) is None
    assert "not the one fdl minted" in minted.check(cred.public_key, "ab" * 32)
    credentials.vet(cred, tmp_path)  # this user's own minting: trusted


@pytest.mark.parametrize("loosen", ["farms-dir", "fdl-dir", "record"])
def test_a_record_others_could_have_written_counts_as_none(tmp_path, state, loosen):
    cred = credentials.mint(tmp_path, "lab")
    farms = state / "fdl" / "farms"
    target = {"farms-dir": farms, "fdl-dir": farms.parent, "record": next(farms.iterdir())}[loosen]
    os.chmod(target, stat.S_IMODE(target.stat().st_mode) | 0o022)
    assert "no record" in minted.check(cred.public_key, cred.token())
    with pytest.raises(FdlError, match="not minted by fdl for you on this box") as refused:
        credentials.vet(cred, tmp_path)
    assert "--regen" in (refused.value.hint or "")


def test_a_state_directory_of_someone_elses_refuses_to_mint_and_replaces_nothing(tmp_path, state):
    from tests.conftest import need_root_or_skip

    need_root_or_skip("gives fdl's state directory to another user")
    (state / "fdl" / "farms").mkdir(parents=True)
    os.chown(state / "fdl", 65534, 65534)
    with pytest.raises(FdlError, match="not a directory of this user's own"):
        credentials.mint(tmp_path, "lab")
    assert list(tmp_path.iterdir()) == []


def test_entropy_failure_refuses_and_writes_nothing(tmp_path, monkeypatch):
    """The OS entropy call cannot be made to fail for real here; it is replaced to raise as it would."""
    def broken(n):
        raise OSError(38, "getrandom not implemented")
    monkeypatch.setattr(os, "urandom", broken)
    with pytest.raises(FdlError, match="entropy source failed") as caught:
        credentials.mint(tmp_path, "lab")
    assert caught.value.exit_code == 1
    assert list(tmp_path.iterdir()) == []


def test_half_a_credential_is_refused(tmp_path):
    credentials.mint(tmp_path, "lab")
    (tmp_path / "token").unlink()
    with pytest.raises(FdlError, match="incomplete: token missing"):
        credentials.load(tmp_path)
