"""fdl.hostside.checks.textfile: the exposition rules a report's metrics follow (the CLI tests run real probes)."""

from __future__ import annotations

import re

import pytest

from fdl.hostside.checks.report import CheckResult, HostReport
from fdl.hostside.checks.textfile import FAMILIES, LABEL_MAX, escape, render, write_textfile
from tests.prometheus import samples

SAMPLE = re.compile(r"^[a-z_]+(\{.*\})? -?[0-9.e+]+$")


def report(*checks: CheckResult, when: float | None = 1700000000.5) -> dict:
    return HostReport(host="node-a", checks=list(checks), time=when).to_dict()


def test_one_series_per_possible_status_and_the_verdict() -> None:
    text = render(report(CheckResult("gpu", "ok", "fine"), CheckResult("data", "error", "gone"),
                         CheckResult("later", "someday", "a status this version does not know")), now=1700000002.0)
    values = samples(text)
    assert values[("fdl_probe_ready", ())] == 0
    assert values[("fdl_probe_check_status", (("check", "data"), ("status", "error")))] == 1
    assert sum(v for (n, lab), v in values.items() if n == "fdl_probe_check_status" and ("check", "gpu") in lab) == 1
    later = [v for (n, lab), v in values.items() if n == "fdl_probe_check_status" and ("check", "later") in lab]
    assert later == [0, 0, 0, 0]  # bounded: only the four statuses, none of them true
    assert values[("fdl_probe_duration_seconds", ())] == 1.5
    assert values[("fdl_probe_last_run_timestamp_seconds", ())] == 1700000000.5


def test_format_help_and_type_once_per_family_no_timestamps_no_free_text() -> None:
    text = render(report(CheckResult("gpu_ecc", "error", "GPU 0: 2 errors \"quoted\"", hint="secret-free hint",
                                     data={"devices": [{"index": 0, "supported": True, "enabled": True,
                                                        "pending": True, "uncorrected_volatile": 2,
                                                        "uncorrected_aggregate": None}]})))
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert families == [name for name in FAMILIES if name in families] and len(families) == len(set(families))
    for line in text.splitlines():
        assert line.startswith("# ") or SAMPLE.match(line), line  # name{labels} value: never a timestamp
    assert "quoted" not in text and "hint" not in text  # messages and hints never become labels
    values = samples(text)
    assert values[("fdl_gpu_ecc_uncorrected_errors_total", (("gpu", "0"), ("scope", "volatile")))] == 2
    assert not [k for k in values if ("scope", "aggregate") in k[1]]  # a null reading is left out, not 0


def test_report_without_a_clock_reading_has_no_run_time() -> None:
    values = samples(render(report(CheckResult("gpu", "ok", "fine"), when=None)))
    assert ("fdl_probe_last_run_timestamp_seconds", ()) not in values
    assert ("fdl_probe_duration_seconds", ()) not in values


@pytest.mark.parametrize("raw, written", [
    ('a"b', 'a\\"b'), ("a\\b", "a\\\\b"), ("a\nb", "a\\nb"), ("a\x00\x1bb\u2028", "ab"), ("x" * 500, "x" * LABEL_MAX),
])
def test_label_values_escaped_stripped_and_capped(raw: str, written: str) -> None:
    assert escape(raw) == written


def test_write_textfile_is_atomic_and_world_readable(tmp_path) -> None:
    target = tmp_path / "fdl-probe.prom"
    target.write_text("old\n")
    text = write_textfile(str(target), report(CheckResult("gpu", "ok", "fine")))
    assert target.read_text() == text and oct(target.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["fdl-probe.prom"]
