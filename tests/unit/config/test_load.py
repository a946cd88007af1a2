"""Config core: discovery, overlays, inherit-from, merge rules, provenance, validation."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fdl.config.keypath import Origin
from fdl.config.project import EnvSelection, load_config
from fdl.errors import ConfigError, UsageError


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


@pytest.fixture
def three_layers(tmp_path: Path) -> Path:
    write(tmp_path, "fdl.yml", """
        cluster:
          controller:
            host: 10.0.0.1
            port: 1337
          ssh: {user: op}
          workers:
            - host: node-b
              address: 10.0.0.12
              local_devices: [0, 1]
        commands:
          test:
            run: echo base
        """)
    write(tmp_path, "fdl.farmbase.yml", """
        cluster:
          controller:
            join:
              discovery: true
              start: manual
              window_s: 300
        """)
    write(tmp_path, "fdl.b300.yml", """
        inherit-from: farmbase
        cluster:
          controller:
            join:
              token: 5f0c1e8a9b2d4c6e8f0a1b3c5d7e9f1a
              window_s: 900
          workers: null
        """)
    return tmp_path


def test_three_layers_merge_with_origins(three_layers: Path) -> None:
    cfg = load_config(three_layers, EnvSelection("b300", "--env"))
    assert [p.name for p in cfg.files] == ["fdl.yml", "fdl.farmbase.yml", "fdl.b300.yml"]
    join = cfg.cluster.controller.join
    assert (join.discovery, join.start, join.window_s) == (True, "manual", 900.0)
    assert join.token == "5f0c1e8a9b2d4c6e8f0a1b3c5d7e9f1a"
    assert cfg.cluster.controller.host == "10.0.0.1"
    assert cfg.cluster.workers == ()  # null deletes the key
    assert "workers" not in cfg.data["cluster"]
    origins = {path: origin for path, origin in cfg.origins.items()}
    assert origins[("cluster", "controller", "host")] == Origin("fdl.yml", 3) or \
        origins[("cluster", "controller", "host")].line == 3
    assert origins[("cluster", "controller", "join", "start")].file.endswith("fdl.farmbase.yml")
    assert origins[("cluster", "controller", "join", "window_s")].file.endswith("fdl.b300.yml")
    assert not any(path[:2] == ("cluster", "workers") for path in origins)
    assert cfg.is_discovery_window


def test_lists_and_scalars_replace(tmp_path: Path) -> None:
    write(tmp_path, "fdl.yml", """
        commands:
          train: {cluster: true, bin: a, args: [--a, "1", --b]}
        """)
    write(tmp_path, "fdl.x.yml", """
        commands:
          train: {args: [--c]}
        """)
    cfg = load_config(tmp_path, EnvSelection("x", "--env"))
    assert cfg.commands["train"].args == ("--c",)
    assert cfg.commands["train"].bin == "a"


def test_found_from_a_subdirectory(three_layers: Path) -> None:
    sub = three_layers / "src" / "deep"
    sub.mkdir(parents=True)
    cfg = load_config(sub)
    assert cfg.root == three_layers.resolve()
    assert cfg.commands["test"].run == "echo base"


def test_missing_env_names_file_and_existing_envs(three_layers: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(three_layers, EnvSelection("nope", "@sigil"))
    text = str(err.value)
    assert "fdl.nope.yml" in text and "b300, farmbase" in text and "(selected by @nope)" in text


def test_inherit_cycle_names_the_chain(tmp_path: Path) -> None:
    write(tmp_path, "fdl.yml", "commands: {}\n")
    write(tmp_path, "fdl.a.yml", "inherit-from: b\n")
    write(tmp_path, "fdl.b.yml", "inherit-from: c\n")
    write(tmp_path, "fdl.c.yml", "inherit-from: a\n")
    with pytest.raises(ConfigError, match=r"cycle: a -> b -> c -> a"):
        load_config(tmp_path, EnvSelection("a", "--env"))


def test_inherit_from_missing_parent(tmp_path: Path) -> None:
    write(tmp_path, "fdl.yml", "commands: {}\n")
    write(tmp_path, "fdl.a.yml", "inherit-from: ghost\n")
    with pytest.raises(ConfigError, match=r"env 'ghost' \(inherit-from in \S*fdl.a.yml\)"):
        load_config(tmp_path, EnvSelection("a", "--env"))


def test_env_precedence_flag_sigil_variable() -> None:
    env = {"FDL_ENV": "var"}
    assert EnvSelection.choose("flag", "sig", env) == EnvSelection("flag", "--env")
    assert EnvSelection.choose(None, "sig", env) == EnvSelection("sig", "@sigil")
    assert EnvSelection.choose(None, None, env) == EnvSelection("var", "FDL_ENV")
    assert EnvSelection.choose(None, None, {}) == EnvSelection()
    with pytest.raises(UsageError, match="not valid"):
        EnvSelection.choose("../etc", None, {})


@pytest.mark.parametrize(
    "body, expected",
    [
        ("cluster: {controller: {port: 70000}}",
         r"cluster.controller.port: expected a TCP port from 1 to 65535, found 70000"),
        ("cluster: {controller: {port: 0}}", r"expected a TCP port from 1 to 65535, found 0"),
        ("cluster: {workers: [{host: 'node;rm -rf /'}]}", r"cluster.workers\[0\].host: expected a host name"),
        ("cluster: {workers: [{host: 'two words'}]}", r"spaces and shell characters are refused"),
        ("cluster: {workers: [{host: a, address: '$(id)'}]}", r"cluster.workers\[0\].address: expected a host name"),
        ("cluster: {workers: [{host: a}, {host: a}]}", r"a host name used once"),
        ("cluster: {workers: [{address: 1.2.3.4}]}", r"Every worker needs host:"),
        ("cluster: {workers: [{host: a, local_devices: [0, 0]}]}", r"listed twice"),
        ("cluster: {workers: [{host: a, local_devices: 'cpu:0'}]}", r"cpu:N needs N from 1"),
        ("cluster: {workers: [{host: a, env: {'BAD-NAME': x}}]}", r"environment variable name"),
        ("cluster: {workers: {host: a}}", r"cluster.workers: expected a list of worker entries"),
        ("cluster: {controller: {join: {start: sometimes}}}", r"one of auto, manual, hybrid, found 'sometimes'"),
        ("cluster: {controller: {join: {discovery: 'yes please'}}}", r"expected true or false"),
        ("cluster: {controller: 'host:99999'}", r"port '99999' is not a number"),
        ("cluster: {controller: {join: {tunnel_only: true}, bind: 0.0.0.0}}", r"tunnel_only binds loopback"),
        ("commands: {test: {cluster: false}}", r"commands.test: expected run:"),
        ("commands: {train: {cluster: true, bin: x, args: --epochs}}", r"commands.train.args: expected a list"),
        ("commands: [a, b]", r"commands: expected a mapping of command names"),
        ("commands: {train: {run: x, env: {'OMP NUM': '2'}}}", r"commands.train.env.OMP NUM: expected an environment"),
        ("commands: {train: {run: x, env: [OMP_NUM_THREADS=2]}}", r"commands.train.env: expected a mapping of env"),
        ("join: {gpu_ram_share: 3}", r"join.gpu_ram_share: expected a number from 0 to 1, found 3"),
        ("join: {controller: 'a b:1'}", r"join.controller: expected host\[:port\]"),
        ("publish: {args: 7}", r"publish.args: expected a list of arguments"),
    ],
)
def test_validation_errors_name_file_line_key(tmp_path: Path, body: str, expected: str) -> None:
    write(tmp_path, "fdl.yml", "# project\n" + body + "\n")
    with pytest.raises(ConfigError, match=expected) as err:
        load_config(tmp_path)
    assert str(err.value).startswith("fdl.yml:2:") or "fdl.yml:2" in str(err.value)


def test_unknown_keys_warn_with_did_you_mean(tmp_path: Path) -> None:
    write(tmp_path, "fdl.yml", """
        comands: {}
        cluster:
          workers:
            - host: a
              adress: 1.2.3.4
        """)
    cfg = load_config(tmp_path)
    text = "\n".join(cfg.warnings)
    assert "unknown key 'comands' (did you mean 'commands'?)" in text
    assert "cluster.workers[0].adress' (did you mean 'address'?)" in text
    assert "fdl.yml:5" in text


def test_controller_short_form_and_defaults(tmp_path: Path) -> None:
    write(tmp_path, "fdl.yml", """
        cluster:
          controller: 10.0.0.1:2000
          ssh: {user: op, port: 2222, identity: ~/.ssh/k}
          workers:
            - {host: b, local_devices: "cpu:2"}
            - {host: c, user: other, port: 22, local_devices: all}
        """)
    cfg = load_config(tmp_path)
    assert cfg.cluster.controller.address == "10.0.0.1:2000"
    b, c = cfg.cluster.workers
    assert (b.address, b.user, b.port, b.identity, str(b.local_devices)) == ("b", "op", 2222, "~/.ssh/k", "cpu:2")
    assert b.local_devices.ranks() == 2
    assert (c.user, c.port, str(c.local_devices)) == ("other", 22, "all")


def test_no_project_is_fine_unless_required(tmp_path: Path) -> None:
    assert load_config(tmp_path, required=False).data == {}
    with pytest.raises(ConfigError, match=r"no fdl\.yml"):
        load_config(tmp_path, required=True)


def test_yaml_merge_keys_and_anchors(tmp_path: Path) -> None:
    write(tmp_path, "fdl.yml", """
        x-worker: &w {user: op, arch: cpu}
        cluster:
          workers:
            - {<<: *w, host: a}
            - {<<: *w, host: b, user: root}
        """)
    cfg = load_config(tmp_path)
    assert [(w.host, w.user, w.arch) for w in cfg.cluster.workers] == [("a", "op", "cpu"), ("b", "root", "cpu")]
