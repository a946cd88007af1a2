"""The CLI shell: help, version, env selectors, --gpus, project commands, config show."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from fdl import __version__
from tests.conftest import run_fdl


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "fdl.yml").write_text(textwrap.dedent("""\
        commands:
          test:
            run: printf '%s|' base
          train:
            cluster: true
            bin: target/release/train
        """))
    (tmp_path / "fdl.farm.yml").write_text(textwrap.dedent("""\
        cluster:
          controller:
            host: 127.0.0.1
            join: {discovery: true, start: manual}
        commands:
          test:
            run: printf '%s|' farm
        """))
    return tmp_path


def test_help_lists_builtins_and_project_commands(project: Path) -> None:
    result = run_fdl("--help", cwd=project)
    assert result.returncode == 0
    for word in ("probe", "status", "start", "config", "--env", "--gpus", "--debug", "Project commands", "test"):
        assert word in result.stdout
    assert run_fdl("-h", cwd=project).stdout == result.stdout


def test_version() -> None:
    result = run_fdl("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"fdl {__version__}")


def test_python_dash_m_and_console_script_agree() -> None:
    import subprocess
    import sys

    script = Path(sys.executable).parent / "fdl"  # installed next to the interpreter running the tests
    assert script.exists(), "the fdl console script is missing; install with scripts/install.sh"
    out = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert out.stdout.strip() == f"fdl {__version__}"


@pytest.mark.parametrize("selector", [["@farm"], ["--env", "farm"], ["--env=farm"]])
def test_env_selectors_pick_the_overlay(project: Path, selector: list[str]) -> None:
    result = run_fdl(*selector, "test", "--", "a b", "c;d", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "farm|a b|c;d|"
    assert "trains on this box only" in result.stderr  # non-cluster command under a discovery window


def test_fdl_env_variable_and_precedence(project: Path) -> None:
    (project / "fdl.other.yml").write_text("commands:\n  test: {run: printf other}\n")
    assert run_fdl("test", cwd=project, env={"FDL_ENV": "farm"}).stdout == "farm|"
    assert run_fdl("@other", "test", cwd=project, env={"FDL_ENV": "farm"}).stdout == "other"
    assert run_fdl("--env", "farm", "@other", "test", cwd=project).stdout == "farm|"


def test_missing_env_exits_1_naming_file_and_envs(project: Path) -> None:
    result = run_fdl("@nope", "config", "show", cwd=project)
    assert result.returncode == 1
    assert "fdl.nope.yml" in result.stderr and "envs that exist here: farm" in result.stderr
    assert "Traceback" not in result.stderr


def test_project_command_exit_code_passes_through(tmp_path: Path) -> None:
    (tmp_path / "fdl.yml").write_text("commands:\n  fail: {run: 'exit 7'}\n")
    assert run_fdl("fail", cwd=tmp_path).returncode == 7


def test_cluster_command_without_workers_runs_once_and_says_so(project: Path) -> None:
    # no cluster workers, no --gpus, no local_devices: nothing to launch, so bin runs once (here: not built)
    result = run_fdl("train", cwd=project)
    assert result.returncode == 1
    assert "'train' runs once, on this machine: there are no cluster workers" in result.stderr
    assert "cannot run bin 'target/release/train' of 'train'" in result.stderr


def test_unknown_command(project: Path) -> None:
    result = run_fdl("frobnicate", cwd=project)
    assert result.returncode == 2
    assert "No such command 'frobnicate'" in result.stderr


@pytest.mark.parametrize(
    "spec, message",
    [
        ("0,0", "GPU 0 is listed twice"),
        ("x", "'x' is not a GPU index"),
        ("-1", "-1 is negative"),
        ("0,,1", "an empty entry"),
        ("", "--gpus needs a value"),
    ],
)
def test_gpus_errors_are_loud(project: Path, spec: str, message: str) -> None:
    result = run_fdl("--gpus", spec, "config", "show", cwd=project)
    assert result.returncode == 2
    assert message in result.stderr


def test_gpus_missing_value(project: Path) -> None:
    result = run_fdl("config", "show", "--gpus", cwd=project)
    assert result.returncode == 2
    result = run_fdl("--gpus", cwd=project)
    assert result.returncode == 2
    assert "requires an argument" in result.stderr or "--gpus" in result.stderr


@pytest.mark.parametrize("given", [["--gpus", "0", "--gpus", "1"], ["--gpus=all", "--gpus", "all"],
                                   ["--gpus", "0", "--gpus=0"]])
def test_gpus_given_twice_is_a_loud_error_not_last_wins(project: Path, given: list[str]) -> None:
    """Regression (issue 38 item 1): `fdl --gpus 0 --gpus 1 CMD` ran with GPU 1; seed 000 says a loud error on a
    duplicate. Nothing runs: the project command would have printed."""
    (project / "fdl.yml").write_text("commands:\n  cvd: {run: 'printf ran'}\n")
    result = run_fdl(*given, "cvd", cwd=project)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "--gpus is given 2 times" in result.stderr and "give it once" in result.stderr
    json_twin = run_fdl(*given, "config", "show", "--json", cwd=project)
    assert json_twin.returncode == 2 and json.loads(json_twin.stdout)["reason"] == "usage_error"


def test_conflicting_env_selectors_warn_once_and_the_strongest_wins(project: Path) -> None:
    """Regression (issue 38 item 7): --env, @NAME and FDL_ENV naming different envs gave no word of it. The
    order is DESIGN.md's (--env, then @NAME, then FDL_ENV); one warning line on stderr names the winner."""
    (project / "fdl.other.yml").write_text("commands:\n  test: {run: printf other}\n")
    both = run_fdl("--env", "farm", "@other", "test", cwd=project, env={"FDL_ENV": "other"})
    assert both.stdout == "farm|"
    warnings = [line for line in both.stderr.splitlines() if "overrides" in line]
    assert warnings == ["fdl: warning: --env farm overrides @other and FDL_ENV=other: using env 'farm' (strongest "
                        "first: --env NAME, then @NAME, then FDL_ENV)."]
    sigil = run_fdl("@other", "test", cwd=project, env={"FDL_ENV": "farm"})
    assert sigil.stdout == "other"
    assert "fdl: warning: @other overrides FDL_ENV=farm: using env 'other'" in sigil.stderr
    agreeing = run_fdl("--env", "other", "@other", "test", cwd=project, env={"FDL_ENV": "other"})
    assert agreeing.stdout == "other" and "overrides" not in agreeing.stderr
    assert "overrides" not in run_fdl("@other", "test", cwd=project).stderr


@pytest.mark.parametrize("argv, fixed", [
    (["probe", "--gpus", "0"], "fdl --gpus 0 probe"),
    (["probe", "--cpu", "--gpus=all"], "fdl --gpus=all probe --cpu"),
    (["@farm", "probe", "--env", "farm"], "fdl --env farm @farm probe"),
    (["config", "show", "--debug"], "fdl --debug config show"),
    (["--json", "probe"], "fdl probe --json"),
    (["--data-path", "/srv/data", "probe", "--cpu"], "fdl probe --data-path /srv/data --cpu"),
    (["--json", "libtorch", "list"], "fdl libtorch list --json"),
])
def test_an_option_on_the_wrong_side_of_the_command_says_where_it_goes(project: Path, argv: list[str],
                                                                       fixed: str) -> None:
    """Regression (issue 38 item 11): `fdl probe --gpus 0` answered "No such option '--gpus'. Did you mean
    '--cpu'?" and `fdl --json probe` "Did you mean '--version'?". The error now names where the option goes
    and gives the command line put right, which then parses."""
    result = run_fdl(*argv, cwd=project)
    assert result.returncode == 2
    assert "Did you mean" not in result.stderr
    assert f"Write: {fixed}" in " ".join(result.stderr.split())
    kind = "a global option of fdl" if argv[0] != "--json" and argv[0] != "--data-path" else "not a global option"
    assert kind in result.stderr
    if "--json" in argv:  # asked for JSON: one JSON document on stdout, as for any failure
        assert json.loads(result.stdout)["reason"] == "usage_error"
    assert "No such option" not in run_fdl(*fixed.split()[1:], "--help", cwd=project).stderr


def test_an_option_that_belongs_nowhere_keeps_clicks_own_error(project: Path) -> None:
    result = run_fdl("probe", "--gpu", "0", cwd=project)
    assert result.returncode == 2 and "No such option '--gpu'" in result.stderr


def test_gpus_selection_shows_in_config_and_scopes_processes(project: Path) -> None:
    shown = run_fdl("--gpus", "1,0", "config", "show", cwd=project, env={"LD_LIBRARY_PATH": "/nonexistent"})
    assert shown.returncode == 0, shown.stderr
    assert "# --gpus: 1,0" in shown.stdout
    doc = json.loads(run_fdl("--gpus", "1,0", "config", "show", "--json", cwd=project).stdout)
    assert doc["selection"]["gpus"] == [1, 0]
    (project / "fdl.yml").write_text("commands:\n  cvd: {run: 'printf %s \"$CUDA_VISIBLE_DEVICES\"'}\n")
    assert run_fdl("--gpus", "1,0", "cvd", cwd=project).stdout == "1,0"


def test_config_show_json_twin(project: Path) -> None:
    doc = json.loads(run_fdl("@farm", "config", "show", "--json", cwd=project).stdout)
    assert doc["env"] == "farm" and doc["env_source"] == "@sigil"
    assert doc["files"] == ["fdl.yml", "fdl.farm.yml"]
    assert doc["config"]["commands"]["test"]["run"] == "printf '%s|' farm"
    assert doc["origins"]["commands.test.run"] == "fdl.farm.yml:7"
    assert doc["origins"]["commands.train.bin"] == "fdl.yml:6"


def test_config_show_positional_env(project: Path) -> None:
    result = run_fdl("config", "show", "farm", cwd=project)
    assert result.returncode == 0
    assert "# env: farm (from the ENV argument)" in result.stdout
    assert "discovery: true" in result.stdout and "# fdl.farm.yml:4" in result.stdout
    assert json.loads(run_fdl("config", "show", "farm", "--json", cwd=project).stdout)["env_source"] == "argument"


def test_a_missing_env_names_how_it_was_selected(project: Path) -> None:
    """Regression: a positional env that has no overlay was said to be "selected by --env"."""
    for argv, how in ((["config", "show", "nosuch"], "the ENV argument"), (["--env", "nosuch", "config", "show"],
                      "--env"), (["@nosuch", "config", "show"], "@nosuch")):
        result = run_fdl(*argv, cwd=project)
        assert result.returncode == 1
        assert result.stderr.startswith(f"fdl: error: env 'nosuch' (selected by {how}) has no overlay: "), argv
    result = run_fdl("config", "show", "nosuch", cwd=project, env={"FDL_ENV": "farm"})
    assert "(selected by the ENV argument)" in result.stderr  # the argument wins over FDL_ENV, and says so
