"""A worker's disk, filled or fenced by another real account of its box: transient, never a poweroff.

Exit 2 powers a worker off under its unit, so only the worker's own configuration may cause it
(fdl/agent/permanent.py). Another account can fill the disk its stage or its libtorch root lives on (ENOSPC), or
plant a directory where a stage in a shared place goes (EACCES): each of those re-dials, says what is wrong and what
would mend it, and the worker joins the next run once the fault clears. Real parts: a small tmpfs filled by a
`useradd` account, a real `fdl join --persist`, a real controller on loopback, the real libtorch installer."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import need_root_or_skip
from tests.integration.join.helpers import (
    JOIN_TOKEN,
    Lines,
    controller,
    finish,
    policy,
    spawn_join,
    terminate,
    train_binary,
    wait_for,
)
from tests.join_util import SmallDisk, local_account

pytestmark = pytest.mark.slow


@pytest.fixture
def filler():
    need_root_or_skip("mounts a small tmpfs and fills it as another real account")
    with local_account("fill") as account:
        yield account


def test_a_stage_on_a_disk_another_account_filled_re_dials_until_it_is_freed(tmp_path, filler):
    """regression: prove_writable read ENOSPC as "unwritable stage": exit 2, and the unit powered the box off."""
    binary = train_binary(tmp_path)
    with SmallDisk(tmp_path / "small", size_kb=1024) as disk, controller(policy(max_hosts=1, window_s=120)) as server:
        disk.fill(filler)
        persist = spawn_join(server.address, "--persist", "--bin", str(binary), "--host", "full", "--devices",
                             "cpu:1", home=tmp_path / "h", env={"FDL_JOIN_STAGE": str(disk.path / "stage")})
        lines = Lines(persist)
        try:
            wait_for(lambda: lines.count("No space left on device (ENOSPC)") >= 2, timeout=120,
                     what="two dials that found the disk full")
            assert persist.poll() is None and not server.state()["roster"]
            assert lines.count("free space on it") >= 2  # what would mend it, each time
            disk.free()
            wait_for(lambda: lines.count("the agent exited 0; re-dialing"), timeout=180, what="a run once freed")
            state = server.state()
        finally:
            code = terminate(persist, lines)
    assert code == -signal.SIGTERM, lines.text()
    assert state["roster"][0]["host"] == "full" and state["roster"][0]["exit_code"] == 0


def test_the_libtorch_install_lock_on_a_full_disk_is_transient(tmp_path, filler):
    """regression: the install lock's file could not be made on a full disk (no inode left): PermanentError."""
    from fdl.libtorch.install import LibtorchFetchError, ensure_variant
    from fdl.libtorch.source import Source

    with SmallDisk(tmp_path / "small", size_kb=256, inodes=32) as disk:
        disk.fill(filler)
        with pytest.raises(LibtorchFetchError) as err:
            ensure_variant("cpu", source=Source(), environ={"HOME": str(disk.path / "home")})
    assert err.value.exit_code == 1
    assert "install lock" in err.value.message and "ENOSPC" in err.value.message and "Free space" in err.value.hint


def test_a_stage_directory_another_account_planted_is_transient_and_its_own_is_permanent(tmp_path):
    """regression: any write the stage refused was exit 2. In a shared place (FDL_JOIN_STAGE under /tmp, /scratch)
    another account can plant the directory first; that must not power the worker off. The worker's own read-only
    directory, or root's, is this box's own provisioning: permanent. The worker is a real account (root is not
    refused by modes)."""
    need_root_or_skip("runs the worker as another real account")
    from tests.integration.launch.helpers import fdl_python

    base = Path(tempfile.mkdtemp(prefix="fdlj-stage-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        python = fdl_python(base / "py")
        binary = train_binary(base / "bin")
        with local_account("wk") as worker, local_account("pl") as planter:
            home = base / "home"
            home.mkdir()
            os.chown(home, worker.pw_uid, worker.pw_gid)
            places = {"planted": planter, "root's": None, "own": worker}
            for name, owner in places.items():
                (base / name).mkdir(mode=0o755)
                if owner is not None:
                    os.chown(base / name, owner.pw_uid, owner.pw_gid)
            (base / "own").chmod(0o555)
            outcomes = {}
            for name in places:
                argv = ["setpriv", f"--reuid={worker.pw_uid}", f"--regid={worker.pw_gid}", "--init-groups", "env",
                        "-i", f"HOME={home}", "PATH=/usr/bin:/bin", f"FDL_JOIN_TOKEN={JOIN_TOKEN}",
                        f"FDL_JOIN_STAGE={base / name / 'stage'}", str(python), "-m", "fdl", "join", "127.0.0.1:1",
                        "--bin", str(binary), "--devices", "cpu:1"]
                done = subprocess.run(argv, cwd=home, capture_output=True, text=True, timeout=120)
                outcomes[name] = (done.returncode, done.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    code, err = outcomes["planted"]
    assert code == 1 and "Permission denied (EACCES)" in err and "next dial" in err, err
    for name in ("root's", "own"):
        code, err = outcomes[name]
        assert code == 2 and "not writable by this user" in err and "EACCES" in err, (name, err)


def test_one_shot_on_a_full_disk_exits_1(tmp_path, filler):
    binary = train_binary(tmp_path)
    with SmallDisk(tmp_path / "small", size_kb=1024) as disk:
        disk.fill(filler)
        code, _, err = finish(spawn_join("127.0.0.1:1", "--bin", str(binary), "--devices", "cpu:1",
                                         home=tmp_path / "h", env={"FDL_JOIN_STAGE": str(disk.path / "stage")}),
                              timeout=60)
    assert code == 1 and "ENOSPC" in err, err
