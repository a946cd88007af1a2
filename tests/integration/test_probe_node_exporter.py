"""`fdl probe --textfile` read by a real node_exporter (Debian's prometheus-node-exporter) over HTTP.

node_exporter runs on loopback with only its textfile collector, pointed at a temporary directory; the
metrics it serves must be the file's, whole, and say what `fdl probe --json` said, before and after the probe
writes the file again with another verdict.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_fdl
from tests.controller_util import free_port
from tests.fakes import make_libtorch
from tests.prometheus import NodeExporter, need_tool, samples

PORTS = (26000, 26999)  # this suite's ports
FAULTY = "H100:9.0:80G:ecc_vol=2:pcie=4.8/5.16:pstate=0,H100:9.0:80G:persist=0"
HEALTHY = "H100:9.0:80G,H100:9.0:80G"


@pytest.fixture
def exporter(tmp_path: Path):
    directory = tmp_path / "textfile"
    directory.mkdir()
    binary = need_tool("prometheus-node-exporter", "prometheus-node-exporter")
    node = NodeExporter(binary, directory, tmp_path / "node_exporter.log").start(free_port(pairs=False, span=PORTS))
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


def test_two_fdl_files_are_a_duplicate_only_node_exporters_log_shows_and_fdl_names_it(exporter, fake_nvml, tmp_path,
                                                                                      monkeypatch) -> None:
    """Issue 38 item 15, the premise and the fix: with two fdl *.prom files in its directory, a real
    node_exporter still answers the scrape and says nothing of the duplicate outside its own log; the probe
    that writes the second file says so on stderr, naming the first."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("CUDA_VISIBLE_DEVICES", "LIBTORCH", "LIBTORCH_PATH", "LD_PRELOAD", "LD_LIBRARY_PATH"):
        monkeypatch.delenv(var, raising=False)
    project = tmp_path / "proj"
    make_libtorch(project / "libtorch", "precompiled/cu128", archs="9.0", nccl="2.27.5")
    first, second = exporter.directory / "fdl-probe.prom", exporter.directory / "fdl-probe-timer.prom"
    assert run_fdl("probe", "--skip-mount", "--textfile", str(first), cwd=project,
                   env=fake_nvml.env(HEALTHY)).returncode == 0
    logged = len(exporter.log.read_text())
    result = run_fdl("probe", "--skip-mount", "--textfile", str(second), cwd=project, env=fake_nvml.env(HEALTHY))
    assert result.returncode == 0
    assert f"fdl: warning: {first} in the same textfile directory holds fdl's probe metrics too" in result.stderr
    scraped = exporter.scrape_text()  # the scrape itself answers: nothing in it to alert on
    assert "fdl_probe_ready" in scraped
    assert "fdl_probe_ready" in exporter.log.read_text()[logged:]  # the duplicate: in node_exporter's log only
