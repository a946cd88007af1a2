"""The closed list of permanent failures (fdl/agent/permanent.py), decided from the worker's own configuration and
disk before the first dial, and what is not on it: a full disk another account filled, a file or another account's
directory in the stage's way, a stale mount point, a recipe whose command the fetched tree decides.

Each case runs `check` in a fresh interpreter: NVML is loaded once per process, from LD_LIBRARY_PATH as it was at
its start (the fake NVML is tests/fakes/fake_nvml.c)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import fdl_env, need_root_or_skip
from tests.join_util import SmallDisk, local_account, write_program

SCRIPT = """
import json, sys
from fdl.agent.options import resolve_options
from fdl.agent.permanent import check
from fdl.errors import FdlError
try:
    check(resolve_options(None, json.loads(sys.argv[1]), None))
except FdlError as exc:
    print(json.dumps({"code": exc.exit_code, "message": exc.message, "hint": exc.hint}))
else:
    print(json.dumps({"code": 0}))
"""


def checked(tmp_path: Path, env: dict | None = None, **flags: object) -> dict:
    """{code: 0} when nothing permanent holds, else the error's code, message and hint."""
    flags.setdefault("controller", "127.0.0.1:1")
    flags.setdefault("devices", "cpu:1")
    if "source" not in flags:
        flags.setdefault("bin", str(write_program(tmp_path / "bin" / "train", "print('train')\n")))
    base = {"FDL_JOIN_STAGE": str(tmp_path / "stage"), "HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(flags)], env=fdl_env({**base, **(env or {})}),
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_box_whose_configuration_holds_passes(tmp_path):
    assert checked(tmp_path) == {"code": 0}


@pytest.mark.parametrize("flags, says", [
    ({"source": "ftp://example.org/tree"}, "does not parse"),
    ({"source": "file:///srv/tree", "source_cwd": "../elsewhere"}, "climbs out"),
    ({"source": "file:///srv/tree", "source_bin": "/usr/bin/train"}, "not an absolute path"),
    ({"source": "file:///srv/tree", "source_build": "fdlj-no-such-compiler --release"}, "toolchain is missing"),
    ({"source": "file:///srv/tree", "source_build": "CC=clang fdlj-no-such-make all"}, "'fdlj-no-such-make'"),
    ({"bin": "/fdlj/no/such/train"}, "is not on this box"),
    ({"identity": "/fdlj/no/such/key"}, "no such key file"),
    ({"ssh": "op@127.0.0.1:2222"}, "OpenSSH client"),
    ({"libtorch": "cu128"}, "publishes no cu128 libtorch"),
])
def test_each_entry_of_the_list_is_permanent(tmp_path, flags, says):
    env = {"FDL_SSH_COMMAND": "/fdlj/no/such/ssh"} if "ssh" in flags else {}
    got = checked(tmp_path, env, **flags)
    assert got["code"] == 2 and says in got["message"], got
    assert got["hint"]  # and what would mend it


def test_a_binary_that_is_not_executable_is_permanent(tmp_path):
    binary = tmp_path / "train"
    binary.write_text("#!/bin/sh\n")
    got = checked(tmp_path, bin=str(binary))
    assert got["code"] == 2 and "not executable" in got["message"] and f"chmod +x {binary}" in got["hint"]


def test_sshfs_missing_for_its_own_data_source_is_permanent(tmp_path):
    got = checked(tmp_path, {"PATH": str(tmp_path / "empty")}, data_source="sshfs://op@127.0.0.1:/data",
                  data_path=str(tmp_path / "data"))
    assert got["code"] == 2 and "needs sshfs" in got["message"]


def test_a_door_without_a_known_hosts_entry_is_permanent_and_one_with_it_passes(tmp_path):
    # decided from this box's files alone (ssh -G, ssh-keygen -F): nothing is dialled, no door is needed
    known = tmp_path / "known_hosts"
    known.write_text("")
    command = f"ssh -F /dev/null -o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes"
    got = checked(tmp_path, {"FDL_SSH_COMMAND": command}, ssh="op@127.0.0.1:2222")
    assert got["code"] == 2 and "holds no host key for the door [127.0.0.1]:2222" in got["message"]
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "hostkey")], check=True)
    kind, blob = (tmp_path / "hostkey.pub").read_text().split()[:2]
    known.write_text(f"[127.0.0.1]:2222 {kind} {blob}\n")
    assert checked(tmp_path, {"FDL_SSH_COMMAND": command}, ssh="op@127.0.0.1:2222") == {"code": 0}


@pytest.mark.parametrize("script, says", [("", "nothing to offer"), ("H100:9.0:80G", "GPU 3")])
def test_no_gpu_when_gpus_are_asked_for_is_permanent(tmp_path, fake_nvml, script, says):
    got = checked(tmp_path, fake_nvml.env(script), devices="all" if not script else "3")
    assert got["code"] == 2 and says in got["message"], got
    assert checked(tmp_path, fake_nvml.env(""), devices="cpu:2") == {"code": 0}  # CPU ranks need no GPU


def test_auto_over_gpus_no_single_build_serves_is_permanent(tmp_path, fake_nvml):
    got = checked(tmp_path, fake_nvml.env("P100:6.0:16G,B200:10.0:180G"), devices="all", libtorch="auto")
    assert got["code"] == 2 and "no precompiled libtorch serves" in got["message"]


def test_a_read_only_stage_is_permanent(tmp_path):
    need_root_or_skip("mounts a read-only tmpfs (EROFS refuses root too)")
    with SmallDisk(tmp_path / "ro", read_only=True) as disk:
        got = checked(tmp_path, {"FDL_JOIN_STAGE": str(disk.path / "stage")})
        libtorch = checked(tmp_path, {"HOME": str(disk.path)}, libtorch="cpu")
    assert got["code"] == 2 and "not writable by this user" in got["message"] and "EROFS" in got["message"]
    assert libtorch["code"] == 2 and str(disk.path / ".flodl" / "libtorch") in libtorch["message"]


def test_a_read_only_working_directory_for_the_ranks_is_permanent(tmp_path):
    need_root_or_skip("mounts a read-only tmpfs")
    binary = write_program(tmp_path / "train", "print('train')\n")
    with SmallDisk(tmp_path / "ro", read_only=True) as disk:
        done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps({"controller": "h", "devices": "cpu:1",
                                                                        "bin": str(binary)})],
                              env=fdl_env({"FDL_JOIN_STAGE": str(tmp_path / "stage")}), cwd=disk.path,
                              capture_output=True, text=True, timeout=60)
    got = json.loads(done.stdout)
    assert got["code"] == 2 and str(disk.path) in got["message"]


def test_a_full_disk_is_not_permanent(tmp_path):
    """regression: a stage on a disk another account filled (ENOSPC) exited 2, and the unit powered the box off."""
    need_root_or_skip("mounts a small tmpfs and fills it as another account")
    with local_account("fill") as other, SmallDisk(tmp_path / "small", size_kb=512, inodes=64) as disk:
        disk.fill(other)
        assert checked(tmp_path, {"FDL_JOIN_STAGE": str(disk.path / "stage")}) == {"code": 0}
        assert checked(tmp_path, {"HOME": str(disk.path / "home")}, libtorch="cpu") == {"code": 0}


def test_a_file_in_the_stages_way_is_not_permanent(tmp_path):
    (tmp_path / "blocker").write_text("a file where the stage must go")
    assert checked(tmp_path, {"FDL_JOIN_STAGE": str(tmp_path / "blocker" / "stage")}) == {"code": 0}


def test_a_recipe_whose_command_the_tree_decides_is_left_to_the_build(tmp_path):
    for recipe in ("./build.sh", "$CARGO build", "cd ddp && make", "sh -c 'exit 3'"):
        assert checked(tmp_path, source="file:///srv/tree", source_build=recipe) == {"code": 0}, recipe


def test_a_stale_data_mount_point_is_not_permanent(tmp_path):
    need_root_or_skip("a FUSE mount whose daemon is gone (sshfs killed) stands for a stale mount")
    from tests.join_util import LoopbackSshd, user_name

    exported = tmp_path / "exported"
    exported.mkdir()
    mountpoint = tmp_path / "data"
    mountpoint.mkdir()
    with LoopbackSshd(tmp_path / "sshd") as sshd:
        mounted = subprocess.Popen(
            ["sshfs", "-f", "-o", f"ro,port={sshd.port},IdentityFile={sshd.key},ssh_command="
             + sshd.ssh_command.replace(" ", "\\ "), f"{user_name()}@127.0.0.1:{exported}", str(mountpoint)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            from tests.integration.join.helpers import wait_for

            wait_for(lambda: os.path.ismount(mountpoint), timeout=30, what="the sshfs mount")
            mounted.kill()  # the FUSE daemon is gone: the mount point cannot be stat'ed (ENOTCONN)
            mounted.wait()
            with pytest.raises(OSError):
                os.statvfs(mountpoint)
            got = checked(tmp_path, data_source=f"sshfs://op@127.0.0.1:{exported}", data_path=str(mountpoint))
        finally:
            subprocess.run(["fusermount3", "-uz", str(mountpoint)], capture_output=True)
    assert got == {"code": 0}


def test_a_join_block_that_does_not_parse_is_permanent(tmp_path):
    from fdl.agent.permanent import read_options
    from fdl.errors import ConfigError

    def load():
        raise ConfigError("fdl.yml line 3: join.persist: expected true or false", errors=["a", "b"])

    with pytest.raises(ConfigError) as err:
        read_options(load, {}, None)
    assert err.value.exit_code == 2 and err.value.errors == ["a", "b"] and "join.persist" in err.value.message
