"""The shared-data check on real directories and mounts.

Root ignores permission bits, so the permission cases run the check as the
unprivileged user `nobody` (setpriv) when the tests run as root, and the
read-only case mounts a tmpfs read-only in a private mount namespace
(unshare), leaving the host's mounts untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fdl.hostside.checks.data import check_data_path, mount_of
from fdl.hostside.checks.report import ERROR, OK, SKIPPED, WARNING
from tests.conftest import REPO, need_root_or_skip

SNIPPET = ("import json, sys; from fdl.hostside.checks.data import check_data_path; "
           "print(json.dumps(check_data_path(sys.argv[1]).__dict__))")


def _run_check(path: str, prefix: list[str] | None = None, shell_setup: str | None = None) -> dict:
    """check_data_path(path) in a fresh process, optionally as another user or in a private mount namespace."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    argv = [sys.executable, "-c", SNIPPET, path]
    if shell_setup is not None:
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-ec",
                shell_setup + ' && exec "$@"', "sh", *argv]
    done = subprocess.run([*(prefix or []), *argv], capture_output=True, text=True, env=env, timeout=60,
                          cwd="/")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def shared_tmp():
    """A temp dir other users can traverse (pytest's own is 0700); removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="fdlp3-data-"))
    path.chmod(0o755)
    yield path
    for sub in path.rglob("*"):
        if sub.is_dir():
            sub.chmod(0o755)
    shutil.rmtree(path, ignore_errors=True)


def _as_unprivileged() -> list[str]:
    """Run as nobody when root (permission bits bind only non-root users); as ourselves otherwise."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to drop root for this test")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_missing_path_is_an_error_with_the_way_out(tmp_path: Path) -> None:
    result = check_data_path(str(tmp_path / "absent"))
    assert result.status == ERROR and "does not exist" in result.message
    assert "--data-path" in result.hint and "--skip-mount" in result.hint


def test_a_file_is_not_a_data_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    assert check_data_path(str(tmp_path / "f")).status == ERROR


def test_skip_mount_skips(tmp_path: Path) -> None:
    result = check_data_path(str(tmp_path / "absent"), skip=True)
    assert result.status == SKIPPED and "--skip-mount" in result.message


def test_a_directory_on_the_root_file_system_is_not_a_mount_warning(tmp_path: Path) -> None:
    import shutil
    import tempfile

    # tmp_path is usually on the root file system; where /tmp is its own mount, use another root-fs place
    places = [str(tmp_path), "/var/tmp", str(Path(__file__).resolve().parents[4])]
    base = next((p for p in places if Path(p).is_dir() and mount_of(p)[0] == "/"), None)
    assert base is not None, f"none of {places} is on the root file system"
    data = Path(tempfile.mkdtemp(prefix="fdlp3-data-", dir=base))
    try:
        result = check_data_path(str(data))
        assert result.status == WARNING and "not a mount" in result.message
        assert result.data["readable"] and result.data["writable"] and result.data["mounted"] is False
        assert not list(data.iterdir())  # the write test left nothing behind
    finally:
        shutil.rmtree(data, ignore_errors=True)


def test_a_mounted_writable_path_is_ok(shared_tmp: Path) -> None:
    need_root_or_skip("mounts a tmpfs in a private mount namespace")
    data = shared_tmp / "data"
    data.mkdir()
    result = _run_check(str(data), shell_setup=f"mount -t tmpfs fdlp3-data {data}")
    assert result["status"] == OK, result
    assert result["data"]["mount_point"] == str(data) and result["data"]["fs_type"] == "tmpfs"


def test_a_read_only_mount_is_an_error(shared_tmp: Path) -> None:
    need_root_or_skip("mounts a read-only tmpfs in a private mount namespace")
    data = shared_tmp / "data"
    data.mkdir()
    result = _run_check(str(data), shell_setup=f"mount -t tmpfs fdlp3-data {data} && mount -o remount,ro {data}")
    assert result["status"] == ERROR, result
    assert "read-only file system" in result["message"] and "remount" in result["hint"]
    assert result["data"]["readable"] is True and result["data"]["writable"] is False


def test_an_unreadable_directory_is_an_error(shared_tmp: Path) -> None:
    data = shared_tmp / "data"
    data.mkdir()
    data.chmod(0o000)
    result = _run_check(str(data), prefix=_as_unprivileged())
    assert result["status"] == ERROR, result
    assert "cannot read it" in result["message"] and "uid mapping" in result["hint"]


def test_a_directory_without_write_permission_is_an_error(shared_tmp: Path) -> None:
    data = shared_tmp / "data"
    data.mkdir()
    data.chmod(0o555)
    result = _run_check(str(data), prefix=_as_unprivileged())
    assert result["status"] == ERROR, result
    assert "cannot write" in result["message"] and result["data"]["readable"] is True


def test_a_parent_that_denies_access_is_an_error(shared_tmp: Path) -> None:
    (shared_tmp / "locked" / "data").mkdir(parents=True)
    (shared_tmp / "locked").chmod(0o000)
    result = _run_check(str(shared_tmp / "locked" / "data"), prefix=_as_unprivileged())
    assert result["status"] == ERROR and "cannot be reached" in result["message"]
