"""A built wheel, installed away from the clone, carries the flodl.fdl collection and runs through it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_wheel_carries_the_collection_and_the_shipped_files(tmp_path: Path) -> None:
    wheel_dir = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir), str(REPO)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    (wheel,) = wheel_dir.glob("fdl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for kind in ("templates", "packer"):
        assert any(n.startswith(f"fdl/_share/{kind}/") for n in names), kind
    tree = "fdl/_share/collections/ansible_collections/flodl/fdl/"
    for path in ("galaxy.yml", "meta/runtime.yml", "playbooks/probe.yml", "roles/fdl_probe/tasks/main.yml",
                 "plugins/modules/fdl_probe.py", "plugins/inventory/cluster.py",
                 "plugins/module_utils/checks/probe.py", "plugins/module_utils/supervisor.py",
                 "plugins/module_utils/farm/doors.py", "plugins/module_utils/pynvml_packed.py",
                 "plugins/module_utils/pynvml.LICENSE.txt"):
        assert tree + path in names, path
    # the module_utils are the package's own files, copied at build time (not links, not a second source)
    wheel_zip = zipfile.ZipFile(wheel)
    assert wheel_zip.read(tree + "plugins/module_utils/checks/probe.py") == \
        (REPO / "fdl/hostside/checks/probe.py").read_bytes()
    assert "fdl/controller/page.html" in names  # the controller's status page (GET /)
    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                              str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr
    probe = ("import fdl.resources as r; print(r.share_dir()); print(r.PACKAGE_DIR); print(r.collections_path()); "
             "from fdl.controller.routes import status_page; assert b'state.json' in status_page().body")
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    share, package, collections = out.stdout.split()
    assert Path(package) == target / "fdl"
    assert Path(share) == target / "fdl" / "_share"
    # an installed fdl runs the collection its wheel carries: nothing is built into the cache
    assert Path(collections) == target / "fdl" / "_share" / "collections"
    assert (Path(collections) / "ansible_collections/flodl/fdl/playbooks/probe.yml").is_file()
    # with the shipped ansible.cfg a hosts.fdl.yml reads through the collection's plugin (the stock auto plugin
    # enables it), and nothing the file names is missing (no warning)
    project = tmp_path / "project"
    project.mkdir()
    (project / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
    (project / "fdl.cluster.yml").write_text("cluster:\n  workers:\n    - {host: node-a, address: 192.0.2.7}\n")
    (project / "hosts.fdl.yml").write_text("plugin: flodl.fdl.cluster\n")
    ansible_env = {k: v for k, v in env.items() if not k.startswith("ANSIBLE_")}
    ansible_env.update(ANSIBLE_CONFIG=share + "/ansible.cfg", ANSIBLE_COLLECTIONS_PATH=collections,
                       HOME=str(tmp_path / "home"), ANSIBLE_NOCOLOR="1")
    listed = subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i", "hosts.fdl.yml", "--list"],
                            capture_output=True, text=True, env=ansible_env, cwd=project, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "[WARNING]" not in listed.stderr, listed.stderr
    assert "node-a" in listed.stdout and "192.0.2.7" in listed.stdout
