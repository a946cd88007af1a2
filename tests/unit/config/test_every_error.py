"""Validation reports every error of a configuration at once, with its warnings, and nothing that only follows
from another error; unknown keys are listed as ignored."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fdl.cluster.inventory import worker_vars
from fdl.config.project import EnvSelection, load_config
from fdl.errors import ConfigError


@pytest.fixture(autouse=True)
def _in_the_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # file names are shown relative to the working directory


def errors_of(tmp_path: Path, text: str) -> ConfigError:
    (tmp_path / "fdl.yml").write_text(textwrap.dedent(text).lstrip("\n"))
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path, EnvSelection())
    return caught.value


def test_every_block_and_every_field_is_checked_before_validation_stops(tmp_path: Path) -> None:
    error = errors_of(tmp_path, """
        cluster:
          controller: {host: "a b", port: 0}
          ssh: {port: 99999}
          workers:
            - {host: node-a, port: x}
            - {host: node-a}
            - {host: node-c, local_devices: "cpu:0", user: "r;m"}
        commands:
          train:
            clustr: true
            bin: target/release/train
            local_devices: cpu:two
          ok: {run: echo fine}
        join: {persist: maybe}
        publish: {args: "--epochs 3"}
        """)
    assert [e.split(": ", 2)[:2] for e in error.errors] == [
        ["fdl.yml:2", "cluster.controller.host"],
        ["fdl.yml:2", "cluster.controller.port"],
        ["fdl.yml:3", "cluster.ssh.port"],
        ["fdl.yml:5", "cluster.workers[0].port"],
        ["fdl.yml:6", "cluster.workers[1].host"],  # node-a again (worker 0's own error does not hide that)
        ["fdl.yml:7", "cluster.workers[2].local_devices"],
        ["fdl.yml:7", "cluster.workers[2].user"],
        ["fdl.yml:9", "commands.train"],  # no run: and (clustr is no key) no cluster: true
        ["fdl.yml:12", "commands.train.local_devices"],  # only on a cluster command...
        ["fdl.yml:12", "commands.train.local_devices"],  # ...and cpu:two is no device list
        ["fdl.yml:14", "join.persist"],
        ["fdl.yml:15", "publish.args"],
    ]
    assert error.message.startswith("12 errors in the configuration: fdl.yml:2: cluster.controller.host: ")
    assert error.warnings == [
        "fdl.yml:10: unknown key 'commands.train.clustr' (did you mean 'cluster'?); it is ignored. Known keys "
        "here: run, cluster, build, bin, args, description, local_devices, env."]


@pytest.mark.parametrize("python", ["python3", "/usr/bin/python3 -u", "~/venv/bin/python", "/opt/py;rm -rf x",
                                    "/usr/bin/", ""])
def test_a_workers_python_is_checked_when_the_file_is_read(tmp_path: Path, python: str) -> None:
    """Regression (issue 38 item 13): a worker's python: was taken as any text and failed only over ssh, in the
    probe module or the launcher; it must be the absolute path of an interpreter, refused with file and line."""
    error = errors_of(tmp_path, f"""
        cluster:
          workers:
            - host: node-b
              python: {python!r}
        """)
    [message] = error.errors
    assert message.startswith("fdl.yml:4: cluster.workers[0].python: expected ")
    assert "absolute path of a Python interpreter" in message or "non-empty text" in message


def test_an_absolute_python_path_is_taken_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "fdl.yml").write_text("cluster:\n  workers:\n    - {host: b, python: /opt/venv-3.12/bin/python3.12}\n"
                                      "    - {host: c}\n")
    workers = load_config(tmp_path, EnvSelection()).cluster.workers
    # c names none: the interpreter is chosen where the worker is known (/usr/bin/python3 over ssh, fdl's own on
    # this machine), not in the config
    assert [w.python for w in workers] == ["/opt/venv-3.12/bin/python3.12", None]
    assert [worker_vars(w, tmp_path)["ansible_python_interpreter"] for w in workers] == [
        "/opt/venv-3.12/bin/python3.12", "/usr/bin/python3"]


def test_an_error_does_not_breed_errors_about_what_it_left_unknown(tmp_path: Path) -> None:
    error = errors_of(tmp_path, """
        cluster:
          controller: {port: seventeen, master_port: 1337}
          workers:
            - {host: "no such;host"}
            - {address: 10.0.0.5}
        commands:
          train: {cluster: "yes", local_devices: cpu:2}
        """)
    assert [e.split(": ", 2)[1] for e in error.errors] == [
        "cluster.controller.port",  # not compared with master_port: 1337 (the default it would fall back to)
        "cluster.workers[0].host",  # and no second error about it as an address
        "cluster.workers[1].host",  # missing; the address itself is fine
        "commands.train.cluster",  # not "local_devices only on a cluster command", nor "needs run: or bin:"
    ]
    assert not error.warnings


def test_one_error_reads_as_before(tmp_path: Path) -> None:
    error = errors_of(tmp_path, "commands:\n  t: {run: echo, local_devices: cpu:2}\n")
    assert error.errors == [error.message]
    assert error.message.startswith("fdl.yml:2: commands.t.local_devices: expected local_devices: only on a "
                                    "cluster: true command, found 'cpu:2'.")


def test_unknown_keys_are_warned_about_and_listed_as_ignored(tmp_path: Path) -> None:
    (tmp_path / "fdl.yml").write_text("clustr:\n  workers: []\ncommands:\n  t: {run: echo, descripton: x}\n")
    config = load_config(tmp_path, EnvSelection())
    assert config.ignored == [("clustr",), ("commands", "t", "descripton")]
    assert [w.split(" (")[0] for w in config.warnings] == ["fdl.yml:1: unknown key 'clustr'",
                                                           "fdl.yml:4: unknown key 'commands.t.descripton'"]
