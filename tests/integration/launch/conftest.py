"""Fixtures for the launcher tests on the testbed: three namespace hosts and a torch interpreter they can run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.launch.helpers import torch_python

PREFIX, NET = "fdll6", "10.226.6"


@pytest.fixture(scope="module")
def bed():
    from tests.testbed import Testbed
    from tests.testbed.plugin import require_testbed

    require_testbed()
    with Testbed.up(3, prefix=PREFIX, net=NET) as testbed:
        yield testbed


@pytest.fixture(scope="module")
def torchpy(bed) -> Path:
    return torch_python(bed.shared / "py")
