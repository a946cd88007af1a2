"""Prometheus' own tools as test oracles: promtool (Debian package prometheus) judges exposition text and
rules, and prometheus_client's parser reads metrics back as (name, labels) -> value."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import IN_CI


def need_tool(name: str, package: str) -> str:
    """The tool's path; a missing one fails under CI (scripts/apt-test.txt lists it) and skips elsewhere."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian package {package}; scripts/test.sh installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of an exposition: (name, sorted label pairs) -> value."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def promtool_accepts(text: str) -> None:
    """`promtool check metrics` passes the text without a word (its lint included)."""
    tool = need_tool("promtool", "prometheus")
    result = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "" and result.stderr.strip() == "", \
        (result.stdout, result.stderr)
