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


BROKEN = """\
cluster:
  controller: {host: 127.0.0.1, port: 99999}
  workers:
    - host: node-b
      python: python3
    - address: 10.0.0.3
commands:
  test: {run: echo}
"""


def test_config_show_prints_the_document_with_its_errors_marked(tmp_path: Path) -> None:
    """Regression (issue 38 item 13): with an error in the configuration `fdl config show` printed nothing on
    stdout, so the document the errors are about was not in front of the person fixing them. It is printed
    (still YAML), each error beside its key (an absent key's error beside the entry that lacks it), the
    errors are on stderr as for any command, and the exit code is still 1."""
    (tmp_path / "fdl.yml").write_text(BROKEN)
    result = run_fdl("config", "show", cwd=tmp_path)
    assert result.returncode == 1
    assert "# 3 errors in this configuration" in result.stdout
    marked = {line.split("  # ")[0].strip(): line.split("  # ", 1)[1] for line in result.stdout.splitlines()
              if "(error: " in line and not line.startswith("#")}
    assert marked == {
        "port: 99999": "fdl.yml:2 (error: expected a TCP port from 1 to 65535, found 99999.)",
        "python: python3": marked["python: python3"],
        "-": "fdl.yml:6 (error: expected the worker's logical host name, found nothing (null). Every worker needs "
             "host:.)"}
    assert marked["python: python3"].startswith("fdl.yml:5 (error: expected the absolute path of a Python")
    assert yaml.safe_load(result.stdout)["cluster"]["workers"][0]["python"] == "python3"  # still YAML
    assert "test:" in result.stdout  # the parts that are fine are shown too
    errors = [line for line in result.stderr.splitlines() if line.startswith("fdl: error: ")]
    assert [line.split(": ", 4)[2:4] for line in errors] == [
        ["fdl.yml:2", "cluster.controller.port"], ["fdl.yml:5", "cluster.workers[0].python"],
        ["fdl.yml:6", "cluster.workers[1].host"]]

    twin = run_fdl("config", "show", "--json", cwd=tmp_path)
    assert twin.returncode == 1
    doc = json.loads(twin.stdout)  # one document: the configuration, in the failure's envelope
    assert (doc["ok"], doc["reason"], doc["exit_code"]) == (False, "config_error", 1)
    assert doc["config"]["commands"]["test"] == {"run": "echo"}
    assert len(doc["errors"]) == 3 and doc["error_paths"] == ["cluster.controller.port",
                                                             "cluster.workers[0].python", "cluster.workers[1].host"]
    (tmp_path / "fdl.yml").write_text("commands: {test: [}\n")  # does not parse: nothing to show
    unreadable = run_fdl("config", "show", cwd=tmp_path)
    assert unreadable.returncode == 1 and unreadable.stdout == "" and "fdl.yml:1" in unreadable.stderr
