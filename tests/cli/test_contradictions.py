"""Contradictory options are refused, in every command, by one mechanism (fdl.cli.contradictions): a --x/--no-x pair
given both ways, and the pairs fdl.cli.contradictions.EXCLUSIVE names. Seed 000: join-config refuses contradictory
flags with exit 1; every other command's contract makes a command line it refuses a usage error, exit 2.

regression (issue 38, item 5): `fdl join-config --install-key --no-install-key` was accepted, the last one
winning, exit 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fdl.cli.contradictions import CONTRADICTION_EXIT, EXCLUSIVE, given_options
from tests.cli.command_tree import command_tree
from tests.conftest import run_fdl

PROJECT = """\
commands:
  hello: {run: echo hi}
  train: {cluster: true, bin: target/release/train, local_devices: "cpu:2"}
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    root = tmp_path_factory.mktemp("contradictions")
    (root / "fdl.yml").write_text(PROJECT)
    return root, {" ".join(row["path"]): row for row in command_tree(root)}


def _words(row: dict, option: str) -> list[str]:
    """The option as a user writes it (with a value when it takes one)."""
    param = next(p for p in row["params"] if option in p["opts"] + p["secondary"])
    return [option, "x"] if param["takes_value"] and option in param["opts"] else [option]


def _refused(root: Path, row: dict, path: str, first: list[str], second: list[str]) -> None:
    has_json = any("--json" in p["opts"] for p in row["params"])
    argv = [*path.split(), *first, *second, *(["--json"] if has_json else [])]
    done = run_fdl(*argv, cwd=root)
    where = "fdl " + " ".join(argv)
    assert done.returncode == CONTRADICTION_EXIT.get(path, 2), (where, done.returncode, done.stderr)
    assert f"{first[0]} and {second[0]} contradict each other" in done.stderr, (where, done.stderr)
    assert "give one of them" in done.stderr and "Traceback" not in done.stderr, where
    if has_json:
        doc = json.loads(done.stdout)  # exactly one JSON document
        assert doc["ok"] is False and doc["exit_code"] == done.returncode, where


def test_every_on_off_flag_given_both_ways_is_refused_in_every_command(tree):
    root, rows = tree
    pairs = [(path, row, opt, off) for path, row in rows.items() for p in row["params"] if p["secondary"]
             for opt in p["opts"][:1] for off in p["secondary"][:1]]
    assert {(path, opt) for path, _, opt, _ in pairs} >= {("join-config", "--install-key"), ("join", "--persist")}
    for path, row, on, off in pairs:
        _refused(root, row, path, [on], [off])
        _refused(root, row, path, [off], [on])  # whichever comes first


def test_every_exclusive_pair_is_refused_and_names_real_options(tree):
    root, rows = tree
    for path, pairs in EXCLUSIVE.items():
        assert path in rows, f"EXCLUSIVE names a command fdl does not have: {path}"
        row = rows[path]
        options = {o for p in row["params"] for o in p["opts"] + p["secondary"]}
        for a, b, _ in pairs:
            assert {a, b} <= options, f"EXCLUSIVE[{path!r}] names an option {path} does not have: {a}, {b}"
            _refused(root, row, path, _words(row, a), _words(row, b))


def test_join_config_refuses_contradictory_flags_with_exit_1_and_writes_nothing(tree, tmp_path):
    """The seed's letter: join-config, exit 1, before anything else happens."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "fdl.yml").write_text(PROJECT)
    done = run_fdl("join-config", "b300", "--controller", "op@127.0.0.1:2299", "--install-key", "--yes",
                   "--no-install-key", cwd=root)
    assert done.returncode == 1
    assert done.stderr.strip() == ("fdl: error: --install-key and --no-install-key contradict each other: give one of "
                                   "them.")
    assert not (root / ".fdl").exists() and not (root / "fdl.b300.yml").exists()


def test_a_value_that_looks_like_an_option_is_not_taken_for_one():
    """`--served --no-install-key` names a directory called --no-install-key; only option names count."""
    import click

    command = click.Command("x", params=[click.Option(["--served"]),
                                         click.Option(["--install-key/--no-install-key"], default=None)])
    assert given_options(command, ["--served", "--no-install-key", "--install-key"]) == ["--served", "--install-key"]
    assert given_options(command, ["--served=--no-install-key", "--install-key"]) == ["--served", "--install-key"]
    assert given_options(command, ["--install-key", "--", "--no-install-key"]) == ["--install-key"]
