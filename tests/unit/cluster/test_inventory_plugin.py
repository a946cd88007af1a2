"""The flodl.fdl.cluster inventory plugin as users run it: ansible-inventory, no ansible.cfg, the source file
enabled by Ansible's stock `auto` plugin, the collection (assembled from this clone) found on
ANSIBLE_COLLECTIONS_PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fdl.collection import assemble
from tests.conftest import REPO

BIN = Path(sys.executable).parent
CLUSTER = """\
cluster:
  controller: {host: 10.0.0.1}
  ssh: {user: op, identity: /keys/id}
  workers:
    - {host: node-a, address: 10.0.0.1, arch: precompiled/cu128, local_devices: [0, 1]}
    - {host: node-b, address: 10.0.0.12, arch: builds/sm61-sm120, env: {LD_PRELOAD: /x/libnccl.so.2}}
    - {host: node-c, address: 10.0.0.13, arch: precompiled/cu128, python: /usr/bin/python3.11}
"""


@pytest.fixture(scope="module")
def collections(tmp_path_factory) -> Path:
    """A collections path holding the flodl.fdl tree assembled from this clone."""
    path = tmp_path_factory.mktemp("collections")
    assemble(path)
    return path


@pytest.fixture(autouse=True)
def _collections(collections, monkeypatch):
    monkeypatch.setenv("FDL_TEST_COLLECTIONS", str(collections))


def inventory(source: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=os.environ["FDL_TEST_COLLECTIONS"], PYTHONPATH=str(REPO),
               HOME=str(source.parent / ".home"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([str(BIN / "ansible-inventory"), "-i", str(source), "--list", *extra], cwd=source.parent,
                          env=env, capture_output=True, text=True, timeout=120)


def listed(source: Path) -> dict:
    done = inventory(source)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def members(data: dict, group: str) -> list[str]:
    return sorted(data.get(group, {}).get("hosts", []))


def test_groups_and_hostvars_with_no_ansible_cfg(project):
    project("fdl.cluster.yml", CLUSTER)
    data = listed(project("hosts.fdl.yml", "plugin: flodl.fdl.cluster\n"))
    assert members(data, "fdl_workers") == ["node-a", "node-b", "node-c"]
    assert members(data, "fdl_controller") == ["node-a"]
    assert members(data, "arch_precompiled_cu128") == ["node-a", "node-c"]
    assert members(data, "arch_builds_sm61_sm120") == ["node-b"]
    hostvars = data["_meta"]["hostvars"]
    b = hostvars["node-b"]
    assert b["ansible_host"] == "10.0.0.12" and b["ansible_user"] == "op" and b["ansible_port"] == 22
    assert b["ansible_ssh_private_key_file"] == "/keys/id"
    assert b["fdl_env"] == {"LD_PRELOAD": "/x/libnccl.so.2"} and b["fdl_arch"] == "builds/sm61-sm120"
    assert hostvars["node-c"]["ansible_python_interpreter"] == "/usr/bin/python3.11"
    assert hostvars["node-a"]["fdl_local_devices"] == "0,1"
    assert b["fdl_controller_port"] == 1337  # all-hosts variables reach every host


def test_compose_groups_and_keyed_groups_like_constructed(project):
    project("fdl.cluster.yml", CLUSTER)
    data = listed(project("hosts.fdl.yml", """\
        plugin: flodl.fdl.cluster
        compose:
          gpu_count: fdl_local_devices.split(',') | length
          reach: ansible_host ~ ':' ~ ansible_port
        groups:
          source_built: fdl_arch.startswith('builds/')
        keyed_groups:
          - key: fdl_arch.split('/')[0]
            prefix: kind
        """))
    hostvars = data["_meta"]["hostvars"]
    assert hostvars["node-a"]["gpu_count"] == 2 and hostvars["node-a"]["reach"] == "10.0.0.1:22"
    assert members(data, "source_built") == ["node-b"]
    assert members(data, "kind_precompiled") == ["node-a", "node-c"] and members(data, "kind_builds") == ["node-b"]


def test_strict_makes_a_broken_expression_an_error(project):
    project("fdl.cluster.yml", CLUSTER)
    source = project("hosts.fdl.yml", "plugin: flodl.fdl.cluster\nstrict: true\ncompose:\n  x: no_such_var.y\n")
    done = inventory(source)
    assert "no_such_var" in done.stderr, done.stderr  # strict: the broken expression fails the source
    assert "node-a" not in done.stdout
    lax = project("lax.fdl.yml", "plugin: flodl.fdl.cluster\ncompose:\n  x: no_such_var.y\n")
    assert "x" not in listed(lax)["_meta"]["hostvars"]["node-a"]


def test_a_source_elsewhere_names_the_project_and_env(project, tmp_path):
    project("fdl.farm.yml", CLUSTER)
    ops = tmp_path / "ops"
    ops.mkdir()
    source = ops / "prod.fdl.yml"
    source.write_text(f"plugin: flodl.fdl.cluster\nproject_dir: ../{project.root.name}\nenv: farm\n")
    assert members(listed(source), "fdl_workers") == ["node-a", "node-b", "node-c"]


def test_an_empty_env_reads_the_base_file_alone(project):
    project("fdl.yml", "commands:\n  test: echo hi\n" + CLUSTER)
    project("fdl.cluster.yml", "cluster:\n  workers:\n    - {host: other}\n")
    data = listed(project("base.fdl.yml", "plugin: flodl.fdl.cluster\nenv: ''\n"))
    assert members(data, "fdl_workers") == ["node-a", "node-b", "node-c"]


def test_a_file_not_named_for_the_plugin_is_not_claimed(project):
    project("fdl.cluster.yml", CLUSTER)
    done = inventory(project("hosts.yml", "plugin: flodl.fdl.cluster\n"))
    assert "node-a" not in done.stdout
    assert "flodl.fdl.cluster" in done.stderr or "Unable to parse" in done.stderr


def test_broken_config_stops_ansible_with_fdls_message(project):
    project("fdl.cluster.yml", "cluster:\n  workers:\n    - {host: a, port: 70000}\n")
    done = inventory(project("hosts.fdl.yml", "plugin: flodl.fdl.cluster\n"))
    assert done.returncode == 1, done.stdout
    assert "fdl.cluster.yml:3" in done.stderr and "cluster.workers[0].port" in done.stderr, done.stderr
    assert "TCP port" in done.stderr


def test_no_workers_is_a_warning_and_an_empty_inventory(project):
    done = inventory(project("hosts.fdl.yml", "plugin: flodl.fdl.cluster\nenv: ''\n"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["_meta"]["hostvars"] == {}
    assert "defines no cluster hosts" in done.stderr


def test_the_plugin_documents_its_options(collections):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    done = subprocess.run([str(BIN / "ansible-doc"), "-t", "inventory", "flodl.fdl.cluster", "--json"],
                          env={**env, "ANSIBLE_COLLECTIONS_PATH": str(collections)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    options = json.loads(done.stdout)["flodl.fdl.cluster"]["doc"]["options"]
    for field in ("plugin", "project_dir", "env", "compose", "groups", "keyed_groups", "strict"):
        assert field in options, field
