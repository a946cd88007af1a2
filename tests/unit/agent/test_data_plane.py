"""The dataset root (in place, or mounted read-only with sshfs from a real sshd) and the writable stage."""

from __future__ import annotations

import os
import subprocess

import pytest

from fdl.agent.data import DataError, is_read_only, prepare_data, prove_writable
from fdl.agent.options import parse_sshfs_source
from fdl.errors import PermanentError
from tests.conftest import need_root_or_skip
from tests.join_util import LoopbackSshd, free_port, user_name


def test_nothing_configured_checks_nothing():
    assert prepare_data(None, None) is None


def test_a_data_path_that_is_there_is_used(tmp_path):
    notes = []
    assert prepare_data(str(tmp_path), None, note=notes.append) == str(tmp_path)
    assert "in place" in notes[0]


def test_a_data_path_that_is_not_there_is_transient(tmp_path):
    with pytest.raises(DataError) as err:
        prepare_data(str(tmp_path / "absent"), None)
    assert err.value.exit_code == 1 and "--data-source" in err.value.hint


def test_a_filled_directory_is_already_there(tmp_path):
    (tmp_path / "shard-0").write_text("data")
    source = parse_sshfs_source("sshfs://op@192.0.2.1:/flodl/data")  # never dialled: the data is already here
    notes = []
    assert prepare_data(str(tmp_path), source, note=notes.append) == str(tmp_path)
    assert "already there" in notes[0]


def test_an_unwritable_stage_is_permanent(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory must go")
    prove_writable([tmp_path / "ok"])
    with pytest.raises(PermanentError) as err:
        prove_writable([tmp_path / "ok", blocker / "stage"])
    assert err.value.exit_code == 2 and str(blocker / "stage") in err.value.message
    assert not [p for p in (tmp_path / "ok").iterdir()]  # the probe file is gone


@pytest.fixture
def sshd(tmp_path):
    need_root_or_skip("the test sshd logs the test user in with a key it generates; the mount needs FUSE")
    with LoopbackSshd(tmp_path / "sshd") as server:
        yield server


def test_sshfs_mounts_the_source_read_only(sshd, tmp_path):
    exported = tmp_path / "exported"
    exported.mkdir()
    (exported / "train.bin").write_bytes(b"tokens")
    mountpoint = tmp_path / "data"
    source = parse_sshfs_source(f"sshfs://{user_name()}@127.0.0.1:{sshd.port}:{exported}")
    env = {**os.environ, "FDL_SSH_COMMAND": sshd.ssh_command}
    notes = []
    try:
        assert prepare_data(str(mountpoint), source, identity=str(sshd.key), environ=env,
                            note=notes.append) == str(mountpoint)
        assert os.path.ismount(mountpoint) and is_read_only(str(mountpoint))
        assert (mountpoint / "train.bin").read_bytes() == b"tokens"
        with pytest.raises(OSError):
            (mountpoint / "new").write_text("must fail")
        assert "mounted" in notes[-1]
        again = []
        prepare_data(str(mountpoint), source, identity=str(sshd.key), environ=env, note=again.append)
        assert "already mounted (read-only)" in again[0]
    finally:
        subprocess.run(["fusermount3", "-u", str(mountpoint)], capture_output=True)


def test_a_failed_mount_is_transient(sshd, tmp_path):
    source = parse_sshfs_source(f"sshfs://{user_name()}@127.0.0.1:{free_port()}:/nowhere")
    env = {**os.environ, "FDL_SSH_COMMAND": sshd.ssh_command}
    with pytest.raises(DataError) as err:
        prepare_data(str(tmp_path / "data"), source, identity=str(sshd.key), environ=env)
    assert err.value.exit_code == 1 and "failed" in err.value.message
    assert not os.path.ismount(tmp_path / "data")
