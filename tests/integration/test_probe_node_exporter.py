"""`fdl probe --textfile` read by a real node_exporter (Debian's prometheus-node-exporter) over HTTP.

node_exporter runs on loopback with only its textfile collector, pointed at a temporary directory; the
metrics it serves must be the file's, whole, and say what `fdl probe --json` said, before and after the probe
writes the file again with another verdict.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import run_fdl
from tests.controller_util import free_port
from tests.fakes import make_libtorch
from tests.prometheus import need_tool, samples

PORTS = (26000, 26999)  # this suite's ports
FAULTY = "H100:9.0:80G:ecc_vol=2:pcie=4.8/5.16:pstate=0,H100:9.0:80G:persist=0"
HEALTHY = "H100:9.0:80G,H100:9.0:80G"


class NodeExporter:
    """prometheus-node-exporter with its textfile collector alone, on a free loopback port."""

    def __init__(self, directory: Path, log: Path):
        self.directory = directory
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> NodeExporter:
        binary = need_tool("prometheus-node-exporter", "prometheus-node-exporter")
        for _ in range(5):  # a port can be taken between the check and the bind: try another
            port = free_port(pairs=False, span=PORTS)
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(
                    [binary, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
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
        raise AssertionError(f"node_exporter never served {self.url}:\n{self.log.read_text()[-3000:]}")

    def scrape(self) -> dict:
        response = requests.get(self.url, timeout=10)
        assert response.status_code == 200
        return samples(response.text)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def exporter(tmp_path: Path):
    directory = tmp_path / "textfile"
    directory.mkdir()
    node = NodeExporter(directory, tmp_path / "node_exporter.log").start()
    try:
        yield node
    finally:
        node.stop()


def fdl_values(scraped: dict) -> dict:
    return {key: value for key, value in scraped.items() if key[0].startswith("fdl_")}


def test_node_exporter_serves_the_probe_metrics_as_fdl_probe_json_reports_them(exporter, fake_nvml, tmp_path,
                                                                               monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("CUDA_VISIBLE_DEVICES", "LIBTORCH", "LIBTORCH_PATH", "LD_PRELOAD", "LD_LIBRARY_PATH"):
        monkeypatch.delenv(var, raising=False)
    project = tmp_path / "proj"
    make_libtorch(project / "libtorch", "precompiled/cu128", archs="9.0", nccl="2.27.5")
    target = exporter.directory / "fdl-probe.prom"
    assert fdl_values(exporter.scrape()) == {}  # nothing before the probe ran

    for devices, ready in ((FAULTY, 0), (HEALTHY, 1)):
        result = run_fdl("probe", "--json", "--skip-mount", "--textfile", str(target), cwd=project,
                         env=fake_nvml.env(devices))
        doc = json.loads(result.stdout)
        assert result.returncode == 1 - ready and doc["ok"] is bool(ready), result.stderr
        scraped = exporter.scrape()
        assert scraped[("node_textfile_scrape_error", ())] == 0  # the collector parsed the file
        assert fdl_values(scraped) == samples(target.read_text())  # the file, whole, and nothing else
        assert scraped[("fdl_probe_ready", ())] == ready
        assert scraped[("fdl_probe_last_run_timestamp_seconds", ())] == doc["time"]
        for check in doc["checks"]:
            assert scraped[("fdl_probe_check_status", (("check", check["name"]), ("status", check["status"])))] == 1
        ecc = next(c for c in doc["checks"] if c["name"] == "gpu_ecc")["data"]["devices"]
        for device in ecc:
            key = ("fdl_gpu_ecc_uncorrected_errors_total", (("gpu", str(device["index"])), ("scope", "volatile")))
            assert scraped[key] == device["uncorrected_volatile"]
        pcie = next(c for c in doc["checks"] if c["name"] == "gpu_pcie")["data"]["devices"]
        for device in pcie:
            gpu = (("gpu", str(device["index"])),)
            assert (scraped[("fdl_gpu_pcie_link_width", gpu)], scraped[("fdl_gpu_pcie_link_width_max", gpu)]) == \
                (device["width"], device["width_max"])
        persistence = next(c for c in doc["checks"] if c["name"] == "gpu_persistence")["data"]["devices"]
        assert {d["index"]: int(d["persistence"]) for d in persistence} == \
            {int(dict(lab)["gpu"]): v for (n, lab), v in scraped.items() if n == "fdl_gpu_persistence_mode"}
    assert scraped[("fdl_gpu_ecc_uncorrected_errors_total", (("gpu", "0"), ("scope", "volatile")))] == 0
