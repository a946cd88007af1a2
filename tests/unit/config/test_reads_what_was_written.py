"""regression: config values are read as written (no YAML 1.1 octal or base-60 numbers), digits are ASCII,
worker addresses are unicast, and every validation pattern matches the whole value (no trailing newline)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fdl.config.parse import is_valid_host, split_host_port
from fdl.config.project import EnvSelection, load_config
from fdl.errors import ConfigError, UsageError
from fdl.hostside.checks.devices import parse_devices


def project(tmp_path: Path, body: str) -> Path:
    (tmp_path / "fdl.yml").write_text(textwrap.dedent(body).lstrip("\n"))
    return tmp_path


def load(tmp_path: Path, body: str):
    return load_config(project(tmp_path, body), EnvSelection())


# YAML 1.1's octal, hex, underscore and base-60 forms, long enough to be tokens of 128 bits and more
@pytest.mark.parametrize("written", ["07551234567012345670123456701234", "0o1734567012345670123456701",
                                     "0x1f2e3d4c5b6a7980a1b2c3d4e5f6", "1_000_234_567_890_123_456_789",
                                     "12:30:05:41:52:33:14:25:36"])
def test_a_number_looking_token_stays_the_text_written(tmp_path: Path, written: str) -> None:
    cfg = load(tmp_path, f"""
        cluster:
          controller:
            host: 10.0.0.1
            join: {{discovery: true, token: {written}}}
        """)
    assert cfg.data["cluster"]["controller"]["join"]["token"] == written
    assert cfg.cluster.controller.join.token == written


def test_a_short_number_looking_token_is_refused_without_being_shown(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="the token is too weak") as caught:
        load(tmp_path, "cluster:\n  controller:\n    join: {discovery: true, token: 0b101}\n")
    assert "0b101" not in caught.value.message and "fdl.yml:3" in caught.value.message


def test_plain_decimal_numbers_still_read_as_numbers(tmp_path: Path) -> None:
    cfg = load(tmp_path, """
        cluster:
          controller: {host: 10.0.0.1, port: 1400}
          ssh: {port: 2200}
          workers: [{host: n1, address: 10.0.0.2, local_devices: [0, 1]}]
        """)
    assert cfg.cluster.controller.port == 1400 and cfg.cluster.workers[0].port == 2200


@pytest.mark.parametrize("port", ["22:17", "0x16", "017", "2_2", "'٢٢'"])
def test_a_port_that_is_not_a_plain_integer_is_an_error_naming_the_line(tmp_path: Path, port: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, f"""
            cluster:
              controller: {{host: 10.0.0.1}}
              ssh:
                port: {port}
            """)
    message = caught.value.message
    assert "fdl.yml:4" in message and "cluster.ssh.port" in message and "a TCP port" in message
    assert "1337" not in message  # 22:17 is not read as base 60


# Non-ASCII digits that str.isdigit() and int() accept: ARABIC-INDIC THREE, FULLWIDTH THREE, ARABIC-INDIC ONE.
@pytest.mark.parametrize("spec", ["cpu:\u0663", "cpu:\uff13", ["\u0663"], "0,\u0661"])
def test_device_specs_take_ascii_digits_only(tmp_path: Path, spec) -> None:
    with pytest.raises(ValueError):
        parse_devices(spec)
    with pytest.raises(ConfigError, match="local_devices"):
        load(tmp_path, f"""
            cluster:
              controller: {{host: 10.0.0.1}}
              workers: [{{host: n1, address: 10.0.0.2, local_devices: {spec!r}}}]
            """.replace("'", '"'))


def test_gpus_flag_takes_ascii_digits_only() -> None:
    from fdl.gpus import parse_gpus

    with pytest.raises(UsageError, match="not a GPU index"):
        parse_gpus("٣", present=None)
    assert parse_gpus("0,1", present=None).ids == (0, 1)


@pytest.mark.parametrize("address, why", [("0.0.0.0", "unspecified"), ("'::'", "unspecified"),
                                          ("224.0.0.1", "multicast"), ("ff02::1", "multicast"),
                                          ("255.255.255.255", "broadcast"), ("'::ffff:0.0.0.0'", "unspecified")])
def test_a_worker_address_must_be_a_unicast_address_or_a_name(tmp_path: Path, address: str, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, f"""
            cluster:
              controller: {{host: 10.0.0.1}}
              workers:
                - host: n1
                  address: {address}
            """)
    assert "fdl.yml:5" in caught.value.message and "cluster.workers[0].address" in caught.value.message
    assert why in caught.value.message


@pytest.mark.parametrize("address", ["10.0.0.2", "node-2.lab", "127.0.0.1", "fe80::1%eth0", "2001:db8::7"])
def test_unicast_addresses_and_names_are_workers(tmp_path: Path, address: str) -> None:
    cfg = load(tmp_path, f"""
        cluster:
          controller: {{host: 10.0.0.1}}
          workers: [{{host: n1, address: "{address}"}}]
        """)
    assert cfg.cluster.workers[0].address == address


@pytest.mark.parametrize("field, worker", [("host", 'host: "node\\n"'), ("user", 'host: n1, user: "node\\n"')])
def test_a_trailing_newline_is_not_part_of_a_valid_name(tmp_path: Path, field: str, worker: str) -> None:
    with pytest.raises(ConfigError, match=f"cluster.workers\\[0\\].{field}"):
        load(tmp_path, """
            cluster:
              controller: {host: 10.0.0.1}
              workers: [{WORKER}]
            """.replace("WORKER", worker))


def test_an_env_name_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(UsageError, match="is not valid"):
        EnvSelection.choose(None, None, {"FDL_ENV": "farm\n"})


@pytest.mark.parametrize("text, valid", [
    ("node", True), ("node\n", False), ("10.0.0.1", True), ("[::1]", True), ("fe80::1%eth0", True),
    ("::1%$(id)", False), ("fe80::1%eth0;id", False), ("fe80::1%", False), ("10.0.0.1%eth0", False),
    ("[fe80::1%en0]", True), ("fe80::1%eth0\n", False),
])
def test_is_valid_host_full_matches_and_limits_ipv6_zones(text: str, valid: bool) -> None:
    assert is_valid_host(text) is valid


def test_host_port_takes_ascii_port_digits_only() -> None:
    with pytest.raises(ValueError):
        split_host_port("node:٢٢")
    assert split_host_port("node:22") == ("node", 22)


def test_publish_and_farm_patterns_full_match() -> None:
    from fdl.hostside.farm.doors import DoorError, check_label, check_served
    from fdl.publish.manifest import ManifestError, parse_manifest
    from fdl.publish.spec import SourceSpecError, parse_source_spec

    for spec in ("rsync://op\n@host:/srv", "rsync://host:٢٢:/srv", "rsync://node\n:/srv"):
        with pytest.raises(SourceSpecError):
            parse_source_spec(spec)
    with pytest.raises(DoorError):
        check_label("lab\n")
    with pytest.raises(DoorError):
        check_served("/srv/run\n")
    with pytest.raises(ManifestError, match="hex nonce"):
        parse_manifest(b'bin: x\nrun: "' + b"ab" * 8 + b'\\n"\npublished_epoch: 1\nbuilt: true\n', "m")
