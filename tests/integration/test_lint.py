"""The Ansible content passes ansible-lint (production profile, offline) and yamllint, and every role is
documented: argument specs that match its defaults, and a README with every variable and an example play."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

BIN = Path(sys.executable).parent
ROLES = sorted(p for p in (REPO / "roles").iterdir() if (p / "tasks" / "main.yml").exists())


def lint_env(home: Path) -> dict:
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", HOME=str(home),
               XDG_CACHE_HOME=str(home / ".cache"), NO_COLOR="1", ANSIBLE_NOCOLOR="1", PY_COLORS="0")
    env.pop("ANSIBLE_CONFIG", None)
    # No collection but the clone's own: the roles resolve in place and their modules by FQCN through the
    # repository's ansible.cfg (its collections_path puts ansible_collections/, the links, first), and the
    # fresh home has no ~/.ansible/collections
    env.pop("ANSIBLE_COLLECTIONS_PATH", None)
    env["ANSIBLE_COLLECTIONS_SCAN_SYS_PATH"] = "False"
    return env


@pytest.mark.slow
def test_ansible_lint_passes_with_the_production_profile(tmp_path):
    done = subprocess.run([str(BIN / "ansible-lint")], cwd=REPO, env=lint_env(tmp_path / "home"), capture_output=True,
                          text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Profile 'production' was required, and it passed" in out, out


@pytest.mark.slow
def test_ansible_lint_refuses_a_task_the_house_style_forbids(tmp_path):
    """The repository's configuration is live: a short module name and a command without changed_when fail."""
    shutil.copy(REPO / ".ansible-lint", tmp_path / ".ansible-lint")
    tasks = tmp_path / "roles" / "sloppy" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "main.yml").write_text("---\n- name: List the files\n  command: ls /\n")
    done = subprocess.run([str(BIN / "ansible-lint")], cwd=tmp_path, env=lint_env(tmp_path / "home"),
                          capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "fqcn[action-core]" in out and "no-changed-when" in out, out


def test_yamllint_passes_on_every_yaml_file(tmp_path):
    done = subprocess.run([str(BIN / "yamllint"), "--strict", "."], cwd=REPO, env=lint_env(tmp_path / "home"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_yamllint_refuses_a_bad_file(tmp_path):
    shutil.copy(REPO / ".yamllint", tmp_path / ".yamllint")
    (tmp_path / "bad.yml").write_text("---\nkey: yes\nmode: 0644\n")
    done = subprocess.run([str(BIN / "yamllint"), "--strict", "."], cwd=tmp_path, env=lint_env(tmp_path / "home"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "(truthy)" in done.stdout and "(octal-values)" in done.stdout, done.stdout


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_argument_specs_match_the_defaults(role):
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    options = specs["main"]["options"]
    assert set(options) == set(defaults), f"{role.name}: defaults and meta/argument_specs.yml disagree"
    prefix = role.name + "_"
    for name, spec in options.items():
        assert name.startswith(prefix), f"{name} lacks the role prefix {prefix}"
        assert spec.get("description"), f"{name} has no description"
        value = defaults[name]
        templated = isinstance(value, str) and "{{" in value
        if "default" in spec and not templated:
            assert spec["default"] == value, f"{name}: spec default {spec['default']!r} != defaults {value!r}"
    private = role / "vars" / "main.yml"
    if private.exists():
        for name in yaml.safe_load(private.read_text()) or {}:
            assert name.startswith("_" + prefix), f"{role.name}/vars/main.yml: {name} is not _{prefix}*"


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_readme_names_every_variable_and_carries_an_example_play(role):
    readme = (role / "README.md").read_text()
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    for name in defaults:
        assert f"`{name}`" in readme, f"{role.name}/README.md does not document {name}"
    assert "## Example playbook" in readme
    example = readme.split("## Example playbook", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    plays = yaml.safe_load(example)
    roles_used = [r if isinstance(r, str) else r.get("role") or r.get("name")
                  for play in plays for r in play.get("roles", [])]
    tasks_used = [t.get("ansible.builtin.include_role", t.get("ansible.builtin.import_role", {})).get("name")
                  for play in plays for t in play.get("tasks", [])]
    fqcn = f"flodl.fdl.{role.name}"  # the way a collection's roles are used
    assert fqcn in roles_used + tasks_used, f"{role.name}/README.md's example play does not use {fqcn}"


def test_the_role_variables_in_docs_are_what_ansible_doc_says():
    """docs/ansible.md's role-variables section is scripts/role-variables' output, from the argument specs."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "role-variables")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    for role in ROLES:
        assert f"#### `flodl.fdl.{role.name}`" in done.stdout
    doc = (REPO / "docs" / "ansible.md").read_text()
    section = doc.split("<!-- role-variables: generated by scripts/role-variables -->", 1)[1]
    section = section.split("<!-- /role-variables -->", 1)[0]
    assert section.strip() == done.stdout.strip(), "docs/ansible.md is stale: run scripts/role-variables --write"
