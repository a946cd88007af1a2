"""The dataset root (in place, or mounted read-only with sshfs from a real sshd, and mounted again once that mount
went stale) and the writable stage; everything here is transient (the permanent class is fdl.agent.permanent's)."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from fdl.agent.data import STALE, DataError, is_read_only, mount_type, prepare_data, prove_writable
from fdl.agent.options import parse_sshfs_source
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


def test_an_unwritable_stage_is_transient_here_and_says_why(tmp_path):
    # what is permanent about a stage is decided once, before the first dial (fdl.agent.permanent); a dial's own
    # check names the path and the errno, and what would mend it
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory must go")
    prove_writable([tmp_path / "ok"])
    with pytest.raises(DataError) as err:
        prove_writable([tmp_path / "ok", blocker / "stage"])
    assert err.value.exit_code == 1 and str(blocker / "stage") in err.value.message
    assert "ENOTDIR" in err.value.message and "next dial" in err.value.hint
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


def _names_a_stale_errno(text: str) -> bool:
    """What a mount that lost its server answers (ENOTCONN, ECONNABORTED, EIO ... : which one depends on how it
    went and on the kernel), named the way fdl names an errno."""
    return any(f"({errno.errorcode[code]})" in text or f", {errno.errorcode[code]})" in text for code in STALE)


def _stop_sshfs_of(mountpoint) -> None:
    from pathlib import Path

    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                words = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if words[0].endswith(b"sshfs") and str(mountpoint).encode() in words:
                os.kill(int(entry.name), 9)


@pytest.mark.parametrize("how", ["door", "sshfs"])
def test_a_stale_mount_is_mounted_again(sshd, tmp_path, how):
    """regression: once the data host's sshd restarted, the sshfs mount answered EIO (sshfs reconnecting in vain:
    statvfs reached the raw OSError that ended --persist) or, with sshfs gone, ENOTCONN (the mount point "exists"
    but cannot be stat'ed: "cannot create the mount point: File exists", exit 2, poweroff). Now the stale mount is
    told by its errno, unmounted lazily and mounted again; while the host is down that is transient, and says so."""
    exported = tmp_path / "exported"
    exported.mkdir()
    (exported / "shard-0").write_bytes(b"tokens")
    mountpoint = tmp_path / "data"
    source = parse_sshfs_source(f"sshfs://{user_name()}@127.0.0.1:{sshd.port}:{exported}")
    env = {**os.environ, "FDL_SSH_COMMAND": sshd.ssh_command}
    try:
        prepare_data(str(mountpoint), source, identity=str(sshd.key), environ=env)
        assert mount_type(str(mountpoint)) == "fuse.sshfs"
        sshd.stop()  # the door's sshd and every session it served: the mount's connection is gone
        if how == "sshfs":
            _stop_sshfs_of(mountpoint)  # and sshfs with it: ENOTCONN from now on
        with pytest.raises(OSError):
            os.statvfs(mountpoint)
        notes: list[str] = []
        with pytest.raises(DataError) as err:  # the host is down: transient, and it says so
            prepare_data(str(mountpoint), source, identity=str(sshd.key), environ=env, note=notes.append)
        assert err.value.exit_code == 1
        assert f"the data host 127.0.0.1:{sshd.port} does not answer" in err.value.message, err.value.message
        assert "ECONNREFUSED" in err.value.message and "bring it back" in err.value.hint
        assert any("is stale" in n and _names_a_stale_errno(n) for n in notes), notes
        assert mount_type(str(mountpoint)) is None  # the stale mount went; nothing is left half mounted
        sshd.start()
        again: list[str] = []
        assert prepare_data(str(mountpoint), source, identity=str(sshd.key), environ=env,
                            note=again.append) == str(mountpoint)
        assert (mountpoint / "shard-0").read_bytes() == b"tokens" and is_read_only(str(mountpoint))
        assert "mounted" in again[-1]
    finally:
        subprocess.run(["fusermount3", "-uz", str(mountpoint)], capture_output=True)


def test_a_stale_mount_under_data_path_alone_is_transient(sshd, tmp_path):
    # a mount something else provisioned (--data-path without --data-source) is not fdl's to remount: it says so
    exported = tmp_path / "exported"
    exported.mkdir()
    mountpoint = tmp_path / "data"
    source = parse_sshfs_source(f"sshfs://{user_name()}@127.0.0.1:{sshd.port}:{exported}")
    env = {**os.environ, "FDL_SSH_COMMAND": sshd.ssh_command}
    try:
        prepare_data(str(mountpoint), source, identity=str(sshd.key), environ=env)
        sshd.stop()
        _stop_sshfs_of(mountpoint)
        with pytest.raises(DataError) as err:
            prepare_data(str(mountpoint), None)
        assert err.value.exit_code == 1 and "does not answer" in err.value.message
        assert _names_a_stale_errno(err.value.message) and "--data-source" in err.value.hint
        assert mount_type(str(mountpoint)) == "fuse.sshfs"  # left alone
    finally:
        subprocess.run(["fusermount3", "-uz", str(mountpoint)], capture_output=True)
        sshd.start()
