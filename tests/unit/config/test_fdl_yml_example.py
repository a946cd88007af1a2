"""fdl.yml.example (seed 000 points to it for the join: block) read through fdl's own schema: every join field
is in it, each with a comment saying what it does, and the file, with its commented-out alternatives taken in
too, is a configuration fdl accepts without a warning. Issue 38 item 6: the file was missing."""

from __future__ import annotations

import re
import secrets
from pathlib import Path

import pytest

from fdl.config.join_fields import JOIN_KEYS, SETTINGS
from fdl.config.project import EnvSelection, load_config
from tests.conftest import REPO

EXAMPLE = REPO / "fdl.yml.example"
KEY_LINE = re.compile(r"^(\s+)(?:# )?([a-z_]+):(.*)$")


#: join fields that exclude each other in one block: the example takes one in, the other stays a comment
EXCLUSIVE = {"token": "token_file"}


def uncommented(text: str, *, instead: tuple[str, ...] = ()) -> str:
    """The example with every `# field:` line of a join field taken in; a field of `instead` is taken in in
    place of the one it excludes (EXCLUSIVE), which is commented out."""
    dropped = {EXCLUSIVE[name] for name in instead}
    out = []
    for line in text.splitlines():
        m = re.match(r"^(\s+)(# )?([a-z_]+):(.*)$", line)
        if m and m.group(3) in dropped:
            out.append(f"{m.group(1)}# {m.group(3)}:{m.group(4)}")
        elif m and m.group(2) and m.group(3) in JOIN_KEYS and (m.group(3) not in EXCLUSIVE or m.group(3) in instead):
            out.append(f"{m.group(1)}{m.group(3)}:{m.group(4)}")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def load(tmp_path: Path, text: str):
    """Load the example as a project's fdl.yml, with the token file and known_hosts it names in place."""
    farm = tmp_path / ".fdl" / "farm"
    farm.mkdir(parents=True, exist_ok=True)
    token = farm / "token"
    token.write_text(secrets.token_hex(32) + "\n")
    token.chmod(0o600)
    (farm / "known_hosts").write_text("[10.0.0.1]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample\n")
    text = re.sub(r"^(\s+token:) \S+", lambda m: f"{m.group(1)} {secrets.token_hex(32)}", text, flags=re.M)
    (tmp_path / "fdl.yml").write_text(text)
    return load_config(tmp_path, EnvSelection())


@pytest.fixture(autouse=True)
def _in_the_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def test_every_join_field_is_there_once_with_what_it_does() -> None:
    lines = [KEY_LINE.match(line) for line in EXAMPLE.read_text().splitlines()]
    keys = [m.group(2) for m in lines if m and m.group(1) == "  " and m.group(2) in JOIN_KEYS]
    assert sorted(keys) == sorted(JOIN_KEYS), "each join field once, in the join: block"
    for m in lines:
        if m and m.group(2) in JOIN_KEYS:
            comment = m.group(3).split("  # ", 1)
            assert len(comment) == 2 and len(comment[1].split()) >= 5, f"{m.group(2)}: say what it does"
    assert [name for name, _setting in SETTINGS] == list(JOIN_KEYS)


def test_the_example_with_every_field_taken_in_is_a_configuration_fdl_accepts(tmp_path: Path) -> None:
    config = load(tmp_path, uncommented(EXAMPLE.read_text()))
    assert config.warnings == [] and config.join is not None
    unset = [name for name in JOIN_KEYS if getattr(config.join, name) in (None, False) and name not in EXCLUSIVE]
    assert unset == [], f"fields the example leaves unset or off: {unset}"
    assert str(config.join.devices) == "0,1" and config.join.args == ("--model", "resnet")


def test_the_token_itself_is_the_alternative_to_the_token_file(tmp_path: Path) -> None:
    config = load(tmp_path, uncommented(EXAMPLE.read_text(), instead=("token",)))
    # a literal token in a file others can read (the test's fdl.yml is 0644) is accepted, with a warning
    assert len(config.warnings) == 1 and "fdl.yml" in config.warnings[0] and config.join is not None
    from_file = (tmp_path / ".fdl" / "farm" / "token").read_text().strip()
    assert config.join.token is not None and config.join.token != from_file  # the literal one, not the file's


def test_the_example_as_it_stands_is_a_configuration_fdl_accepts(tmp_path: Path) -> None:
    config = load(tmp_path, EXAMPLE.read_text())
    assert config.warnings == [] and config.join is not None
    assert config.join.controller == "10.0.0.1:1337" and config.join.persist is True
    # a token is never in a file people commit: the example reads it from a 0600 file beside the project
    assert config.join.token == (tmp_path / ".fdl" / "farm" / "token").read_text().strip()
