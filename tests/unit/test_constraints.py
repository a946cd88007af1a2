"""constraints.txt, the releases scripts/install.sh and scripts/test.sh install, agrees with pyproject.toml.

Every dependency fdl declares (its own and its test extras') is pinned there, at a release the declared
bounds accept: a bound moved or a dependency added without re-running scripts/refresh-constraints fails
here instead of in a fresh install. Each pin is exact and appears once.
"""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO


def pins() -> dict[str, Version]:
    found: dict[str, Version] = {}
    for raw in (REPO / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        assert match, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        name = canonicalize_name(match[1])
        assert name not in found, f"constraints.txt pins {name} twice"
        found[name] = Version(match[2])
    return found


def declared() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in [*project["dependencies"], *project["optional-dependencies"]["test"]]]


def test_every_declared_dependency_is_pinned_within_its_bounds():
    pinned = pins()
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        assert name in pinned, (f"{requirement.name} is declared in pyproject.toml but not pinned in "
                                f"constraints.txt: run scripts/refresh-constraints")
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"constraints.txt pins {name}=={pinned[name]}, outside pyproject.toml's {requirement}: "
            f"run scripts/refresh-constraints")


def test_fdl_itself_and_torch_are_not_pinned():
    pinned = pins()
    assert "fdl" not in pinned  # the checkout is what gets installed
    assert "torch" not in pinned  # installed apart, as the machine needs (scripts/test.sh)
