"""Every help page, read the way a user reads it (`fdl ... --help`), for every command of the real command tree:
each positional argument listed once, with its help, and the same options offered everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.command_tree import command_tree
from tests.conftest import run_fdl

PROJECT = """\
commands:
  hello: {run: echo hi, description: Says hi.}
  train: {cluster: true, bin: target/release/train, local_devices: "cpu:2"}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("help")
    (root / "fdl.yml").write_text(PROJECT)
    return root


def test_every_help_page_lists_each_argument_once_and_no_completion_options(project: Path) -> None:
    """Regression: with click 8.5 / typer 0.24, every command with an argument listed it twice, under
    "Positional arguments:" and again under "Arguments:"; `fdl libtorch --help` offered --install-completion
    and --show-completion, which `fdl --help` does not."""
    rows = command_tree(project)
    paths = [row["path"] for row in rows]
    assert ["libtorch", "download"] in paths and ["hello"] in paths and ["train"] in paths, paths
    problems = []
    for row in rows:
        where = "fdl " + " ".join([*row["path"], "--help"])
        result = run_fdl(*row["path"], "--help", cwd=project)
        if result.returncode != 0 or result.stderr:
            problems.append(f"{where}: exit {result.returncode}: {result.stderr}")
            continue
        lines = result.stdout.splitlines()
        arguments = [p["shown"] for p in row["params"] if p["kind"] == "argument"]
        sections = [line for line in lines if line.endswith("arguments:") or line.endswith("Arguments:")]
        if sections != (["Arguments:"] if arguments else []):
            problems.append(f"{where}: argument sections {sections}, expected one for {arguments}")
        for shown in arguments:
            listed = [line for line in lines if line.strip().startswith(shown)]
            if len(listed) != 1 or len(listed[0].strip()) <= len(shown) + 5:
                problems.append(f"{where}: {shown} listed {len(listed)} times (once, with its help, expected)")
        for option in ("--install-completion", "--show-completion"):
            if option in result.stdout:
                problems.append(f"{where}: offers {option}")
    assert problems == [], "\n".join(problems)
