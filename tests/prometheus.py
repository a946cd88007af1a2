"""Prometheus' own tools as test oracles: promtool (Debian package prometheus) judges exposition text and
rules, prometheus_client's parser reads metrics back as (name, labels) -> value, and NodeExporter runs Debian's
prometheus-node-exporter with its textfile collector alone (the tests and bench/probe_textfile.py)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
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


class NodeExporter:
    """prometheus-node-exporter serving one textfile directory on a loopback port, nothing else collected."""

    def __init__(self, binary: str, directory: Path, log: Path):
        self.binary = binary
        self.directory = directory
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, port: int) -> NodeExporter:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
                 "--collector.textfile", f"--collector.textfile.directory={self.directory}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                requests.get(self.url, timeout=2)
                return self
            except requests.ConnectionError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"node_exporter never served {self.url}:\n{self.log.read_text()[-3000:]}")

    def scrape_text(self) -> str:
        response = requests.get(self.url, timeout=10)
        response.raise_for_status()
        return response.text

    def scrape(self) -> dict:
        return samples(self.scrape_text())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
