"""run_probe as a library: options are plain JSON, the report round-trips, a crashing check is contained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fdl.hostside.checks import probe as probe_module
from fdl.hostside.checks.probe import ProbeOptions, run_probe
from fdl.hostside.checks.report import HostReport


def test_options_are_plain_json_with_the_documented_defaults() -> None:
    options = ProbeOptions()
    assert json.loads(json.dumps(options.to_dict())) == {
        "data_path": "/flodl/data", "skip_mount": False, "libtorch_path": None, "docker": None,
        "project_root": None, "gpus": None, "local_devices": None, "whole_gpus": None, "interpreter_setting": None}


def test_report_round_trips_through_json(tmp_path: Path) -> None:
    report = run_probe(ProbeOptions(data_path=str(tmp_path), project_root=str(tmp_path)), host="h1",
                       environ={"HOME": str(tmp_path)})
    doc = json.loads(json.dumps(report.to_dict()))
    assert HostReport.from_dict(doc).to_dict() == doc
    assert doc["host"] == "h1" and doc["ok"] is (not any(c["status"] == "error" for c in doc["checks"]))


def test_a_crashing_check_becomes_its_error_and_the_rest_still_run(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(path, skip):
        raise RuntimeError("boom")

    monkeypatch.setattr(probe_module, "check_data_path", explode)
    report = run_probe(ProbeOptions(project_root=str(tmp_path)), host="h1", environ={"HOME": str(tmp_path)})
    data = report.check("data")
    assert data.status == "error"
    assert "crashed: RuntimeError: boom" in data.message
    assert tuple(c.name for c in report.checks) == probe_module.CHECK_NAMES
