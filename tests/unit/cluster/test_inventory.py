"""build_inventory / inventory_from_file: the hosts, groups and variables both Ansible callers see."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fdl.cluster.inventory import (
    arch_group,
    env_of_file,
    inventory_from_file,
    local_inventory,
)
from fdl.errors import ConfigError

CLUSTER = """\
cluster:
  controller: {host: 10.0.0.1, port: 1400}
  ssh: {user: op, identity: keys/id_ed25519}
  workers:
    - host: node-a
      address: 10.0.0.1
      arch: precompiled/cu128
      local_devices: [0, 1]
    - host: node-b
      address: 10.0.0.12
      user: other
      port: 2222
      identity: ~/.ssh/other
      arch: builds/sm61-sm120
      local_devices: cpu:2
      env: {LD_PRELOAD: /srv/nccl/libnccl.so.2}
      data_path: /mnt/data
      python: /opt/py/bin/python3
"""


def test_groups_follow_role_and_arch(project):
    inv, _ = inventory_from_file(project("fdl.cluster.yml", CLUSTER))
    assert inv.groups["fdl_workers"] == ["node-a", "node-b"]
    assert inv.groups["fdl_controller"] == ["node-a"]  # the worker whose address is the controller host
    assert inv.groups["arch_precompiled_cu128"] == ["node-a"]
    assert inv.groups["arch_builds_sm61_sm120"] == ["node-b"]
    assert inv.all_vars == {"fdl_controller_host": "10.0.0.1", "fdl_controller_port": 1400}


def test_hostvars_carry_connection_and_fdl_settings(project, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    inv, _ = inventory_from_file(project("fdl.cluster.yml", CLUSTER))
    a = inv.hosts["node-a"].vars
    assert a == {
        "ansible_host": "10.0.0.1", "ansible_port": 22, "ansible_user": "op",
        "ansible_ssh_private_key_file": str(project.root / "keys" / "id_ed25519"),  # relative to the project
        "ansible_python_interpreter": "/usr/bin/python3",
        "fdl_arch": "precompiled/cu128", "fdl_local_devices": "0,1", "fdl_env": {}, "fdl_data_path": "/flodl/data",
    }
    b = inv.hosts["node-b"].vars
    assert b["ansible_user"] == "other" and b["ansible_port"] == 2222
    assert b["ansible_ssh_private_key_file"] == str(tmp_path / "home" / ".ssh" / "other")
    assert b["ansible_python_interpreter"] == "/opt/py/bin/python3"
    assert b["fdl_local_devices"] == "cpu:2"
    assert b["fdl_env"] == {"LD_PRELOAD": "/srv/nccl/libnccl.so.2"}
    assert b["fdl_data_path"] == "/mnt/data"


def test_a_controller_that_runs_no_ranks_is_its_own_host(project):
    path = project("fdl.cluster.yml", """\
        cluster:
          controller: 10.0.0.99:1337
          ssh: {user: op}
          workers: [{host: node-a, address: 10.0.0.1}]
        """)
    inv, _ = inventory_from_file(path)
    assert inv.groups["fdl_controller"] == ["10.0.0.99"]
    assert inv.hosts["10.0.0.99"].vars["ansible_user"] == "op"
    assert "10.0.0.99" not in inv.groups["fdl_workers"]


def test_default_loopback_controller_is_reached_locally(project):
    inv, _ = inventory_from_file(project("fdl.cluster.yml", "cluster:\n  workers: [{host: node-a}]\n"))
    assert inv.hosts["127.0.0.1"].vars["ansible_connection"] == "local"
    assert inv.hosts["node-a"].vars["ansible_host"] == "node-a"  # the name is the address unless address: is set


def test_a_worker_that_is_this_machine_gets_the_local_connection(project):
    """fdl probes and runs a worker at one of this machine's addresses without ssh; the inventory (fdl's and the
    plugin's) says the same, so plain ansible-playbook reaches it too (it has no sshd to answer). Its interpreter
    is fdl's own unless its python: names one, as over ssh it is /usr/bin/python3 unless named."""
    inv, _ = inventory_from_file(project("fdl.cluster.yml", """\
        cluster:
          workers:
            - {host: here, address: 127.0.0.1, user: op}
            - {host: named, address: 127.0.0.1, python: /opt/py/bin/python3}
            - {host: tunnel, address: 127.0.0.1, port: 2222}
            - {host: there, address: 192.0.2.7}
        """))
    assert inv.hosts["here"].vars["ansible_connection"] == "local"
    assert inv.hosts["here"].vars["ansible_python_interpreter"] == sys.executable  # fdl's own
    assert inv.hosts["named"].vars["ansible_python_interpreter"] == "/opt/py/bin/python3"  # the worker's python:
    assert inv.hosts["there"].vars["ansible_python_interpreter"] == "/usr/bin/python3"
    assert "ansible_connection" not in inv.hosts["tunnel"].vars  # a loopback port other than 22: a tunnel
    assert "ansible_connection" not in inv.hosts["there"].vars


def test_local_inventory_is_this_machine_alone_without_ssh(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # not the account's home in the password database
    inv = local_inventory()
    assert list(inv.hosts) == ["localhost"] and inv.workers == []
    # async jobs are looked for where they are written: under $HOME, not under ~user (ansible-core's default)
    assert inv.to_ansible()["all"]["hosts"] == {
        "localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                      "ansible_async_dir": str(tmp_path / ".ansible_async")}}
    named = local_inventory("pascal-box", python="/opt/py/bin/python3")
    assert named.subset(["pascal-box"]).hosts["pascal-box"].vars["ansible_python_interpreter"] == "/opt/py/bin/python3"


def test_overlay_merges_over_base(project):
    project("fdl.yml", "cluster:\n  ssh: {user: base-user}\n  workers: [{host: from-base}]\n")
    inv, config = inventory_from_file(project("fdl.cluster.yml", "cluster:\n  workers: [{host: from-overlay}]\n"))
    assert list(inv.groups["fdl_workers"]) == ["from-overlay"]  # lists are replaced, not appended
    assert inv.hosts["from-overlay"].vars["ansible_user"] == "base-user"  # maps merge
    assert [p.name for p in config.files] == ["fdl.yml", "fdl.cluster.yml"]


def test_the_env_comes_from_the_file_name(project):
    project("fdl.yml", "cluster:\n  workers: [{host: base-host}]\n")
    project("fdl.farm.yml", "cluster:\n  workers: [{host: farm-host}]\n")
    base, _ = inventory_from_file(project.root / "fdl.yml")
    farm, _ = inventory_from_file(project.root / "fdl.farm.yml")
    assert base.groups["fdl_workers"] == ["base-host"]
    assert farm.groups["fdl_workers"] == ["farm-host"]


def test_no_cluster_block_is_an_empty_inventory(project):
    inv, _ = inventory_from_file(project.root / "fdl.yml")
    assert inv.hosts == {}


def test_config_errors_name_file_line_and_key(project):
    path = project("fdl.cluster.yml", "cluster:\n  workers:\n    - host: a\n      port: 70000\n")
    with pytest.raises(ConfigError) as exc:
        inventory_from_file(path)
    assert "fdl.cluster.yml:4" in exc.value.message
    assert "cluster.workers[0].port" in exc.value.message


def test_an_overlay_away_from_its_base_is_refused(project):
    sub = project.root / "sub"
    sub.mkdir()
    stray = sub / "fdl.cluster.yml"
    stray.write_text("cluster:\n  workers: [{host: a}]\n")
    with pytest.raises(ConfigError) as exc:
        inventory_from_file(stray)
    assert "An overlay must sit next to its base fdl.yml" in exc.value.message


def test_subset_keeps_groups_consistent(project):
    inv, _ = inventory_from_file(project("fdl.cluster.yml", CLUSTER))
    sub = inv.subset(["node-b"])
    assert list(sub.hosts) == ["node-b"]
    assert sub.groups["fdl_workers"] == ["node-b"] and sub.groups["fdl_controller"] == []
    ansible = sub.to_ansible()
    assert "fdl_controller" not in ansible["all"]["children"]  # empty groups are left out
    assert ansible["all"]["children"]["fdl_workers"] == {"hosts": {"node-b": None}}
    with pytest.raises(KeyError):
        inv.subset(["nope"])


@pytest.mark.parametrize("name, expected", [
    ("fdl.yml", (True, None)), ("fdl.cluster.yml", (True, "cluster")), ("fdl.b300.yaml", (True, "b300")),
    ("fdl.json", (True, None)), ("cluster.yml", (False, None)), ("fdl.a.b.yml", (False, None)),
    ("prod.fdl_cluster.yml", (False, None)),
])
def test_env_of_file(name, expected):
    assert env_of_file(Path(name)) == expected


def test_arch_group_names_are_ansible_safe():
    assert arch_group("precompiled/cu128") == "arch_precompiled_cu128"
    assert arch_group("builds/sm61-sm120") == "arch_builds_sm61_sm120"
    assert arch_group("rocm7.0") == "arch_rocm7_0"
