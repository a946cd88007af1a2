"""What the runner pins for every ansible-playbook it starts, and the playbook contract it relies on."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import yaml

from fdl.cluster.connection import ansible_bin_dir, ansible_environment, control_path_dir, ready_control_path_dir
from fdl.cluster.runner import RUN_ID_VAR
from fdl.cluster.ssh import ssh_options
from fdl.errors import FdlError
from fdl.resources import collection_root, share_dir
from tests.conftest import REPO, need_root_or_skip


def test_settings_come_from_the_shipped_config_and_beat_stray_environment(monkeypatch, short_tmp):
    tmp_path = short_tmp
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("ANSIBLE_PIPELINING", "False")  # a user's setting must not slow fdl down
    env = ansible_environment(7)
    assert env["ANSIBLE_CONFIG"] == str(share_dir() / "ansible.cfg")
    assert env["ANSIBLE_PIPELINING"] == "True"
    assert env["ANSIBLE_GATHERING"] == "explicit"
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert "StrictHostKeyChecking=accept-new" in env["ANSIBLE_SSH_ARGS"]
    assert "ControlPersist=" in env["ANSIBLE_SSH_ARGS"]
    assert env["ANSIBLE_SSH_CONTROL_PATH"] == "%(directory)s/%%C"
    assert env["ANSIBLE_SSH_CONTROL_PATH_DIR"] == str(tmp_path / "fdl" / "cp")
    assert env["ANSIBLE_FORKS"] == "7"
    assert env["PATH"].split(os.pathsep)[0] == str(ansible_bin_dir())
    assert (ansible_bin_dir() / "ansible-playbook").exists()
    assert "ANSIBLE_ROLES_PATH" not in env and "ANSIBLE_LIBRARY" not in env  # the collection holds it all
    assert env["ANSIBLE_COLLECTIONS_SCAN_SYS_PATH"] == "False"
    tree = Path(env["ANSIBLE_COLLECTIONS_PATH"]) / "ansible_collections" / "flodl" / "fdl"
    assert (tree / "plugins" / "module_utils" / "checks" / "probe.py").is_file()
    # the legacy module_utils path holds the tree's module_utils and nothing else
    assert env["ANSIBLE_MODULE_UTILS"] == str(tree / "plugins" / "module_utils")


def test_control_sockets_move_to_a_short_path_when_the_cache_is_deep(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ("d" * 80)))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert len(str(control_path_dir())) < 50


@pytest.fixture
def deep_cache(monkeypatch, short_tmp):
    """A cache path too long for sockets and a stand-in for /tmp: the fallback is short_tmp/t/fdl-cp-UID."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(short_tmp / ("d" * 80)))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    (short_tmp / "t").mkdir(mode=0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(short_tmp / "t"))
    return short_tmp / "t" / f"fdl-cp-{os.getuid()}"


def test_a_fresh_control_path_directory_is_made_0700(deep_cache):
    assert ready_control_path_dir() == deep_cache
    assert stat.S_IMODE(deep_cache.stat().st_mode) == 0o700 and deep_cache.stat().st_uid == os.getuid()


@pytest.mark.parametrize("plant", ["other-user-0777", "own-0777", "symlink"])
def test_a_control_path_directory_someone_else_could_write_is_refused(deep_cache, plant):
    """regression: /tmp/fdl-cp-<uid> was used even when another user created it first, 0777."""
    if plant == "symlink":
        target = deep_cache.parent / "elsewhere"
        target.mkdir(mode=0o700)
        deep_cache.symlink_to(target)
    else:
        deep_cache.mkdir()
        os.chmod(deep_cache, 0o777)
        if plant == "other-user-0777":
            need_root_or_skip("gives a directory to another user")
            os.chown(deep_cache, 65534, 65534)
    for use in (lambda: ansible_environment(1), ssh_options):
        with pytest.raises(FdlError) as caught:
            use()
        message = caught.value.message
        assert str(deep_cache) in message and "not private" in message
    assert {"other-user-0777": "belongs to uid 65534", "own-0777": "mode is 0777",
            "symlink": "symbolic link"}[plant] in message


def test_xdg_runtime_dir_is_preferred_when_private(monkeypatch, short_tmp):
    runtime = short_tmp / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("XDG_CACHE_HOME", str(short_tmp / "cache"))
    assert ready_control_path_dir() == runtime / "fdl-cp"
    os.chmod(runtime, 0o755)  # not what the spec promises: not used
    assert control_path_dir() == short_tmp / "cache" / "fdl" / "cp"


def test_a_clone_runs_the_collection_built_into_the_cache_once_per_content(monkeypatch, tmp_path):
    from fdl import collection

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    source = tmp_path / "src"
    import shutil

    for _, part in collection.PARTS:
        shutil.copytree(collection.REPO_ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(collection.REPO_ROOT / collection.LICENSE, source / collection.LICENSE)
    first = collection.built_in_cache(source)
    tree = first / "ansible_collections" / "flodl" / "fdl"
    utils = tree / "plugins" / "module_utils"
    assert first.parent == tmp_path / "cache" / "fdl" / "collections"
    assert first.name.startswith(collection.version() + "-")
    # real files, the very bytes of the package: no links, nothing assembled on the hosts' side
    assert not (utils / "checks" / "probe.py").is_symlink()
    for name in ("checks/probe.py", "supervisor.py", "farm/doors.py"):  # module_utils is fdl/hostside/
        assert (utils / name).read_bytes() == (REPO / "fdl" / "hostside" / name).read_bytes(), name
    assert "Redistribution and use" in (utils / "pynvml.LICENSE.txt").read_text()
    assert collection.built_in_cache(source) == first  # made once, then reused
    (source / "playbooks" / "probe.yml").write_text((source / "playbooks" / "probe.yml").read_text() + "# edit\n")
    second = collection.built_in_cache(source)
    assert second != first and (second / "ansible_collections/flodl/fdl/playbooks/probe.yml").read_text().endswith(
        "# edit\n")


def test_pynvml_ships_packed_and_loads_as_pynvml_on_a_bare_interpreter(tmp_path):
    """The collection carries pynvml as one compressed literal (Ansible would parse 330 KB of source on every
    run otherwise); on a host without pynvml, load() must give the very module, once, under the name pynvml."""
    from fdl import collection

    utils = collection.assemble(tmp_path / "tree") / "plugins" / "module_utils"
    assert not (utils / "pynvml.py").exists()
    packed = (utils / "pynvml_packed.py").read_text()
    assert max(len(line) for line in packed.splitlines()) <= 120  # the collection's pep8 sanity, no exception
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import pynvml_packed as p\n"
            "m = p.load(); assert p.load() is m and sys.modules['pynvml'] is m\n"
            "import pynvml; assert pynvml is m\n"
            "print(m.nvmlInit.__name__, m.NVML_SUCCESS)")
    done = subprocess.run([sys.executable, "-S", "-c", code, str(utils)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["nvmlInit", "0"]
    # the code the hosts run is NVIDIA's, byte for byte
    import base64
    import zlib

    scope: dict = {}
    exec(packed, scope)
    assert zlib.decompress(base64.b64decode("".join(scope["_PACKED"]))) == collection.pynvml_file().read_bytes()


def test_every_shipped_playbook_marks_its_processes_with_the_run_id():
    """The Ctrl-C sweep finds a run's remote processes by FDL_RUN_ID: every play must export it."""
    for path in sorted((collection_root() / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(path.read_text()):
            environment = play.get("environment") or {}
            assert "FDL_RUN_ID" in environment and RUN_ID_VAR in environment["FDL_RUN_ID"], (path.name, play["name"])


def test_a_local_probe_never_loads_ansible(tmp_path):
    code = textwrap.dedent("""
        import sys
        from fdl.cli.main import main
        main(["probe", "--json", "--skip-mount"])
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("ansible", "ansible_runner"))
        print("LOADED:" + ",".join(loaded))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "LOADED:"


def test_progress_table_shows_each_hosts_state_and_task():
    from rich.console import Console

    from fdl.cluster.events import HostResult
    from fdl.progress import HostsProgress

    progress = HostsProgress("probe", ["node-a", "node-b", "node-c"])
    progress.update({"node-a": HostResult("node-a", status="ok"),
                     "node-b": HostResult("node-b", status="running", current_task="Probe this host"),
                     "node-c": HostResult("node-c", status="unreachable", message="Permission denied (publickey)")})
    console = Console(record=True, width=100)
    console.print(progress)
    text = console.export_text()
    assert "probe: 2/3 hosts done" in text
    assert "node-b" in text and "running" in text and "Probe this host" in text
    assert "unreachable" in text and "Permission denied (publickey)" in text


def test_an_unwritable_cache_is_a_clear_fdl_error(monkeypatch, tmp_path):
    from fdl import collection
    from fdl.errors import FdlError

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    with pytest.raises(FdlError, match=r"could not write the flodl\.fdl collection") as caught:
        collection.built_in_cache()
    assert caught.value.hint and "XDG_CACHE_HOME" in caught.value.hint
