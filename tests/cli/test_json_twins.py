"""Every --json twin prints one JSON document on stdout in every outcome: its report, or the failure's document
(`{"ok": false, "reason", "message", "hint", "exit_code"}`, from the one boundary in fdl/cli/main.py), while the
person still reads the error on stderr. Each command with --json is found by walking the real command tree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fdl.controller.policy import RunPolicy
from tests.cli.command_tree import command_tree, has_option
from tests.conftest import fdl_env, run_fdl
from tests.controller_util import free_port, serving

# Positional arguments a command needs to get as far as reading the configuration.
NEEDS = {("libtorch", "download"): ["cpu"], ("libtorch", "remove"): ["cpu"], ("join-config",): ["lab"]}
# join-config reads no fdl.yml before it asks its first question, which --json (no terminal) cannot answer
OWN_FAILURE = {("join-config",): "fdl_error"}

BROKEN = """\
clustr:
  workers: []
commands:
  train:
    clustr: true
    bin: target/release/train
    local_devices: cpu:two
"""


def one_document(text: str) -> dict:
    """stdout as exactly one JSON document (json.loads refuses a second one after the first)."""
    doc = json.loads(text)
    assert isinstance(doc, dict), text
    return doc


def assert_failure(doc: dict, code: int, reason: str) -> None:
    assert doc["ok"] is False and doc["exit_code"] == code and doc["reason"] == reason, doc
    assert isinstance(doc["message"], str) and doc["message"], doc


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> list[tuple[str, ...]]:
    rows = command_tree(tmp_path_factory.mktemp("tree"))
    found = [tuple(row["path"]) for row in rows if not row["group"] and has_option(row, "--json")]
    assert len(found) >= 10, found  # the walk reached the commands (probe, status, ..., libtorch list)
    return found


def test_every_json_twin_reports_a_configuration_that_does_not_load_as_one_document(tmp_path: Path, twins) -> None:
    (tmp_path / "fdl.yml").write_text(BROKEN)
    for path in twins:
        result = run_fdl(*path, *NEEDS.get(path, []), "--json", cwd=tmp_path)
        where = f"fdl {' '.join(path)} --json"
        assert result.returncode == 1, f"{where}: {result.stderr}"
        doc = one_document(result.stdout)
        if path in OWN_FAILURE:
            assert_failure(doc, 1, OWN_FAILURE[path])
            assert doc["message"] in result.stderr
            continue
        assert_failure(doc, 1, "config_error")
        # every error of the file, and the warnings that explain them, in the document and on stderr
        assert len(doc["errors"]) == 3 and all(error.startswith("fdl.yml:") for error in doc["errors"]), where
        assert any("did you mean 'cluster'" in warning for warning in doc["warnings"]), where
        assert result.stderr.count("fdl: error: fdl.yml:") == 3 and "Traceback" not in result.stderr, where


def test_status_and_start_with_no_run_listening(tmp_path: Path) -> None:
    port = free_port()
    for argv in (["status"], ["start", "--token", "ab"]):
        result = run_fdl(*argv, "--addr", f"127.0.0.1:{port}", "--json", cwd=tmp_path)
        assert result.returncode == 1
        doc = one_document(result.stdout)
        assert_failure(doc, 1, "no_run_listening")
        assert f"no run listening at 127.0.0.1:{port}" in doc["message"] and doc["message"] in result.stderr


def test_a_command_that_printed_its_own_document_gets_no_second_one(tmp_path: Path) -> None:
    """fdl start --json prints the controller's refusal itself (the same envelope); the boundary adds nothing."""
    with serving(RunPolicy(start="auto", quorum_hosts=2, window_s=600)) as server:
        result = run_fdl("start", "--addr", f"127.0.0.1:{server.port}", "--json", cwd=tmp_path,
                         env={"FDL_JOIN_TOKEN": server.policy.token})
    assert result.returncode == 1 and "[auto_mode]" in result.stderr
    assert_failure({**one_document(result.stdout), "exit_code": 1}, 1, "auto_mode")


@pytest.mark.parametrize(("argv", "message"), [
    (["status", "--json", "--bogus"], "No such option '--bogus'"),
    (["probe", "--json", "--collective", "--collective-max-size", "1Z"], "--collective-max-size '1Z'"),
    (["libtorch", "download", "--json"], "name a variant"),
    (["join", "--json"], "No such option '--json'"),  # no JSON twin, but JSON was asked for: the refusal is one
    (["status", "--interval", "2", "--json"], "--interval only applies with --watch"),
])
def test_a_command_line_that_does_not_parse_is_a_document_too(tmp_path: Path, argv, message) -> None:
    result = run_fdl(*argv, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    doc = one_document(result.stdout)
    assert_failure(doc, 2, "usage_error")
    assert message in doc["message"] and message in result.stderr


def test_without_json_stdout_stays_empty_and_a_project_command_keeps_its_own_json_flag(tmp_path: Path) -> None:
    result = run_fdl("status", "--addr", f"127.0.0.1:{free_port()}", cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    (tmp_path / "fdl.yml").write_text("commands:\n  echo: {run: 'echo args:'}\n")
    result = run_fdl("echo", "--json", cwd=tmp_path)  # the project's command gets --json, fdl adds nothing
    assert result.returncode == 0 and result.stdout == "args: --json\n", result.stdout
    result = run_fdl("publish", "--bin", "x", "--", "--json", cwd=tmp_path)  # the run's argument, not fdl's
    assert result.returncode == 1 and result.stdout == "", result.stdout


def test_an_interrupted_command_is_a_document(tmp_path: Path) -> None:
    """Ctrl-C while --watch --wait waits for a run: the answer is still one document on stdout."""
    proc = subprocess.Popen([sys.executable, "-m", "fdl", "status", "--watch", "--wait", "--json", "--addr",
                             f"127.0.0.1:{free_port()}"], cwd=tmp_path, env=fdl_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # ends when fdl does, should it end before it waits
            seen.append(line)
            if "waiting for one" in line:
                break
        assert seen and "waiting for one" in seen[-1], seen
        proc.send_signal(2)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    err = "".join(seen) + err
    doc = one_document(out)
    assert doc["ok"] is False and doc["exit_code"] == proc.returncode, (doc, err)
    # the signal lands in the wait between two looks (the answer: no run appeared) or during a look
    assert (proc.returncode, doc["message"]) in ((1, "stopped waiting; no run appeared"), (130, "interrupted")), \
        (doc, err)
