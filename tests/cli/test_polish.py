"""The small dead ends a new user meets, each closed: `config show` output that is valid YAML, the nccl plan's
paste-able docker lines, --jobs defaulting to 6 (not the CPU count), "did you mean" for a mistyped command, a
broken fdl.yml named under `fdl --help`, skipped probe checks counted, and help text on every positional
argument."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.conftest import REPO, run_fdl
from tests.fakes.nccl_fixtures import nccl_project  # noqa: F401 - pytest fixture

MIXED = "GTX1080:6.1:8G,RTXPRO6000:12.0:96G"


def test_config_show_is_yaml_whose_values_are_the_configuration(tmp_path: Path) -> None:
    """Regression: a long value ran into its `# file:line` comment (`value# fdl.yml:11`), so YAML read the
    comment as part of the value."""
    long_value = "cargo build --release --bin train --features cuda,nccl,tensorboard-logging"
    (tmp_path / "fdl.yml").write_text(yaml.safe_dump({"commands": {"train": {"run": long_value},
                                                                   "t": {"run": "true"}}}))
    result = run_fdl("config", "show", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert all(re.search(r"\S\s{2,}# fdl\.yml:\d+$", line) for line in result.stdout.splitlines()
               if "# fdl.yml:" in line), result.stdout
    assert yaml.safe_load(result.stdout)["commands"]["train"]["run"] == long_value


def test_the_nccl_plan_prints_docker_lines_without_stray_quotes(nccl_project, fake_nvml) -> None:
    result = run_fdl("nccl", "build", "--dry-run", cwd=nccl_project, env=fake_nvml.env(MIXED))
    assert result.returncode == 0, result.stderr
    assert "docker rm <container>\n" in result.stdout + "\n" or "docker rm <container> " in result.stdout
    assert "<container>''" not in result.stdout


def test_nccl_jobs_default_to_six_as_the_seed_and_the_docs_say(nccl_project, fake_nvml) -> None:
    """Regression (issue 38 item 3): the default was the CPU count (up to 64 nvcc jobs of gigabytes each); seed
    000 and docs/nccl.md say 6. The plan, --help, the docs' line and the role's own default agree."""
    plan = json.loads(run_fdl("nccl", "build", "--dry-run", "--json", cwd=nccl_project,
                              env=fake_nvml.env(MIXED)).stdout)
    documented = re.search(r"fdl nccl build --jobs \d+ .*\(default (\d+)\)", (REPO / "docs/nccl.md").read_text())
    assert documented is not None
    role_default = yaml.safe_load((REPO / "roles/fdl_nccl/defaults/main.yml").read_text())["fdl_nccl_jobs"]
    assert plan["jobs"] == int(documented.group(1)) == role_default == plan["role_vars"]["fdl_nccl_jobs"] == 6
    assert f"(default {plan['jobs']}:" in " ".join(run_fdl("nccl", "build", "--help").stdout.split())


def test_a_mistyped_command_gets_a_suggestion(tmp_path: Path) -> None:
    result = run_fdl("prbe", cwd=tmp_path)
    assert result.returncode == 2 and "No such command 'prbe'. Did you mean 'probe'?" in result.stderr
    nothing_close = run_fdl("zzzz", cwd=tmp_path)
    assert nothing_close.returncode == 2 and "Did you mean" not in nothing_close.stderr


def test_help_names_a_broken_fdl_yml_instead_of_dropping_its_commands(tmp_path: Path) -> None:
    (tmp_path / "fdl.yml").write_text("commands:\n  train: {run: [}\n")
    result = run_fdl("--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "Project commands (fdl.yml):" in result.stdout
    assert "not listed: the configuration does not load: fdl.yml:2:" in result.stdout


def test_the_human_probe_report_counts_the_checks_it_skipped(tmp_path: Path, fake_nvml) -> None:
    env = {**fake_nvml.env("H100:9.0:80G"), "HOME": str(tmp_path), "FDL_LIBTORCH_FROM_PYTORCH": "0"}
    human = run_fdl("probe", cwd=tmp_path, env=env)
    doc = json.loads(run_fdl("probe", "--json", cwd=tmp_path, env=env).stdout)
    hidden = [c for c in doc["checks"] if c["status"] == "skipped" and c["name"] not in
              ("gpu", "libtorch", "nccl", "data")]
    assert hidden, "this scenario skips some depth checks"
    assert f"{len(hidden)} more check{'s' if len(hidden) != 1 else ''} skipped (`fdl probe --json` shows" \
        in human.stdout


def test_every_positional_argument_has_help(tmp_path: Path) -> None:
    for command, name in (("join", "[CONTROLLER]"), ("publish", "[SOURCE]"), ("join-config", "[LABEL]"),
                          ("libtorch download", "[VARIANT]"), ("libtorch activate", "VARIANT")):
        out = run_fdl(*command.split(), "--help", cwd=tmp_path).stdout
        section = out.split("Arguments:", 1)[1].split("Options:", 1)[0]
        line = next(line for line in section.splitlines() if line.strip().startswith(name))
        assert len(line.strip()) > len(name) + 5, f"fdl {command}: {name} has no help text:\n{section}"
