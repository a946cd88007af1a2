"""pytest fixtures for the SSH testbed (registered in tests/conftest.py).

    pytestmark = pytest.mark.testbed(hosts=4)     # size for every test in the module

    def test_something(testbed):                   # one testbed per module, torn down after it
        h1 = testbed.hosts[0]
        assert h1.ssh("id -un").stdout.strip() == h1.user

A test can also ask for a size directly with indirect parametrization:
`@pytest.mark.parametrize("testbed", [2], indirect=True)`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.conftest import IN_CI, need_root_or_skip
from tests.testbed.bed import Testbed, missing_tools

DEFAULT_HOSTS = 4


def testbed_size(request: pytest.FixtureRequest) -> int:
    if getattr(request, "param", None) is not None:
        return int(request.param)
    marker = request.node.get_closest_marker("testbed")
    if marker is not None and "hosts" in marker.kwargs:
        return int(marker.kwargs["hosts"])
    return DEFAULT_HOSTS


def require_testbed() -> None:
    """Skip (outside CI only, saying why) when the testbed cannot be built here."""
    need_root_or_skip("the testbed creates network namespaces, a bridge, users and sshd processes")
    missing = missing_tools()
    if missing:
        reason = f"the testbed needs {', '.join(missing)} (scripts/test.sh installs them)"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)


def testbed_extras(request: pytest.FixtureRequest) -> dict:
    """nodes= and behind= from the module's `testbed(...)` marker: execution nodes and the hosts behind them."""
    marker = request.node.get_closest_marker("testbed")
    kwargs = marker.kwargs if marker is not None else {}
    return {key: int(kwargs[key]) for key in ("nodes", "behind") if key in kwargs}


@pytest.fixture(scope="module")
def testbed(request: pytest.FixtureRequest):
    """A module-scoped testbed; size from the module's `testbed(hosts=N)` marker or the param, execution nodes and
    the hosts behind them from its `nodes=K, behind=M`."""
    require_testbed()
    with Testbed.up(testbed_size(request), **testbed_extras(request)) as bed:
        yield bed


@pytest.fixture
def testbed_home(testbed: Testbed, short_tmp: Path) -> dict:
    """Environment overrides for a controller-side process: a fresh HOME that trusts the testbed's host keys."""
    return testbed.home_env(short_tmp / "home")


@pytest.fixture
def short_tmp():
    """A temporary directory with a short path (ssh control sockets under it must fit in 104 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="fdlt", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def pytest_report_header(config) -> str | None:
    prefix = os.environ.get("FDL_TESTBED_PREFIX")
    return f"testbed prefix: {prefix}" if prefix else None
