"""The join settings are declared once (fdl.config.join_fields); everything that names them agrees with it.

The schema's join: keys and record, `fdl join`'s options, the agent's merge and
resolved record, and the fdl_join_worker role's variables are each compared
with the declaration, so a setting added in one place and not the others fails
here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from fdl.agent.options import JoinOptions, resolve_options
from fdl.config import schema
from fdl.config.join_fields import CLI_FIELDS, JOIN_KEYS, SETTINGS, JoinDefaults, Setting, flag_of
from fdl.config.project import load_config
from fdl.errors import ConfigError, UsageError
from fdl.hostside.checks.devices import Devices
from fdl.hostside.libtorch.variants import CHOICES as LIBTORCH_CHOICES

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "roles" / "fdl_join_worker"
# The `fdl join` fields of the original command (its JoinArgs), in their order.
JOIN_ARGS = ("controller", "ssh", "identity", "token", "bin", "source", "source_cwd", "source_build", "source_bin",
             "libtorch", "host", "devices", "persist", "data_path", "data_source", "gpu_ram_share", "no_sig_probe")
STRONG = "5f0c1e8a9b2d4c6e8f0a1b3c5d7e9f1a"  # 32 hex digits: 128 bits
# Flags fdl adds to them (docs/join.md): the door's pinned host key, and the token read from a 0600 file.
ADDED = ("known_hosts", "token_file")


def load(tmp_path: Path, text: str):
    (tmp_path / "fdl.yml").write_text(textwrap.dedent(text).lstrip("\n"))
    return load_config(tmp_path)


def test_every_field_is_declared_once_with_a_setting():
    assert JoinDefaults._fields == JOIN_KEYS
    assert [name for name, _ in SETTINGS] == list(JOIN_KEYS)
    assert all(isinstance(setting, Setting) and setting.help for _, setting in SETTINGS)
    # every JoinArgs field is a flag, in its order, and so are fdl's additions; args and libtorch_mirror are
    # block-only
    assert tuple(f for f in CLI_FIELDS if f not in ADDED) == JOIN_ARGS and set(ADDED) <= set(CLI_FIELDS)
    assert set(JOIN_KEYS) - set(CLI_FIELDS) == {"args", "libtorch_mirror"}
    assert [name for name, setting in SETTINGS if setting.secret] == ["token"]


def test_the_schema_knows_exactly_the_declared_keys(tmp_path):
    assert schema.JOIN_KEYS == JOIN_KEYS
    config = load(tmp_path, "join: {controller: 'h:1', bin: /x, devicez: '0'}\n")
    assert config.join == JoinDefaults(controller="h:1", bin="/x")
    warning = next(w for w in config.warnings if "devicez" in w)
    assert "did you mean 'devices'" in warning and ", ".join(JOIN_KEYS) in warning


def test_every_declared_key_is_read_from_the_block_into_its_type(tmp_path):
    token = tmp_path / "token"
    token.write_text("5f0c1e8a9b2d4c6e8f0a1b3c5d7e9f1a\n")
    os.chmod(token, 0o600)
    config = load(tmp_path, """
        join:
          controller: 10.0.0.1:1337
          ssh: op@door:2222
          identity: ~/.ssh/farm
          known_hosts: door_known_hosts
          token_file: token
          bin: /opt/train
          source_cwd: sub
          source_build: make
          source_bin: out/train
          libtorch: cu128
          host: node-a
          devices: [0, 1]
          persist: true
          data_path: /data
          data_source: sshfs://op@ctl:/data
          gpu_ram_share: 0.5
          no_sig_probe: true
          args: [--epochs, "3"]
          libtorch_mirror: https://mirror.example/lt
          source: file:///srv/tree
        """)
    join = config.join
    assert join is not None and not config.warnings
    assert all(getattr(join, name) is not None for name in JOIN_KEYS)
    assert join.devices == Devices(ids=(0, 1))  # parsed once, here: a typed value, not text
    assert join.persist is True and join.gpu_ram_share == 0.5 and join.args == ("--epochs", "3")
    # token_file: is read (the token itself is the token: field), relative paths resolve against fdl.yml's folder
    assert join.token == "5f0c1e8a9b2d4c6e8f0a1b3c5d7e9f1a" and join.token_file == str(token)
    assert join.known_hosts == str(tmp_path / "door_known_hosts")


@pytest.mark.parametrize(("key", "value", "says"), [
    ("devices", "'0,0'", "listed twice"),
    ("host", "'a b'", "a host name"),
    ("controller", "'h:0'", "host[:port]"),
    ("persist", "'yes'", "true or false"),
    ("gpu_ram_share", "2", "a number from 0 to 1"),
    ("args", "'--x'", "a list of arguments"),
    ("token", "[a]", "expected text"),
])
def test_each_check_kind_refuses_what_does_not_fit(tmp_path, key, value, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        load(tmp_path, f"join: {{{key}: {value}}}\n")


def test_the_cli_options_are_exactly_the_declared_flags():
    # In a child: importing typer warns under this click, and pytest turns warnings into errors.
    code = ("import json, click, typer.main; from fdl.cli.join import app\n"
            "c = typer.main.get_command(app)\n"
            "print(json.dumps([[p.name, p.opts, p.secondary_opts, p.metavar, p.help, p.envvar, p.is_flag]\n"
            "                  for p in c.params if isinstance(p, click.Option) and p.name != 'help']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    options = {row[0]: row[1:] for row in json.loads(done.stdout)}
    assert tuple(options) == CLI_FIELDS
    for name, setting in SETTINGS:
        if not setting.cli:
            continue
        opts, secondary, metavar, help_text, envvar, is_flag = options[name]
        assert opts == [flag_of(name)] and help_text == setting.help and envvar == setting.envvar, name
        if setting.off:
            assert is_flag and secondary == [setting.off], name
        else:
            assert metavar == setting.metavar and not is_flag, name


def test_the_agent_options_are_the_declared_fields_and_every_flag_reaches_them():
    # libtorch_mirror is resolved, with the libtorch: block and FDL_LIBTORCH_MIRROR, into where downloads come from
    assert JoinOptions._fields == (*(k if k != "libtorch_mirror" else "libtorch_source" for k in JOIN_KEYS),
                                   "args_given")
    given = {"controller": "10.0.0.9:2000", "ssh": "op@door:2222", "identity": "/k", "known_hosts": "/kh",
             "token": STRONG, "token_file": None, "bin": None, "source": "file:///srv/tree", "source_cwd": "sub",
             "source_build": "make", "source_bin": "out/train",
             "libtorch": "cpu", "host": "node-z", "devices": "cpu:2", "persist": True, "data_path": "/d",
             "data_source": "sshfs://op@ctl:/d", "gpu_ram_share": 0.25, "no_sig_probe": True}
    assert tuple(given) == CLI_FIELDS
    block = JoinDefaults(controller="10.0.0.1:1", ssh="other@h", identity="/other", token="block", bin="/opt/x",
                         libtorch="cu128", host="node-a", devices=Devices(ids=(0,)), data_path="/b",
                         data_source="sshfs://x@y:/b", gpu_ram_share=0.5)
    opts = resolve_options(block, given, None, environ={})
    assert opts.controller == ("10.0.0.9", 2000) and str(opts.ssh) == "op@door:2222"
    assert (opts.identity, opts.token, opts.bin, opts.source) == ("/k", STRONG, None, "file:///srv/tree")
    assert opts.known_hosts == "/kh"
    assert (opts.source_cwd, opts.source_build, opts.source_bin) == ("sub", "make", "out/train")
    assert (opts.libtorch, opts.host, opts.devices) == ("cpu", "node-z", Devices(kind="cpu", count=2))
    assert opts.persist and opts.no_sig_probe and opts.gpu_ram_share == 0.25
    assert opts.data_path == "/d" and opts.data_source is not None and opts.data_source.spec == "sshfs://op@ctl:/d"
    with pytest.raises(ValueError, match="unknown join fields"):
        resolve_options(block, {"args": ["x"]}, None, environ={})


def test_a_token_file_flag_is_read_and_a_weak_token_is_refused_with_the_mint_command(tmp_path):
    """regression (issue 37, item 5): `hunter2` was accepted as a join token."""
    block = JoinDefaults(controller="h", bin="/x")
    path = tmp_path / "token"
    path.write_text(STRONG + "\n")
    os.chmod(path, 0o600)
    opts = resolve_options(block, {"token_file": str(path), "token": None}, None, environ={})
    assert (opts.token, opts.token_file) == (STRONG, str(path))
    for weak in ("hunter2", "0123456789abcdef"):  # 7 characters; 16 hex digits = 64 bits
        with pytest.raises(UsageError, match=r"too weak.*at least 128.*secrets.token_hex\(32\)") as refused:
            resolve_options(block, {"token": weak}, None, environ={})
        assert weak not in refused.value.message
    os.chmod(path, 0o640)
    with pytest.raises(UsageError, match="group or others may read or change it"):
        resolve_options(block, {"token_file": str(path)}, None, environ={})


def test_devices_travel_parsed_from_the_block_and_from_gpus():
    block = JoinDefaults(controller="h", bin="/x", devices=Devices(kind="cpu", count=3))
    assert resolve_options(block, {}, None, environ={}).devices is block.devices
    from_gpus = Devices(ids=(2, 3))  # what `fdl --gpus 2,3 join` hands over
    assert resolve_options(block, {"devices": from_gpus}, None, environ={}).devices is from_gpus


# --------------------------------------------------------------------------- the fdl_join_worker role
# The role's argument_specs are checked against the declaration rather than generated from it: the file
# also holds the role's own variables (install, account, unit), its descriptions speak of the role, and
# ansible-doc, the docs table and the role's README all read that one hand-kept file.

_ROLE_TYPES = {"bool": "bool", "fraction": "float", "args": "list"}
# Role variables named like a join field that are not one: fdl_join_worker_args holds `fdl join`'s own
# arguments on the unit's command line (training arguments go in join.args, through join_extra).
_NOT_JOIN_FIELDS = {"args"}


def _role_options() -> dict:
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    return specs["argument_specs"]["main"]["options"]


def _own_variables() -> dict[str, dict]:
    prefix = "fdl_join_worker_"
    return {name[len(prefix):]: spec for name, spec in _role_options().items()
            if name[len(prefix):] in set(JOIN_KEYS) - _NOT_JOIN_FIELDS}


def test_the_role_variables_named_after_join_fields_match_the_declaration():
    own = _own_variables()
    assert {"controller", "token", "devices", "libtorch"} <= set(own)
    assert "fdl join --persist" in _role_options()["fdl_join_worker_args"]["description"]
    declared = dict(SETTINGS)
    for field, spec in own.items():
        setting = declared[field]
        assert spec.get("type", "str") == _ROLE_TYPES.get(setting.check, "str"), field
        assert bool(spec.get("no_log")) == setting.secret, field
        if not setting.secret:  # the token goes to the unit's environment file, not to join:
            assert f"join.{field}" in spec["description"], field


def test_the_role_writes_each_own_variable_to_its_join_key():
    private = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    block = private["_fdl_join_worker_join"]
    written = dict(re.findall(r"'(\w+)': (fdl_join_worker_\w+)", block))
    own = {field for field, _ in _own_variables().items() if field != "token"}
    assert written == {field: f"fdl_join_worker_{field}" for field in own}
    assert set(private["_fdl_join_worker_reserved_keys"]) <= set(JOIN_KEYS)
    extra = _role_options()["fdl_join_worker_join_extra"]["description"]
    named = re.search(r"\(([^)]*)\)", extra)
    assert named is not None
    assert {key.strip() for key in named.group(1).split(",") if key.strip() != "..."} <= set(JOIN_KEYS)


def test_the_role_documents_the_libtorch_variants_fdl_join_accepts():
    """Regression: the role described join.libtorch as e.g. precompiled/cu128, which fdl join refuses (exit 2,
    and the unit powers the box off)."""
    description = _role_options()["fdl_join_worker_libtorch"]["description"]
    assert all(choice in description for choice in LIBTORCH_CHOICES), description
    assert "precompiled/" not in description
