"""cluster.execution_nodes and a worker's via: are checked like every key: file, line and key path for a node name
nobody defined, a via: chain that comes back on itself, or a name used twice; a via host takes no identity from
cluster.ssh (a path on this machine, not on its node)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fdl.config.project import EnvSelection, load_config
from fdl.errors import ConfigError


@pytest.fixture(autouse=True)
def _in_the_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # file names are shown relative to the working directory


def load(tmp_path: Path, text: str):
    (tmp_path / "fdl.yml").write_text(textwrap.dedent(text).lstrip("\n"))
    return load_config(tmp_path, EnvSelection())


def errors_of(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    return caught.value.errors


def test_nodes_and_via_workers_are_read_with_their_defaults(tmp_path: Path) -> None:
    config = load(tmp_path, """
        cluster:
          ssh: {user: op, port: 2222, identity: keys/ctl}
          execution_nodes:
            - {host: rack-a, address: 10.0.0.5}
            - {host: rack-b, address: 10.0.1.5, via: rack-a, identity: ~/.ssh/hop, python: /opt/py/bin/python3}
          workers:
            - {host: direct, address: 10.0.0.11}
            - {host: far, address: 192.168.7.11, via: rack-b}
            - {host: far-key, address: 192.168.7.12, via: rack-a, identity: /home/op/.ssh/workers}
        """)
    cluster = config.cluster
    nodes = {n.host: n for n in cluster.execution_nodes}
    workers = {w.host: w for w in cluster.workers}
    assert nodes["rack-a"].identity == "keys/ctl" and nodes["rack-a"].user == "op" and nodes["rack-a"].port == 2222
    assert nodes["rack-b"].via == "rack-a" and nodes["rack-b"].identity == "~/.ssh/hop"
    assert nodes["rack-b"].python == "/opt/py/bin/python3"
    assert workers["direct"].via is None and workers["direct"].identity == "keys/ctl"
    # reached from its node: cluster.ssh's identity (a path here) is not its default, its own is a path there
    assert workers["far"].via == "rack-b" and workers["far"].identity is None and workers["far"].user == "op"
    assert workers["far-key"].identity == "/home/op/.ssh/workers"


def test_a_via_naming_no_node_is_an_error_with_file_line_and_key(tmp_path: Path) -> None:
    errors = errors_of(tmp_path, """
        cluster:
          execution_nodes:
            - {host: rack-a, address: 10.0.0.5}
          workers:
            - {host: w1, address: 10.0.0.11}
            - host: w2
              address: 10.0.0.12
              via: rack-z
        """)
    assert len(errors) == 1
    assert errors[0].startswith("fdl.yml:8: cluster.workers[1].via: expected the host name of an entry under "
                                "cluster.execution_nodes, found 'rack-z'.")
    assert "Execution nodes: rack-a." in errors[0]


def test_via_without_any_node_says_where_nodes_go(tmp_path: Path) -> None:
    errors = errors_of(tmp_path, """
        cluster:
          workers:
            - {host: w1, address: 10.0.0.11, via: rack-a}
        """)
    assert errors[0].startswith("fdl.yml:3: cluster.workers[0].via:")
    assert "cluster.execution_nodes lists no node" in errors[0]


def test_a_via_cycle_among_nodes_is_one_error_naming_the_cycle(tmp_path: Path) -> None:
    errors = errors_of(tmp_path, """
        cluster:
          execution_nodes:
            - {host: a, address: 10.0.0.5, via: c}
            - {host: b, address: 10.0.0.6, via: a}
            - {host: c, address: 10.0.0.7, via: b}
            - {host: d, address: 10.0.0.8, via: d}
            - {host: e, address: 10.0.0.9, via: a}
          workers:
            - {host: w1, address: 10.0.0.11, via: e}
        """)
    assert [e.split(": ", 2)[:2] for e in errors] == [
        ["fdl.yml:3", "cluster.execution_nodes[0].via"], ["fdl.yml:6", "cluster.execution_nodes[3].via"]]
    assert "found 'the cycle a -> c -> b -> a'" in errors[0]  # e leads into the cycle but is not part of it
    assert "found 'the cycle d -> d'" in errors[1]
    assert "Give one node of the cycle no via:" in errors[0]


def test_a_node_named_like_a_worker_or_another_node_is_refused(tmp_path: Path) -> None:
    errors = errors_of(tmp_path, """
        cluster:
          execution_nodes:
            - {host: rack-a, address: 10.0.0.5}
            - {host: rack-a, address: 10.0.0.6}
            - {host: w1, address: 10.0.0.7}
          workers:
            - {host: w1, address: 10.0.0.11}
        """)
    assert [e.split(": ", 2)[:2] for e in errors] == [
        ["fdl.yml:4", "cluster.execution_nodes[1].host"], ["fdl.yml:5", "cluster.execution_nodes[2].host"]]
    assert "It is already execution node 0." in errors[0] and "It is already worker 0." in errors[1]


def test_node_entries_are_checked_like_workers(tmp_path: Path) -> None:
    errors = errors_of(tmp_path, """
        cluster:
          execution_nodes:
            - {address: 10.0.0.5}
            - {host: rack-b, address: 224.0.0.1, port: 70000, user: "r;m"}
          workers: []
        """)
    assert [e.split(": ", 2)[:2] for e in errors] == [
        ["fdl.yml:3", "cluster.execution_nodes[0].host"], ["fdl.yml:4", "cluster.execution_nodes[1].address"],
        ["fdl.yml:4", "cluster.execution_nodes[1].user"], ["fdl.yml:4", "cluster.execution_nodes[1].port"]]


def test_unknown_keys_of_a_node_warn(tmp_path: Path) -> None:
    config = load(tmp_path, """
        cluster:
          execution_nodes:
            - {host: rack-a, address: 10.0.0.5, vai: x}
        """)
    assert any("unknown key 'cluster.execution_nodes[0].vai' (did you mean 'via'?)" in w for w in config.warnings)
