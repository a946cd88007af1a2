"""Fixtures for the launcher tests on the testbed: three namespace hosts and a torch interpreter they can run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.launch.helpers import torch_python

# This suite's own testbed prefix and /24, so it can run beside other suites' testbeds (FDL_TESTBED_PREFIX and
# FDL_TESTBED_NET move it, for a run beside another checkout's).
PREFIX = os.environ.get("FDL_TESTBED_PREFIX") or "fdll6"
NET = os.environ.get("FDL_TESTBED_NET") or "10.226.6"
HOSTS = 3


@pytest.fixture(scope="module")
def bed():
    """Three hosts h1..h3, torn down after the module."""
    from tests.testbed import Testbed
    from tests.testbed.plugin import require_testbed

    require_testbed()
    testbed = Testbed.up(HOSTS, prefix=PREFIX, net=NET)
    with testbed as built:
        yield built


@pytest.fixture(scope="module")
def torchpy(bed) -> Path:
    """A python3 with torch every host user can run (helpers.torch_python)."""
    return torch_python(bed.shared / "py")
