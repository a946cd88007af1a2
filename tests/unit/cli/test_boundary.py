"""The one error boundary (fdl.cli.main): how an FdlError reaches the person, and that nothing else exits."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from fdl.errors import ExitCode
from tests.conftest import fdl_env, run_fdl

FDL = Path(__file__).resolve().parents[3] / "fdl"

# fdl.cli.main imports typer, whose import warns under this click: run it in its own interpreter.
REPORT = """
import sys
from fdl.cli.main import report_error
from fdl.errors import FdlError, Outcome, PermanentError
def raised(exc):
    try:
        raise exc
    except Exception as caught:
        return caught
report_error(PermanentError("the spec does not parse", hint="write it as file:///abs/dir"), debug=False)
report_error(Outcome("no run listening at 127.0.0.1:1337 (connection refused)"), debug=False)
report_error(raised(FdlError("broken")), debug=bool(int(sys.argv[1])))
"""


def report(debug: bool) -> str:
    done = subprocess.run([sys.executable, "-c", REPORT, str(int(debug))], env=fdl_env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_an_error_is_labelled_an_outcome_is_not_and_a_traceback_needs_debug() -> None:
    err = report(debug=False)
    assert err == ("fdl: error: the spec does not parse\n  hint: write it as file:///abs/dir\n"
                   "fdl: no run listening at 127.0.0.1:1337 (connection refused)\n"  # an answer of no, not an error
                   "fdl: error: broken\n")
    assert "Traceback" in report(debug=True)


def test_a_usage_error_goes_through_the_boundary(tmp_path: Path) -> None:
    result = run_fdl("status", "--interval", "2", cwd=tmp_path)
    assert result.returncode == ExitCode.PERMANENT
    assert result.stderr == "fdl: error: --interval only applies with --watch.\n"


def _calls(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                names.append(f"{func.value.id}.{func.attr}")
            elif isinstance(func, ast.Name):
                names.append(func.id)
    return names


def test_only_the_boundary_exits() -> None:
    """Commands return their exit code or raise an FdlError; only fdl/cli/main.py turns either into an exit."""
    offenders = []
    for path in sorted((FDL / "cli").rglob("*.py")):
        if path.name == "main.py":
            continue
        calls = _calls(ast.parse(path.read_text()))
        offenders += [f"{path.relative_to(FDL)}: {name}" for name in calls
                      if name in ("typer.Exit", "sys.exit", "os._exit", "exit")
                      and not (path.name == "probe.py" and name == "sys.exit")]  # its __main__ guard
    assert offenders == []


@pytest.mark.parametrize("package", ["publish", "nccl", "controller"])
def test_libraries_render_nothing(package: str) -> None:
    """Renderers live in fdl/cli/render; these library packages neither print nor import a terminal UI."""
    offenders = []
    for path in sorted((FDL / package).rglob("*.py")):
        tree = ast.parse(path.read_text())
        offenders += [f"{path.relative_to(FDL)}: {name}" for name in _calls(tree)
                      if name in ("print", "typer.echo", "sys.exit")]
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                offenders += [f"{path.relative_to(FDL)}: imports {m}" for m in modules
                              if m.split(".")[0] in ("typer", "rich", "click")]
    assert offenders == []


def test_a_config_that_does_not_parse_is_permanent_for_join_and_a_failure_for_publish(tmp_path: Path) -> None:
    """join's contract: a spec that does not parse is permanent (2, so systemd stops re-dialing); publish's:
    every refusal is 1. Both come out of the one boundary, message first, no traceback."""
    (tmp_path / "fdl.yml").write_text("join:\n  controller: [10.0.0.1\n")
    joined = run_fdl("join", cwd=tmp_path)
    assert joined.returncode == ExitCode.PERMANENT, joined.stderr
    assert joined.stderr.startswith("fdl: error: ") and "fdl.yml" in joined.stderr
    published = run_fdl("publish", "file:///nowhere", "--bin", "x", cwd=tmp_path)
    assert published.returncode == ExitCode.FAILURE, published.stderr
    assert published.stderr.startswith("fdl: error: ") and "fdl.yml" in published.stderr
    assert "Traceback" not in joined.stderr + published.stderr
