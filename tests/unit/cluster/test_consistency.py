"""Cross-host consistency checks over host reports: driver versions, GPU models, clock skew."""

from __future__ import annotations

import pytest

from fdl.cluster.consistency import (
    ClockSample,
    clock_samples,
    clock_skew,
    consistency_checks,
    driver_match,
    gpu_models,
)
from fdl.hostside.checks.report import CheckResult, HostReport


def host(name: str, driver: str | None = "570.133.20", gpus=("H100:sm_90",), *, time: float | None = 1000.0,
         status: str = "ok") -> HostReport:
    devices = [{"index": i, "name": g.split(":")[0], "sm": g.split(":")[1], "selected": True}
               for i, g in enumerate(gpus)]
    data = {"driver_version": driver, "devices": devices} if driver else {"devices": []}
    return HostReport(host=name, checks=[CheckResult("gpu", status, "...", data=data)], time=time)


# ---- driver versions ----

def test_one_driver_everywhere_is_ok() -> None:
    result = driver_match([host("a"), host("b"), host("c")])
    assert result.status == "ok" and "570.133.20" in result.message


def test_differing_drivers_warn_and_group_hosts() -> None:
    result = driver_match([host("a"), host("b", "550.54.15"), host("c")])
    assert result.status == "warning"
    assert "570.133.20 on a, c; 550.54.15 on b" in result.message
    assert result.hint and "one driver release" in result.hint
    assert result.data["versions"] == {"a": "570.133.20", "b": "550.54.15", "c": "570.133.20"}


def test_hosts_without_nvml_are_left_out_of_the_driver_comparison() -> None:
    result = driver_match([host("a"), host("b", None, (), status="error")])
    assert result.status == "skipped"


# ---- GPU models ----

def test_homogeneous_models() -> None:
    result = gpu_models([host("a", gpus=("H100:sm_90", "H100:sm_90")), host("b", gpus=("H100:sm_90",))])
    assert result.status == "ok" and result.data["heterogeneous"] is False
    assert "One GPU model across the cluster: H100 (sm_90)" in result.message


def test_heterogeneous_models_are_reported_not_failed() -> None:
    result = gpu_models([host("a", gpus=("H100:sm_90", "H100:sm_90")), host("b", gpus=("RTX3090:sm_86",))])
    assert result.status == "ok" and result.data["heterogeneous"] is True
    assert "(a: 2x H100 (sm_90); b: 1x RTX3090 (sm_86))" in result.message


def test_unselected_gpus_do_not_count() -> None:
    report = host("a", gpus=("H100:sm_90", "RTX3090:sm_86"))
    report.checks[0].data["devices"][1]["selected"] = False
    assert gpu_models([report, host("b")]).data["heterogeneous"] is False


# ---- clocks ----

def test_clocks_within_the_limit() -> None:
    samples = [ClockSample("a", 100.4, 100.0, 100.5), ClockSample("b", 101.9, 100.0, 100.5)]
    result = clock_skew(samples)
    assert result.status == "ok" and result.data["offsets"]["b"] == {"offset_s": 1.65, "uncertainty_s": 0.25}


def test_a_host_ahead_by_more_than_the_limit_warns() -> None:
    samples = [ClockSample("a", 100.2, 100.0, 100.5), ClockSample("b", 142.0, 100.0, 100.5)]
    result = clock_skew(samples)
    assert result.status == "warning"
    assert "The clock of b is 41.8 s ahead of this machine's (±0.2 s)" in result.message
    assert "NTP" in result.hint


def test_a_slow_round_trip_does_not_invent_skew() -> None:
    """Reading taken somewhere in a 20 s window: 8 s off the midpoint is not certainly 5 s off."""
    result = clock_skew([ClockSample("a", 118.0, 100.0, 120.0)])
    assert result.status == "ok"


def test_a_host_behind_warns() -> None:
    result = clock_skew([ClockSample("a", 80.0, 100.0, 100.2)])
    assert result.status == "warning" and "20.1 s behind this machine's" in result.message


def test_two_hosts_apart_from_each_other_warn_even_when_each_is_near_this_machine() -> None:
    samples = [ClockSample("a", 104.0, 100.0, 100.1), ClockSample("b", 96.0, 100.0, 100.1)]
    result = clock_skew(samples)
    assert result.status == "warning" and "the clocks of a and b are at least 7.9 s apart" in result.message.lower()


def test_limit_is_settable() -> None:
    samples = [ClockSample("a", 103.0, 100.0, 100.1)]
    assert (clock_skew(samples).status, clock_skew(samples, limit_s=1.0).status) == ("ok", "warning")


def test_samples_pair_report_times_with_windows() -> None:
    reports = [host("a", time=50.0), host("b", time=None), host("c", time=70.0)]
    samples = clock_samples(reports, {"a": (49.0, 49.5), "b": (1.0, 2.0)})
    assert samples == [ClockSample("a", 50.0, 49.0, 49.5)]


@pytest.mark.parametrize("reports", [[], [host("a", time=None)]])
def test_no_clock_readings_skip(reports) -> None:
    assert clock_skew(clock_samples(reports, {})).status == "skipped"


def test_consistency_checks_in_order() -> None:
    names = [c.name for c in consistency_checks([host("a"), host("b")], {"a": (999.0, 1001.0)})]
    assert names == ["driver_match", "gpu_models", "clock_skew"]
