"""The supported ansible-core lines are stated once (fdl/collection.py); every other statement of them agrees."""

from __future__ import annotations

import itertools
import re
import tomllib

import yaml

from fdl.collection import ANSIBLE_CORE_LINES, COMMAND_ANSIBLE_CORE_LINES
from tests import platforms
from tests.conftest import REPO
from tests.integration import test_collection


def _next(line: str) -> str:
    major, minor = line.split(".")
    return f"{major}.{int(minor) + 1}"


def _key(line: str) -> tuple[int, ...]:
    return tuple(int(part) for part in line.split("."))


def test_the_lines_are_consecutive_and_the_commands_are_the_newest():
    assert list(ANSIBLE_CORE_LINES) == sorted(ANSIBLE_CORE_LINES, key=_key)
    assert all(_next(a) == b for a, b in itertools.pairwise(ANSIBLE_CORE_LINES))
    assert ANSIBLE_CORE_LINES[-len(COMMAND_ANSIBLE_CORE_LINES):] == COMMAND_ANSIBLE_CORE_LINES


def test_pyproject_declares_the_commands_lines():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    [core] = [dep for dep in project["dependencies"] if re.match(r"ansible-core\b", dep)]
    bound = f">={COMMAND_ANSIBLE_CORE_LINES[0]},<{_next(COMMAND_ANSIBLE_CORE_LINES[-1])}"
    assert core == f"ansible-core{bound}"
    assert f"`ansible-core{bound}`" in (REPO / "docs" / "ansible.md").read_text()  # "Supported platforms"
    pinned = re.search(r"^ansible-core==([0-9.]+)$", (REPO / "constraints.txt").read_text(), re.M)
    assert pinned and ".".join(pinned.group(1).split(".")[:2]) in COMMAND_ANSIBLE_CORE_LINES


def test_the_collection_and_each_role_declare_the_collections_lines():
    runtime = yaml.safe_load((REPO / "collection" / "meta" / "runtime.yml").read_text())
    assert runtime["requires_ansible"] == f">={ANSIBLE_CORE_LINES[0]}.0,<{_next(ANSIBLE_CORE_LINES[-1])}.0"
    roles = sorted(p.parent.parent.name for p in (REPO / "roles").glob("*/meta/main.yml"))
    assert len(roles) == 8
    for role in roles:
        meta = yaml.safe_load((REPO / "roles" / role / "meta" / "main.yml").read_text())
        assert meta["galaxy_info"]["min_ansible_version"] == ANSIBLE_CORE_LINES[0], role
    readme = (REPO / "collection" / "README.md").read_text()
    assert f"ansible-core {ANSIBLE_CORE_LINES[0]} to {ANSIBLE_CORE_LINES[-1]}" in readme


def test_the_tests_run_every_line_and_no_other():
    assert platforms.LINES == COMMAND_ANSIBLE_CORE_LINES  # the controller matrix: fdl installed with each
    assert {combo.ansible for combo in platforms.MATRIX} == set(COMMAND_ANSIBLE_CORE_LINES)
    # the collection alone, one virtual environment per line the suite's own Python can install
    assert set(test_collection.CORE_LINES) <= set(ANSIBLE_CORE_LINES)
    assert set(test_collection.CORE_LINES) | set(platforms.LINES) == set(ANSIBLE_CORE_LINES)
