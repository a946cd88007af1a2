"""The human cluster report (fdl.cli.render.probe): every cross-host check in one block, ok, skipped with the
reason, or failed with its hint; a verdict that names only what was compared."""

from __future__ import annotations

from pathlib import Path

from fdl.cli.render.probe import render_cluster
from fdl.cluster.consistency import consistency_checks
from fdl.cluster.probe import ClusterReport, cross_host_checks
from fdl.hostside.checks.probe import ProbeOptions, run_probe
from fdl.hostside.checks.report import CheckResult, HostReport
from fdl.hostside.checks.verdict import summary_line
from tests.fakes import make_libtorch

GREEN = [
    CheckResult("nccl_match", "ok", "Every host has NCCL 2.27.x (2.27.5 on a, b)."),
    CheckResult("libtorch_match", "ok", "Every host has libtorch 2.10.0."),
    CheckResult("data_match", "ok", "The shared data path is available on all 2 hosts checked."),
    CheckResult("driver_match", "ok", "Every host runs NVIDIA driver 570.133.20."),
    CheckResult("gpu_models", "ok", "One GPU model across the cluster: H100 (sm_90)."),
    CheckResult("clock_skew", "ok", "Host clocks agree with this machine's within 5 s (largest offset 0.1 s, "
                                    "spread 0.0 s)."),
]


def hosts() -> list[HostReport]:
    return [HostReport(host=name, checks=[CheckResult("libtorch", "ok", "libtorch", data={"version": "2.10.0"})])
            for name in ("a", "b")]


def block(out: str) -> list[str]:
    lines = out.splitlines()
    start = lines.index("cross-host checks:")
    return lines[start + 1:-1]


def test_a_green_cluster_shows_every_cross_host_check_and_what_the_hosts_agree_on() -> None:
    out, err = render_cluster(ClusterReport(hosts=hosts(), cluster=list(GREEN)))
    assert err == ""
    assert block(out) == [
        "  ok       nccl_match      Every host has NCCL 2.27.x (2.27.5 on a, b).",
        "  ok       libtorch_match  Every host has libtorch 2.10.0.",
        "  ok       data_match      The shared data path is available on all 2 hosts checked.",
        "  ok       driver_match    Every host runs NVIDIA driver 570.133.20.",
        "  ok       gpu_models      One GPU model across the cluster: H100 (sm_90).",
        "  ok       clock_skew      Host clocks agree with this machine's within 5 s (largest offset 0.1 s, spread "
        "0.0 s).",
    ]
    assert out.splitlines()[-1] == "cluster: ready: 2 hosts, hosts agree on NCCL, libtorch, data, driver and clocks"


def test_skipped_checks_say_why_and_the_verdict_claims_only_what_was_compared() -> None:
    cluster = list(GREEN)
    cluster[0] = CheckResult("nccl_match", "skipped", "Fewer than two hosts report an NCCL version; nothing to "
                                                      "compare.")
    cluster[2] = CheckResult("data_match", "skipped", "The shared data path was not checked on any host.")
    out, _ = render_cluster(ClusterReport(hosts=hosts(), cluster=cluster))
    assert "  skipped  nccl_match      Fewer than two hosts report an NCCL version; nothing to compare." in block(out)
    assert "  skipped  data_match      The shared data path was not checked on any host." in block(out)
    assert out.splitlines()[-1] == "cluster: ready: 2 hosts, hosts agree on libtorch, driver and clocks"


def test_a_failed_cross_host_check_carries_its_hint_and_fails_the_verdict() -> None:
    cluster = list(GREEN)
    cluster[1] = CheckResult("libtorch_match", "error", "libtorch versions differ across hosts (2.10.0 on a; 2.9.0 "
                                                        "on b).", hint="install the same libtorch release")
    out, _ = render_cluster(ClusterReport(hosts=hosts(), cluster=cluster))
    lines = block(out)
    at = lines.index("  ERROR    libtorch_match  libtorch versions differ across hosts (2.10.0 on a; 2.9.0 on b).")
    assert lines[at + 1] == "                           hint: install the same libtorch release"
    assert len(lines) == 7  # every check, and the one hint
    assert out.splitlines()[-1] == "cluster: 2 of 2 hosts ready; cross-host checks failed"
    quiet_out, quiet_err = render_cluster(ClusterReport(hosts=hosts(), cluster=cluster), quiet=True)
    assert quiet_out == "" and "cross-host checks:" not in quiet_err
    assert quiet_err == ("cluster: error: libtorch_match: libtorch versions differ across hosts (2.10.0 on a; "
                         "2.9.0 on b).\n  hint: install the same libtorch release")


def test_a_cluster_of_cpu_hosts_reads_as_one(tmp_path: Path) -> None:
    libtorch = make_libtorch(tmp_path / "cpu", "", cuda="none", archs="cpu")
    reports = [run_probe(ProbeOptions(local_devices="cpu:1", libtorch_path=str(libtorch), skip_mount=True),
                         host=name, environ={"HOME": str(tmp_path)}) for name in ("a", "b")]
    assert summary_line(reports[0]) == "a: ready: CPU host (cpu:1, gloo; GPU and NCCL checks skipped), libtorch " \
                                       "2.10.0 cpu, data skipped"
    report = ClusterReport(hosts=reports, cluster=cross_host_checks(reports) + consistency_checks(reports))
    out, _ = render_cluster(report)
    assert "  skipped  nccl_match      Not compared: every host runs CPU ranks, so the world trains over gloo and " \
           "NCCL is not used." in block(out)
    assert out.splitlines()[-1] == "cluster: ready: 2 hosts, hosts agree on libtorch"
