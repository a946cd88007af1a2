"""`fdl join` options: flags over the join: block, the `--` tail, and input that must not parse (exit 2)."""

from __future__ import annotations

import pytest

from fdl.agent.options import SshHop, parse_ssh_hop, parse_sshfs_source, resolve_options
from fdl.config.join_fields import JoinDefaults
from fdl.config.schema import LibtorchDefaults
from fdl.errors import ExitCode, UsageError
from fdl.hostside.checks.devices import Devices
from fdl.libtorch.source import Source

STRONG = "5f0c1e8a9b2d4c6e8f0a1b3c5d7e9f1a"  # 128 bits: fdl refuses less


def flags(**given):
    return given


def test_flags_win_field_by_field_over_the_block():
    block = JoinDefaults(controller="10.0.0.1:1337", token=STRONG, bin="/opt/train", devices=Devices(ids=(0, 1)),
                         persist=True,
                         host="node-a")
    opts = resolve_options(block, flags(controller="10.0.0.9:2000", devices="cpu:2"), None, environ={})
    assert opts.controller == ("10.0.0.9", 2000)
    assert opts.devices == Devices(kind="cpu", count=2)
    assert opts.token == STRONG and opts.bin == "/opt/train" and opts.persist and opts.host == "node-a"


def test_tail_semantics_none_empty_and_verbatim():
    block = JoinDefaults(controller="h", bin="/opt/train", args=("--epochs", "3"))
    assert resolve_options(block, {}, None, environ={}).args == ("--epochs", "3")
    assert not resolve_options(block, {}, None, environ={}).args_given
    explicit_none = resolve_options(block, {}, [], environ={})
    assert explicit_none.args == () and explicit_none.args_given  # "-- " with nothing after: explicitly none
    verbatim = resolve_options(block, {}, ["--model", "a b", "--", "-x"], environ={})
    assert verbatim.args == ("--model", "a b", "--", "-x")


def test_bin_and_source_flags_are_mutually_exclusive():
    with pytest.raises(UsageError) as err:
        resolve_options(None, flags(controller="h", bin="/x", source="file:///src"), None, environ={})
    assert err.value.exit_code == ExitCode.PERMANENT
    assert "mutually exclusive" in err.value.message


def test_a_flag_for_one_of_the_pair_replaces_the_blocks_other():
    block = JoinDefaults(controller="h", source="file:///srv/run/tree")
    opts = resolve_options(block, flags(bin="/opt/train"), None, environ={})
    assert opts.bin == "/opt/train" and opts.source is None


def test_nothing_to_run_is_permanent():
    with pytest.raises(UsageError) as err:
        resolve_options(None, flags(controller="h"), None, environ={})
    assert err.value.exit_code == 2 and "--bin" in err.value.message and "--source" in err.value.message


def test_ssh_defaults_the_controller_to_the_sshd_box_convention():
    opts = resolve_options(None, flags(ssh="op@10.0.0.1:2222", bin="/x"), None, environ={})
    assert opts.ssh == SshHop(host="10.0.0.1", user="op", port=2222)
    assert opts.controller == ("127.0.0.1", 1337)


def test_no_controller_and_no_ssh_is_refused():
    with pytest.raises(UsageError, match="no controller to dial"):
        resolve_options(None, flags(bin="/x"), None, environ={})


@pytest.mark.parametrize("field, value, says", [
    ("controller", "host:99999", "does not parse"),
    ("ssh", "bad user@h", "not a login name"),
    ("devices", "0,0", "listed twice"),
    ("libtorch", "cu999", "not a variant"),
    ("host", "a b", "not a host name"),
    ("gpu_ram_share", 1.5, "fraction"),
    ("data_path", "relative/dir", "absolute"),
    ("data_source", "nfs://h:/x", "sshfs://"),
    ("data_source", "sshfs://h/x", "':' before the remote path"),
    ("source_bin", "target/release/x", "no --source"),
])
def test_bad_values_are_permanent_with_a_reason(field, value, says):
    given = {"controller": "h", "bin": "/x", field: value}
    with pytest.raises(UsageError) as err:
        resolve_options(None, given, None, environ={})
    assert err.value.exit_code == 2
    assert says in err.value.message


def test_the_token_never_shows_in_the_options_repr():
    secret = "s3cr3t-" + STRONG
    opts = resolve_options(None, flags(controller="h", bin="/x", token=secret), None, environ={})
    assert opts.token == secret
    assert secret not in repr(opts) and "token=(set)" in repr(opts) and "bin='/x'" in repr(opts)
    assert "token=None" in repr(resolve_options(None, flags(controller="h", bin="/x"), None, environ={}))


def test_the_libtorch_source_env_then_libtorch_block_then_join_block_then_pytorch():
    block = JoinDefaults(controller="h", bin="/x", libtorch_mirror="https://block.example/lt")
    libtorch = LibtorchDefaults(mirror="https://libtorch.example/lt", sha256=(("cpu", "a" * 64),))
    assert resolve_options(JoinDefaults(controller="h", bin="/x"), {}, None, environ={}).libtorch_source == Source()
    assert resolve_options(block, {}, None, environ={}).libtorch_source.mirror == "https://block.example/lt"
    got = resolve_options(block, {}, None, environ={}, libtorch_block=libtorch).libtorch_source
    assert (got.mirror, got.given_by, got.pin("cpu")) == ("https://libtorch.example/lt", "libtorch.mirror", "a" * 64)
    env = {"FDL_LIBTORCH_MIRROR": "http://127.0.0.1:23001/m"}
    assert resolve_options(block, {}, None, environ=env).libtorch_source.mirror == "http://127.0.0.1:23001/m"
    with pytest.raises(UsageError, match="not an http"):  # exit 2: a worker's settings that do not parse
        resolve_options(block, {}, None, environ={"FDL_LIBTORCH_MIRROR": "ftp://x/y"})


def test_sshfs_and_ssh_hop_spellings():
    src = parse_sshfs_source("sshfs://op@10.0.0.1:2222:/flodl/data")
    assert (src.user, src.host, src.port, src.path) == ("op", "10.0.0.1", 2222, "/flodl/data")
    assert src.remote == "op@10.0.0.1:/flodl/data"
    assert parse_sshfs_source("sshfs://ctrl:/d").remote == "ctrl:/d"
    assert parse_ssh_hop("ctrl") == SshHop(host="ctrl")
    assert str(parse_ssh_hop("[::1]:22")) == "[::1]:22"
