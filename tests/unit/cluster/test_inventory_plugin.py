"""The fdl_cluster inventory plugin, driven the way Ansible drives it, into a real InventoryData."""

from __future__ import annotations

import pytest

from fdl.resources import inventory_plugins_dir

CLUSTER = """\
cluster:
  controller: {host: 10.0.0.1}
  ssh: {user: op, identity: /keys/id}
  workers:
    - {host: node-a, address: 10.0.0.1, arch: precompiled/cu128, local_devices: [0, 1]}
    - {host: node-b, address: 10.0.0.12, arch: builds/sm61-sm120, env: {LD_PRELOAD: /x/libnccl.so.2}}
    - {host: node-c, address: 10.0.0.13, arch: precompiled/cu128, python: /usr/bin/python3.11}
"""


@pytest.fixture
def plugin():
    from ansible.plugins.loader import inventory_loader

    inventory_loader.add_directory(str(inventory_plugins_dir()))
    found = inventory_loader.get("fdl_cluster")
    assert found is not None, "the fdl_cluster plugin did not load"
    return found


def parse(plugin, path):
    from ansible.inventory.data import InventoryData
    from ansible.parsing.dataloader import DataLoader

    data = InventoryData()
    plugin.parse(data, DataLoader(), str(path))
    return data


def test_groups_and_hostvars(plugin, project):
    data = parse(plugin, project("fdl.cluster.yml", CLUSTER))
    members = {name: sorted(h.name for h in group.get_hosts()) for name, group in data.groups.items()}
    assert members["fdl_workers"] == ["node-a", "node-b", "node-c"]
    assert members["fdl_controller"] == ["node-a"]
    assert members["arch_precompiled_cu128"] == ["node-a", "node-c"]
    assert members["arch_builds_sm61_sm120"] == ["node-b"]
    b = data.get_host("node-b").get_vars()
    assert b["ansible_host"] == "10.0.0.12" and b["ansible_user"] == "op" and b["ansible_port"] == 22
    assert b["ansible_ssh_private_key_file"] == "/keys/id"
    assert b["fdl_env"] == {"LD_PRELOAD": "/x/libnccl.so.2"}
    assert b["fdl_arch"] == "builds/sm61-sm120"
    assert data.get_host("node-c").get_vars()["ansible_python_interpreter"] == "/usr/bin/python3.11"
    assert data.get_host("node-a").get_vars()["fdl_local_devices"] == "0,1"
    assert data.groups["all"].get_vars()["fdl_controller_port"] == 1337


@pytest.mark.parametrize("name, text, wanted", [
    ("fdl.cluster.yml", CLUSTER, True),
    ("fdl.yml", CLUSTER, True),
    ("fdl.farm.yaml", CLUSTER, True),
    ("fdl.cluster.yml", "plugin: aws_ec2\n", False),  # someone else's plugin file with our name
    ("cluster.yml", CLUSTER, False),
    ("hosts.ini", "[web]\nhost1\n", False),
    ("prod.fdl_cluster.yml", "plugin: fdl_cluster\nproject_dir: .\n", True),
])
def test_verify_file_claims_fdl_files_only(plugin, project, name, text, wanted):
    assert plugin.verify_file(str(project(name, text))) is wanted


def test_config_file_form_points_at_a_project_elsewhere(plugin, project, tmp_path):
    project("fdl.cluster.yml", CLUSTER)
    elsewhere = tmp_path / "ops"
    elsewhere.mkdir()
    config = elsewhere / "prod.fdl_cluster.yml"
    config.write_text(f"plugin: fdl_cluster\nproject_dir: {project.root}\nenv: cluster\n")
    data = parse(plugin, config)
    assert sorted(h.name for h in data.groups["fdl_workers"].get_hosts()) == ["node-a", "node-b", "node-c"]


def test_broken_config_stops_ansible_with_fdls_message(plugin, project, capsys):
    path = project("fdl.cluster.yml", "cluster:\n  workers:\n    - {host: a, port: 70000}\n")
    with pytest.raises(SystemExit) as exc:
        parse(plugin, path)
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "fdl.cluster.yml:3" in err and "cluster.workers[0].port" in err and "TCP port" in err


def test_broken_config_file_form_is_a_parser_error(plugin, project, tmp_path):
    from ansible.errors import AnsibleParserError

    project("fdl.cluster.yml", "cluster:\n  workers:\n    - {host: 'a b'}\n")
    config = tmp_path / "x.fdl_cluster.yml"
    config.write_text(f"plugin: fdl_cluster\nproject_dir: {project.root}\nenv: cluster\n")
    with pytest.raises(AnsibleParserError, match=r"cluster\.workers\[0\]\.host"):
        parse(plugin, config)


def test_no_workers_is_a_warning_and_an_empty_inventory(plugin, project, capsys):
    data = parse(plugin, project.root / "fdl.yml")
    assert [h.name for h in data.groups["all"].get_hosts()] == []
    assert "defines no cluster hosts" in capsys.readouterr().err
