"""Helpers for cluster unit tests: a project directory with fdl.yml and an env overlay."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest


@pytest.fixture
def project(tmp_path: Path):
    """write(name, text) writes a dedented file into a fresh project directory and returns its path."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    write("fdl.yml", "commands:\n  test: echo hi\n")
    write.root = tmp_path
    return write
