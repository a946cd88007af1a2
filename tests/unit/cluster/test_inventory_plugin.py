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


def inventory(source: Path, *extra: str, **settings: str) -> subprocess.CompletedProcess:
    """ansible-inventory --list as an Ansible user runs it: the collection on its path, no ansible.cfg."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON"))}
    env.update(ANSIBLE_COLLECTIONS_PATH=os.environ["FDL_TEST_COLLECTIONS"], ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="False",
               HOME=str(source.parent / ".home"), ANSIBLE_NOCOLOR="1", **settings)
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


def test_a_broken_config_fails_the_source_naming_the_file_and_fdls_message(project):
    """An AnsibleParserError (never an exit): Ansible reports it for the source, and a CI gate that sets
    unparsed_is_failed stops on it."""
    project("fdl.cluster.yml", "cluster:\n  workers:\n    - {host: a, port: 70000}\n")
    source = project("hosts.fdl.yml", "plugin: flodl.fdl.cluster\n")
    for gate in ("False", "True"):
        done = inventory(source, ANSIBLE_INVENTORY_UNPARSED_FAILED=gate)
        assert (done.returncode != 0) == (gate == "True"), done.stdout + done.stderr
        message = " ".join(done.stderr.split())  # Ansible wraps long warnings
        assert f"{source}: " in message and "fdl.cluster.yml:3" in message, done.stderr
        assert "cluster.workers[0].port" in message and "TCP port" in message, done.stderr
        assert "Traceback" not in done.stderr and "SystemExit" not in done.stderr
        assert '"a"' not in done.stdout  # no host from a broken file


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


def test_a_worker_that_is_this_machine_is_reached_locally(project):
    """fdl probes a worker at 127.0.0.1:22 natively; through the plugin it gets the local connection too, so a
    plain ansible-playbook does not try an sshd that may not be there."""
    project("fdl.cluster.yml", "cluster:\n  workers:\n    - {host: here, address: 127.0.0.1}\n"
                               "    - {host: there, address: 192.0.2.7}\n")
    hostvars = listed(project("hosts.fdl.yml", "plugin: flodl.fdl.cluster\n"))["_meta"]["hostvars"]
    assert hostvars["here"]["ansible_connection"] == "local"
    assert "ansible_connection" not in hostvars["there"]


def test_a_clone_in_place_reads_the_same_source_with_its_ansible_cfg(project, tmp_path):
    """From the repository root, with its ansible.cfg and no other collection anywhere: the clone is flodl.fdl
    itself (ansible_collections/, links to its parts), so the stock auto plugin loads this very file as
    flodl.fdl.cluster, and it reads the project with the clone's fdl package (no ansible.cfg enable list, no
    sys.path edit)."""
    project("fdl.cluster.yml", CLUSTER.replace("node-c, address: 10.0.0.13", "node-c, address: 127.0.0.1"))
    source = project("hosts.fdl.yml", "plugin: flodl.fdl.cluster\ncompose:\n  reach: ansible_host\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON"))}
    env.update(HOME=str(tmp_path / "home"), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="False")
    done = subprocess.run([str(BIN / "ansible-inventory"), "-i", str(source), "--list"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "[WARNING]" not in done.stderr, done.stderr
    data = json.loads(done.stdout)
    assert members(data, "fdl_workers") == ["node-a", "node-b", "node-c"]
    hostvars = data["_meta"]["hostvars"]
    assert hostvars["node-b"]["reach"] == "10.0.0.12" and hostvars["node-b"]["ansible_user"] == "op"
    assert hostvars["node-c"]["ansible_connection"] == "local"
    # the plugin Ansible found is the clone's own file, through the links (nothing built, nothing installed)
    doc = subprocess.run([str(BIN / "ansible-doc"), "-t", "inventory", "flodl.fdl.cluster", "--json"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    assert doc.returncode == 0, doc.stderr
    found = Path(json.loads(doc.stdout)["flodl.fdl.cluster"]["doc"]["filename"])
    assert found.resolve() == (REPO / "inventory_plugins" / "cluster.py").resolve(), found
    assert found.parent == REPO / "ansible_collections" / "flodl" / "fdl" / "plugins" / "inventory", found


def test_the_plugin_uses_ansibles_public_plugin_api_only():
    """No private Ansible name (a documented extension point of inventory plugins aside: Ansible's developer
    guide shows _read_config_data and the Constructable helpers), no override of a private method, and no edit
    of sys.path: the collection loader finds the reader beside it, in a clone and in the installed collection."""
    import ast

    from ansible.plugins.inventory import BaseInventoryPlugin, Constructable

    tree = ast.parse((REPO / "inventory_plugins" / "cluster.py").read_text())
    documented = {"_read_config_data", "_set_composite_vars", "_add_host_to_composed_groups",
                  "_add_host_to_keyed_groups"}
    own = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    bases = (BaseInventoryPlugin, Constructable)
    overridden = sorted(name for name in own - {"verify_file", "parse"} if any(hasattr(b, name) for b in bases))
    assert overridden == [], f"overrides Ansible's plugin methods beyond verify_file and parse: {overridden}"
    private = sorted({node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                      and node.attr.startswith("_") and not node.attr.startswith("__")} - documented - own)
    assert private == [], f"private Ansible names: {private}"
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert "sys" not in imported, "the plugin imports sys (to edit sys.path?)"
    for module in sorted(imported):
        if module.startswith("ansible.") and not module.startswith("ansible_collections."):
            assert module in ("ansible.errors", "ansible.plugins.inventory"), module
