"""What a person reads about their fdl.yml: every error in one run, the warnings that explain them first, and
`config show` saying which keys are not in force."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.conftest import run_fdl

TYPO = """\
commands:
  train:
    clustr: true
    bin: target/release/train
    local_devices: cpu:two
"""


def test_a_typo_and_a_bad_value_are_reported_together_warning_first(tmp_path: Path) -> None:
    """Regression: only "local_devices only on a cluster: true command" was printed, without the did-you-mean
    warning that explains it, and a second run found the second error."""
    (tmp_path / "fdl.yml").write_text(TYPO)
    result = run_fdl("train", cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith("fdl: warning: fdl.yml:3: unknown key 'commands.train.clustr' (did you mean "
                               "'cluster'?)")
    assert [line.split(": ", 4)[2:4] for line in lines[1:]] == [
        ["fdl.yml:2", "commands.train"], ["fdl.yml:5", "commands.train.local_devices"],
        ["fdl.yml:5", "commands.train.local_devices"]]
    assert all(line.startswith("fdl: error: ") for line in lines[1:])
    assert "only on a cluster: true command" in lines[2] and "cpu:N needs N from 1 to 256" in lines[3]
    (tmp_path / "fdl.yml").write_text(TYPO.replace("clustr", "cluster").replace("cpu:two", "cpu:2"))
    assert run_fdl("config", "show", cwd=tmp_path).returncode == 0  # the one run named everything to fix


def test_config_show_marks_what_is_ignored(tmp_path: Path) -> None:
    """Regression: an unknown top-level block was warned about, then shown as if it were in force."""
    (tmp_path / "fdl.yml").write_text("clustr:\n  workers: [{host: a}]\ncommands:\n  t: {run: echo, descripton: x}\n")
    result = run_fdl("config", "show", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "clustr:" in result.stdout and "# fdl.yml:1 (ignored: unknown key)" in result.stdout
    marked = [[part.strip() for part in line.split("  # ")] for line in result.stdout.splitlines() if "ignored" in line]
    assert marked == [["clustr:", "fdl.yml:1 (ignored: unknown key)"],
                      ["descripton: x", "fdl.yml:4 (ignored: unknown key)"]]  # only the unknown keys themselves
    assert yaml.safe_load(result.stdout)["clustr"] == {"workers": [{"host": "a"}]}  # still YAML
    assert "did you mean 'cluster'" in result.stderr
    doc = json.loads(run_fdl("config", "show", "--json", cwd=tmp_path).stdout)
    assert doc["ignored"] == ["clustr", "commands.t.descripton"]
