"""`fdl probe --textfile`: the report as Prometheus metrics, judged by the real `promtool check metrics`, for
healthy and faulty hosts scripted through the fake NVML, and compared value by value with `fdl probe --json`."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.cli.test_probe import clean_env  # noqa: F401 - the same autouse fixture: nothing leaks in
from tests.conftest import run_fdl
from tests.fakes import make_libtorch
from tests.prometheus import promtool_accepts, samples

HEALTHY = "H100:9.0:80G,H100:9.0:80G"
# GPU 0: uncorrectable ECC errors, a x8 link of x16 at gen4 of gen5 while busy, retired and remapped memory
# waiting for a reset, throttled by HW slowdown and the power brake, persistence off. GPU 1: a GeForce (no
# ECC, no MIG) idling on a slower link generation, which is not a finding.
FAULTY = ("H100:9.0:80G:ecc_vol=2:ecc_agg=5:pcie=4.8/5.16:pstate=0:retired_dbe=3:remap=1/0/1/0:throttle=0x88"
          ":persist=0,RTX3060:8.6:12G:na=ecc+mig:pcie=3.16/4.16:pstate=8")
ALL_STATUSES = ("ok", "warning", "error", "skipped")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project whose libtorch (cu128, bundled NCCL 2.27.5) covers both H100 and RTX 3060."""
    root = tmp_path / "proj"
    root.mkdir()
    make_libtorch(root / "libtorch", "precompiled/cu128", archs="8.0 9.0", nccl="2.27.5")
    return root


def probe(project: Path, env: dict, textfile: Path, *more: str):
    """`fdl probe --json --skip-mount --textfile FILE`: (result, JSON report, metrics text, samples)."""
    result = run_fdl("probe", "--json", "--skip-mount", "--textfile", str(textfile), *more, cwd=project, env=env)
    doc = json.loads(result.stdout)
    text = textfile.read_text()
    return result, doc, text, samples(text)


def checks(doc: dict) -> dict:
    return {c["name"]: c for c in doc["checks"]}


def assert_verdict_and_statuses_match(doc: dict, values: dict) -> None:
    assert values[("fdl_probe_ready", ())] == (1.0 if doc["ok"] else 0.0)
    assert values[("fdl_probe_last_run_timestamp_seconds", ())] == doc["time"]
    assert values[("fdl_probe_duration_seconds", ())] >= 0
    statuses = {(dict(labels)["check"], dict(labels)["status"]): v for (name, labels), v in values.items()
                if name == "fdl_probe_check_status"}
    assert statuses == {(c["name"], s): float(c["status"] == s) for c in doc["checks"] for s in ALL_STATUSES}


def per_gpu(values: dict, name: str, **labels: str) -> dict[int, float]:
    return {int(dict(lab)["gpu"]): v for (n, lab), v in values.items()
            if n == name and all(dict(lab).get(k) == w for k, w in labels.items())}


def test_healthy_host_metrics_pass_promtool_and_match_the_json_report(project: Path, fake_nvml, tmp_path) -> None:
    target = tmp_path / "textfile" / "fdl-probe.prom"
    target.parent.mkdir()
    result, doc, text, values = probe(project, fake_nvml.env(HEALTHY), target)
    assert result.returncode == 0 and doc["ok"], result.stderr
    promtool_accepts(text)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # node_exporter reads it as another account
    assert sorted(p.name for p in target.parent.iterdir()) == ["fdl-probe.prom"]  # no temporary file left
    assert_verdict_and_statuses_match(doc, values)
    found = checks(doc)
    gpu = found["gpu"]["data"]
    assert values[("fdl_gpu_driver_info", (("cuda_version", "12.8"), ("driver_version", "570.133.20")))] == 1
    assert gpu["driver_version"] == "570.133.20" and gpu["cuda_driver_version"] == "12.8"
    for device in gpu["devices"]:
        info = (("compute_capability", device["compute_capability"]), ("gpu", str(device["index"])),
                ("name", device["name"]), ("uuid", device["uuid"]))
        assert values[("fdl_gpu_info", info)] == 1
    assert per_gpu(values, "fdl_gpu_memory_total_bytes") == {d["index"]: d["memory_total"] for d in gpu["devices"]}
    assert values[("fdl_gpus", ())] == found["gpu_count"]["data"]["count"] == 2
    torch = found["libtorch"]["data"]
    assert values[("fdl_libtorch_info", (("cuda", "12.8"), ("kind", "cuda"), ("variant", "cu128"),
                                         ("version", "2.10.0")))] == 1
    assert (torch["version"], torch["variant"]) == ("2.10.0", "cu128")
    assert values[("fdl_nccl_info", (("origin", found["nccl"]["data"]["origin"]), ("version", "2.27.5")))] == 1
    assert per_gpu(values, "fdl_gpu_ecc_uncorrected_errors_total") == {0: 0, 1: 0}


def test_faulty_host_metrics_carry_each_fault_and_the_exit_code_is_unchanged(project: Path, fake_nvml,
                                                                             tmp_path) -> None:
    env = fake_nvml.env(FAULTY)
    target = tmp_path / "fdl-probe.prom"
    result, doc, text, values = probe(project, env, target)
    assert result.returncode == 1 and not doc["ok"]
    assert run_fdl("probe", "--json", "--skip-mount", cwd=project, env=env).returncode == 1  # the same verdict
    promtool_accepts(text)
    assert_verdict_and_statuses_match(doc, values)
    found = checks(doc)
    assert {n for n, c in found.items() if c["status"] == "error"} == {"gpu_ecc", "gpu_retired_memory"}
    assert {n for n, c in found.items() if c["status"] == "warning"} >= {"gpu_pcie", "gpu_throttle", "gpu_persistence"}

    ecc = {d["index"]: d for d in found["gpu_ecc"]["data"]["devices"]}
    assert per_gpu(values, "fdl_gpu_ecc_uncorrected_errors_total", scope="volatile") == \
        {0: ecc[0]["uncorrected_volatile"]} == {0: 2}
    assert per_gpu(values, "fdl_gpu_ecc_uncorrected_errors_total", scope="aggregate") == \
        {0: ecc[0]["uncorrected_aggregate"]} == {0: 5}
    assert per_gpu(values, "fdl_gpu_ecc_mode") == {0: 1}  # the GeForce has no ECC: no series, not a 0
    assert ecc[1]["supported"] is False
    pcie = {d["index"]: d for d in found["gpu_pcie"]["data"]["devices"]}
    for name, key in (("fdl_gpu_pcie_link_width", "width"), ("fdl_gpu_pcie_link_width_max", "width_max"),
                      ("fdl_gpu_pcie_link_generation", "gen"), ("fdl_gpu_pcie_link_generation_max", "gen_max"),
                      ("fdl_gpu_performance_state", "pstate")):
        assert per_gpu(values, name) == {i: d[key] for i, d in pcie.items()}, name
    assert per_gpu(values, "fdl_gpu_pcie_link_width") == {0: 8, 1: 16}
    assert per_gpu(values, "fdl_gpu_pcie_link_width_max") == {0: 16, 1: 16}
    retired = found["gpu_retired_memory"]["data"]["devices"][0]
    assert per_gpu(values, "fdl_gpu_retired_pages", cause="double_bit_ecc")[0] == retired["retired_dbe"] == 3
    assert per_gpu(values, "fdl_gpu_remapped_rows", cause="correctable")[0] == retired["remapped_corrected"] == 1
    assert per_gpu(values, "fdl_gpu_row_remap_pending") == {0: 1, 1: 0}
    assert per_gpu(values, "fdl_gpu_persistence_mode") == {0: 0, 1: 1}
    active = {(gpu, dict(lab)["reason"]) for (n, lab), v in values.items()
              if n == "fdl_gpu_clock_event_reason" and v == 1 for gpu in [int(dict(lab)["gpu"])]}
    assert active == {(0, r) for r in found["gpu_throttle"]["data"]["devices"][0]["reasons"]} \
        == {(0, "hw_slowdown"), (0, "hw_power_brake_slowdown")}
    assert per_gpu(values, "fdl_gpu_mig_mode") == {0: 0}


def test_a_host_without_a_working_nvml_still_reports_its_verdict(project: Path, fake_nvml, tmp_path) -> None:
    target = tmp_path / "fdl-probe.prom"
    result, doc, text, values = probe(project, fake_nvml.env("init-fail"), target)
    assert result.returncode == 1
    promtool_accepts(text)
    assert_verdict_and_statuses_match(doc, values)
    assert values[("fdl_probe_check_status", (("check", "gpu"), ("status", "error")))] == 1
    assert not [name for name, _ in values if name.startswith("fdl_gpu")]  # nothing read, nothing made up


def test_label_values_are_escaped(project: Path, fake_nvml, tmp_path) -> None:
    """A GPU model string with a quote, a backslash and a newline stays one label value, byte for byte."""
    target = tmp_path / "fdl-probe.prom"
    odd = 'Odd "GPU" \\ model\nline two'
    _, doc, text, values = probe(project, fake_nvml.env(f"{odd}:9.0:80G"), target)
    assert checks(doc)["gpu"]["data"]["devices"][0]["name"] == odd
    promtool_accepts(text)
    assert 'name="Odd \\"GPU\\" \\\\ model\\nline two"' in text
    (info,) = [dict(lab) for name, lab in values if name == "fdl_gpu_info"]
    assert info["name"] == odd


def test_human_report_and_file_together_and_the_file_is_replaced_whole(project: Path, fake_nvml,
                                                                          tmp_path) -> None:
    target = tmp_path / "fdl-probe.prom"
    first = run_fdl("probe", "--skip-mount", "--textfile", str(target), cwd=project, env=fake_nvml.env(HEALTHY))
    assert first.returncode == 0 and ": ready: 2 GPUs (sm_90)" in first.stdout, first.stderr
    before = target.stat().st_ino, samples(target.read_text())
    second = run_fdl("probe", "--quiet", "--skip-mount", "--textfile", str(target), cwd=project,
                     env=fake_nvml.env(FAULTY))
    assert second.returncode == 1 and second.stdout == ""
    after = target.stat().st_ino, samples(target.read_text())
    assert after[0] != before[0]  # a new file renamed over the old one, never rewritten in place
    assert before[1][("fdl_probe_ready", ())] == 1 and after[1][("fdl_probe_ready", ())] == 0
    assert after[1][("fdl_probe_last_run_timestamp_seconds", ())] > before[1][("fdl_probe_last_run_timestamp_seconds",
                                                                                ())]


def test_an_unwritable_textfile_keeps_the_report_and_exits_1(project: Path, fake_nvml, tmp_path) -> None:
    target = tmp_path / "no-such-dir" / "fdl-probe.prom"
    result = run_fdl("probe", "--json", "--skip-mount", "--textfile", str(target), cwd=project,
                     env=fake_nvml.env(HEALTHY))
    assert result.returncode == 1
    assert json.loads(result.stdout)["ok"] is True  # the one JSON document, whole
    assert f"fdl: error: could not write the metrics file {target}: No such file or directory." in result.stderr
    assert f"hint: create {target.parent}" in result.stderr and "Traceback" not in result.stderr
    assert not target.parent.exists()


def test_a_second_fdl_metrics_file_in_the_directory_is_named_when_writing(project: Path, fake_nvml,
                                                                             tmp_path) -> None:
    """Regression (issue 38 item 15): two fdl *.prom files in one textfile directory (a timer and a cron job,
    a renamed --textfile) export every series twice, which only node_exporter's log shows; the probe says so
    when it writes, naming the other file. Another exporter's file, and rewriting the same file, are quiet."""
    directory = tmp_path / "textfile"
    directory.mkdir()
    (directory / "node_custom.prom").write_text("# HELP site_up Up.\n# TYPE site_up gauge\nsite_up 1\n")
    (directory / "broken-link.prom").symlink_to(directory / "nowhere")
    first = run_fdl("probe", "--skip-mount", "--textfile", str(directory / "fdl-probe.prom"), cwd=project,
                    env=fake_nvml.env(HEALTHY))
    assert first.returncode == 0 and "warning" not in first.stderr, first.stderr
    again = run_fdl("probe", "--skip-mount", "--textfile", str(directory / "fdl-probe.prom"), cwd=project,
                    env=fake_nvml.env(HEALTHY))
    assert again.returncode == 0 and "warning" not in again.stderr, again.stderr

    second = run_fdl("probe", "--json", "--skip-mount", "--textfile", str(directory / "fdl-gpu.prom"), cwd=project,
                     env=fake_nvml.env(HEALTHY))
    assert second.returncode == 0, second.stderr  # a warning: the probe's verdict is unchanged
    assert json.loads(second.stdout)["ok"] is True
    warnings = [line for line in second.stderr.splitlines() if line.startswith("fdl: warning:")]
    assert warnings == [f"fdl: warning: {directory / 'fdl-probe.prom'} in the same textfile directory holds fdl's "
                        f"probe metrics too: node_exporter reads every *.prom file there, so it sees each fdl series "
                        f"twice and reports that only in its own log. Keep one fdl metrics file per directory: "
                        f"remove {directory / 'fdl-probe.prom'}, or write to it with --textfile."]
    assert (directory / "fdl-gpu.prom").is_file()  # written all the same


def test_textfile_refusals(project: Path, fake_nvml, tmp_path) -> None:
    env = fake_nvml.env(HEALTHY)
    result = run_fdl("probe", "--textfile", str(tmp_path / "fdl-probe.txt"), cwd=project, env=env)
    assert result.returncode == 2 and "is not a *.prom file" in result.stderr and result.stdout == ""
    (project / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
    (project / "fdl.cluster.yml").write_text("cluster:\n  workers:\n    - {host: node-b, address: 10.0.0.12}\n")
    result = run_fdl("@cluster", "probe", "--textfile", str(tmp_path / "fdl-probe.prom"), cwd=project, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--textfile writes this host's metrics" in result.stderr and "fdl_join_worker" in result.stderr
    assert not os.path.exists(tmp_path / "fdl-probe.prom")
