"""Cross-host checks and the messages for unreachable hosts (pure functions over reports)."""

from __future__ import annotations

import pytest

from fdl.cluster.inventory import InventoryHost, is_this_machine
from fdl.cluster.probe import (
    ClusterProbeOptions,
    ClusterReport,
    cross_host_checks,
    local_host_vars,
    probe_extravars,
    unreachable_check,
)
from fdl.collective.run import CollectiveOptions
from fdl.hostside.checks.report import CheckResult, HostReport


def host(name: str, nccl: str | None = "2.27.5", torch: str | None = "2.10.0", data: str = "ok",
         nccl_status: str = "ok") -> HostReport:
    return HostReport(host=name, checks=[
        CheckResult("gpu", "ok", "1 GPU"),
        CheckResult("libtorch", "ok", "libtorch", data={"version": torch} if torch else {}),
        CheckResult("nccl", nccl_status, "nccl", data={"version": nccl} if nccl else {}),
        CheckResult("data", data, "data", data={"path": f"/data/{name}"}),
    ])


def checks(reports):
    return {c.name: c for c in cross_host_checks(reports)}


def test_all_agree():
    got = checks([host("a"), host("b"), host("c")])
    assert {n: c.status for n, c in got.items()} == {"nccl_match": "ok", "libtorch_match": "ok", "data_match": "ok"}
    assert got["nccl_match"].message == "Every host has NCCL 2.27.x (2.27.5 on a, b, c)."


def test_nccl_patch_releases_may_differ_but_minor_may_not():
    assert checks([host("a", "2.27.5"), host("b", "2.27.3")])["nccl_match"].status == "ok"
    skew = checks([host("a", "2.27.5"), host("b", "2.21.5"), host("c", "2.27.3")])["nccl_match"]
    assert skew.status == "error"
    assert skew.data["behind"] == ["b"] and skew.data["target"] == "2.27.5"
    assert "`fdl nccl build --tag v2.27.5`" in skew.hint and "LD_PRELOAD" in skew.hint


def test_hosts_without_nccl_are_not_compared():
    got = checks([host("a", None, nccl_status="skipped"), host("b")])["nccl_match"]
    assert got.status == "skipped"


def test_libtorch_local_version_suffix_is_ignored():
    assert checks([host("a", torch="2.10.0+cu128"), host("b", torch="2.10.0")])["libtorch_match"].status == "ok"
    skew = checks([host("a", torch="2.10.0"), host("b", torch="2.9.1")])["libtorch_match"]
    assert skew.status == "error" and "2.10.0 on a; 2.9.1 on b" in skew.message


def test_data_present_on_some_hosts_only():
    got = checks([host("a"), host("b", data="error"), host("c", data="warning")])["data_match"]
    assert got.status == "error"
    assert "available on a, c but not on b (/data/b)" in got.message
    assert checks([host("a", data="error"), host("b", data="error")])["data_match"].status == "skipped"
    assert checks([host("a", data="skipped"), host("b", data="skipped")])["data_match"].status == "skipped"


def test_cluster_report_ok_needs_every_host_and_every_cross_check():
    report = ClusterReport(hosts=[host("a"), host("b")], cluster=cross_host_checks([host("a"), host("b")]))
    assert report.ok
    report.cluster.append(CheckResult("nccl_match", "error", "skew"))
    assert not report.ok
    doc = report.to_dict()
    assert doc["ok"] is False and [h["host"] for h in doc["hosts"]] == ["a", "b"]
    assert doc["cluster"][-1]["name"] == "nccl_match"


def inv_host(**vars_):
    base = {"ansible_host": "10.0.0.12", "ansible_user": "op", "ansible_port": 22,
            "ansible_ssh_private_key_file": "/keys/id"}
    base.update(vars_)
    return InventoryHost(name="node-b", vars=base)


@pytest.mark.parametrize("message, what, hint_part", [
    ("Failed to connect to the host via ssh: op@10.0.0.12: Permission denied (publickey).",
     "SSH authentication failed: op@10.0.0.12: Permission denied (publickey)", "/keys/id"),
    ("Failed to connect to the host via ssh: ssh: connect to host 10.0.0.12 port 22: Connection timed out",
     "the host does not answer", "address and port"),
    ("Failed to connect to the host via ssh: ssh: connect to host 10.0.0.12 port 22: Connection refused",
     "nothing accepts SSH connections there", "start sshd"),
    ("Failed to connect to the host via ssh: Host key verification failed.",
     "SSH refused the host key", "ssh-keygen -R 10.0.0.12"),
    ('Task failed: Data could not be sent to remote host "10.0.0.12". Make sure this host can be reached over ssh: ',
     "the SSH connection was lost: the host stopped answering while the task ran", "network link"),
])
def test_unreachable_names_host_login_and_ssh_reason(message, what, hint_part):
    check = unreachable_check(inv_host(), message)
    assert check.name == "ssh" and check.status == "error"
    assert check.message.startswith(f"node-b (op@10.0.0.12) is unreachable: {what}")
    assert hint_part in check.hint


def test_login_shows_a_non_default_port():
    check = unreachable_check(inv_host(ansible_port=2222), "Connection timed out")
    assert "(op@10.0.0.12:2222)" in check.message


def test_this_machine():
    assert is_this_machine("127.0.0.1")
    assert is_this_machine("localhost")
    assert not is_this_machine("127.0.0.1", 2222)  # a tunnel to somewhere else
    assert not is_this_machine("192.0.2.1")  # TEST-NET: never assigned here
    assert not is_this_machine("node-that-needs-dns.example")


def test_flags_reach_every_host_and_gpus_and_the_project_only_this_machine():
    """What fdl tells the fdl_probe role: the flags given, for every host (a flag not given leaves each host its
    own setting: its data_path, the role's defaults); --gpus and the project, for this machine's worker only."""
    assert probe_extravars(ClusterProbeOptions()) == {"fdl_probe_skip_mount": False, "fdl_probe_verdict": False}
    flags = ClusterProbeOptions(data_path="/flag", skip_mount=True, libtorch_path="/lt", docker="cuda",
                                local_gpus=[1, 0])
    assert probe_extravars(flags) == {
        "fdl_probe_skip_mount": True, "fdl_probe_verdict": False, "fdl_probe_data_path": "/flag",
        "fdl_probe_libtorch_path": "/lt", "fdl_probe_docker": "cuda"}
    assert local_host_vars(flags, "/srv/proj") == {"fdl_probe_gpus": "1,0", "fdl_probe_project_root": "/srv/proj"}
    assert local_host_vars(ClusterProbeOptions(), None) == {}
    smoke = probe_extravars(ClusterProbeOptions(), CollectiveOptions(time_limit_s=40, max_bytes=1 << 20), 29401)
    assert smoke["fdl_probe_collective"] is True and smoke["fdl_probe_collective_port"] == 29401
    assert (smoke["fdl_probe_collective_timeout_s"], smoke["fdl_probe_collective_max_bytes"]) == (40, 1 << 20)
    assert not any("validate" in name for name in smoke)  # the role checks its inputs on fdl's runs too


# ---- CPU hosts: real reports of the check library for hosts declared cpu:N ----

def cpu_host(name: str, root) -> HostReport:
    from fdl.hostside.checks.probe import ProbeOptions, run_probe
    from tests.fakes import make_libtorch

    libtorch = make_libtorch(root / name, "", cuda="none", archs="cpu")
    return run_probe(ProbeOptions(local_devices="cpu:2", libtorch_path=str(libtorch), skip_mount=True), host=name,
                     environ={"HOME": str(root)})


def test_a_cpu_host_makes_the_world_gloo_so_nccl_versions_are_not_compared(tmp_path):
    reports = [host("a", "2.27.5"), host("b", "2.21.5"), cpu_host("c", tmp_path)]
    assert reports[2].cpu_host and not reports[0].cpu_host
    got = checks(reports)
    nccl = got["nccl_match"]
    assert nccl.status == "skipped" and nccl.data["cpu_hosts"] == ["c"]
    assert nccl.message == "Not compared: c runs CPU ranks, so the world trains over gloo and NCCL is not used."
    assert got["libtorch_match"].status == "ok"  # a CPU host's libtorch still counts


def test_an_all_cpu_cluster_is_ready_and_says_what_it_could_not_compare(tmp_path):
    from fdl.cluster.consistency import consistency_checks

    reports = [cpu_host("a", tmp_path), cpu_host("b", tmp_path)]
    assert all(r.ok for r in reports)
    got = {c.name: c for c in cross_host_checks(reports) + consistency_checks(reports)}
    assert got["nccl_match"].message.startswith("Not compared: every host runs CPU ranks")
    assert got["libtorch_match"].status == "ok" and got["libtorch_match"].message == "Every host has libtorch 2.10.0."
    driver = got["driver_match"]
    assert driver.status == "skipped" and "(CPU hosts, which have none: a, b)" in driver.message
    assert got["gpu_models"].message == "No host reports a GPU (CPU hosts, which have none: a, b)."
    assert ClusterReport(hosts=reports, cluster=list(got.values())).ok
