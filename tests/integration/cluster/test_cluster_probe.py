"""`fdl @cluster probe` against real sshd hosts: aggregation, unreachable hosts, cross-host checks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import fdl_env, run_fdl

pytestmark = [pytest.mark.testbed(hosts=4), pytest.mark.slow]


def probe(project: Path, env: dict, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    done = run_fdl("@cluster", "probe", *args, cwd=project, env=env, timeout=180)
    doc = json.loads(done.stdout) if "--json" in args and done.stdout.strip() else None
    return done, doc


def by_host(doc: dict) -> dict:
    return {h["host"]: {c["name"]: c for c in h["checks"]} for h in doc["hosts"]}


def cluster_checks(doc: dict) -> dict:
    return {c["name"]: c for c in doc["cluster"]}


def test_four_green_hosts(kit, short_tmp, testbed_home):
    project = kit.project(short_tmp / "proj")
    done, doc = probe(project, testbed_home, "--json")
    assert done.returncode == 0, done.stderr + done.stdout
    assert doc["ok"] is True
    assert [h["host"] for h in doc["hosts"]] == ["h1", "h2", "h3", "h4"]
    for host, checks in by_host(doc).items():
        assert checks["gpu"]["status"] == "ok", (host, checks["gpu"])
        assert checks["gpu"]["data"]["devices"][0]["name"] == "H100"  # the worker's env: reached the probe
        assert checks["nccl"]["data"]["version"] == "2.27.5"
        assert checks["data"]["data"]["path"] == str(kit.data)  # each worker's data_path
    assert {n: c["status"] for n, c in cluster_checks(doc).items()} == {
        "nccl_match": "ok", "libtorch_match": "ok", "data_match": "ok", "driver_match": "ok", "gpu_models": "ok",
        "clock_skew": "ok"}

    human = run_fdl("@cluster", "probe", cwd=project, env=testbed_home, timeout=180)
    assert human.returncode == 0
    assert "h3: ready:" in human.stdout
    assert human.stdout.strip().endswith(
        "cluster: ready: 4 hosts, hosts agree on NCCL, libtorch, data, driver and clocks")


def test_a_cluster_of_cpu_workers_is_ready_and_a_gpu_worker_without_gpus_is_not(kit, short_tmp, testbed_home):
    """Workers declaring cpu:N, with no NVIDIA library reachable (their env: names no fake NVML): judged as CPU
    hosts by the probe module on each host. A worker declaring a GPU it does not have still fails."""
    from tests.fakes import make_libtorch

    cpu_libtorch = make_libtorch(kit.bed.shared / "lt-cpu", "", cuda="none", archs="cpu")
    subprocess.run(["chmod", "-R", "a+rX", str(cpu_libtorch)], check=True)
    workers = [host.worker(env={"LIBTORCH": str(cpu_libtorch)}, data_path=str(kit.data), local_devices="cpu:1")
               for host in kit.bed.hosts]
    project = kit.project(short_tmp / "cpu", workers)
    done, doc = probe(project, testbed_home, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert doc["ok"] is True
    for host, checks in by_host(doc).items():
        for name in ("gpu", "nccl", "gpu_count", "gpu_mig", "device_nodes", "cuda_driver"):
            assert checks[name]["status"] == "skipped", (host, name, checks[name])
            assert checks[name]["data"]["cpu_host"] is True
        assert checks["libtorch"]["status"] == "ok" and checks["libtorch"]["data"]["kind"] == "cpu"
        assert checks["libtorch"]["data"]["python"] == "/usr/bin/python3"  # the worker's python: ran the module
    assert {n: c["status"] for n, c in cluster_checks(doc).items()} == {
        "nccl_match": "skipped", "libtorch_match": "ok", "data_match": "ok", "driver_match": "skipped",
        "gpu_models": "skipped", "clock_skew": "ok"}
    human = run_fdl("@cluster", "probe", cwd=project, env=testbed_home, timeout=180)
    assert human.returncode == 0, human.stdout + human.stderr
    assert "h2: ready: CPU host (cpu:1, gloo; GPU and NCCL checks skipped), libtorch 2.10.0 cpu, data " in human.stdout
    assert "  skipped  nccl_match      Not compared: every host runs CPU ranks, so the world trains over gloo and " \
           "NCCL is not used." in human.stdout
    assert human.stdout.strip().endswith("cluster: ready: 4 hosts, hosts agree on libtorch, data and clocks")

    workers[1].update(local_devices=[0], env=kit.worker_env("none", libtorch=cpu_libtorch))  # a GPU it lacks
    done, doc = probe(kit.project(short_tmp / "gpu", workers), testbed_home, "--json")
    assert done.returncode == 1
    h2 = by_host(doc)["h2"]
    assert h2["gpu"]["status"] == "error" and "reports no GPU on this host" in h2["gpu"]["message"]
    assert h2["gpu_count"]["status"] == "error" and "fdl probe --cpu" in h2["gpu"]["hint"]
    assert all(by_host(doc)[h]["gpu"]["status"] == "skipped" for h in ("h1", "h3", "h4"))
    assert cluster_checks(doc)["nccl_match"]["status"] == "skipped"  # h1, h3 and h4 still make the world gloo


def test_a_host_with_the_wrong_key_is_an_error_naming_it(kit, short_tmp, testbed_home):
    stranger = kit.bed.new_key("wrong-key")
    project = kit.project(short_tmp / "proj", kit.workers(h2={"identity": str(stranger)}))
    done, doc = probe(project, testbed_home, "--json")
    assert done.returncode == 1
    hosts = by_host(doc)
    assert list(hosts["h2"]) == ["ssh"]
    ssh = hosts["h2"]["ssh"]
    assert ssh["status"] == "error"
    h2 = kit.bed.host("h2")
    assert ssh["message"].startswith(f"h2 ({h2.user}@{h2.address}) is unreachable: SSH authentication failed: ")
    assert "Permission denied (publickey" in ssh["message"]
    assert str(stranger) in ssh["hint"]
    assert all(hosts[h]["gpu"]["status"] == "ok" for h in ("h1", "h3", "h4"))

    human = run_fdl("@cluster", "probe", cwd=project, env=testbed_home, timeout=180)
    assert human.returncode == 1
    # SSH's own reason was checked in the JSON report above; the human report names the host and that it is
    # unreachable (a second SSH attempt under a loaded machine may end with another last line from ssh)
    assert "h2: NOT READY" in human.stdout and f"h2 ({h2.user}@{h2.address}) is unreachable" in human.stdout, \
        human.stdout
    assert "cluster: 3 of 4 hosts ready" in human.stdout


def test_a_link_taken_down_mid_run(kit, short_tmp, testbed_home):
    """h3's interpreter is a wrapper that announces itself and waits: the link goes down while it runs."""
    marker = kit.bed.storage / "h3-started"  # world-writable: h3's user creates it
    wrapper = kit.bed.shared / "slow-python"
    wrapper.write_text(f"#!/bin/sh\ntouch {marker}\nsleep 4\nexec /usr/bin/python3 \"$@\"\n")
    wrapper.chmod(0o755)
    marker.unlink(missing_ok=True)
    project = kit.project(short_tmp / "proj", kit.workers(h3={"python": str(wrapper)}))
    h3 = kit.bed.host("h3")
    proc = subprocess.Popen([sys.executable, "-m", "fdl", "@cluster", "probe", "--json"], cwd=project,
                            env=fdl_env(testbed_home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "h3's probe never started"
            time.sleep(0.05)
        h3.link_down()
        out, err = proc.communicate(timeout=120)
    finally:
        h3.link_up()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    hosts = by_host(json.loads(out))
    assert list(hosts["h3"]) == ["ssh"]
    assert hosts["h3"]["ssh"]["message"] == (f"h3 ({h3.user}@{h3.address}) is unreachable: the SSH connection was "
                                             f"lost: the host stopped answering while the task ran")
    assert "network link" in hosts["h3"]["ssh"]["hint"]
    assert all(hosts[h]["gpu"]["status"] == "ok" for h in ("h1", "h2", "h4"))


def test_an_ssh_worker_without_pytorch_is_told_about_its_python_key(kit, short_tmp, testbed_home):
    """Regression (issue 38 item 11): a worker probed over SSH whose interpreter has no PyTorch, and no libtorch
    anywhere else, got a hint naming downloads and LIBTORCH only; what decides which PyTorch it sees is its
    `python:` key, and the hint names it."""
    no_libtorch = kit.nvml.env("H100:9.0:80G")  # its fake GPU, but no LIBTORCH
    project = kit.project(short_tmp / "proj", kit.workers(h2={"env": no_libtorch}))
    done, doc = probe(project, testbed_home, "--json")
    assert done.returncode == 1, done.stderr
    libtorch = by_host(doc)["h2"]["libtorch"]
    assert libtorch["status"] == "error" and "(The Python this probe ran under: /usr/bin/python3.)" in \
        libtorch["message"]
    assert "fdl libtorch download" in libtorch["hint"]
    assert "set this worker's python: (in fdl.cluster.yml" in libtorch["hint"]
    assert "e.g. python: /path/to/venv/bin/python" in libtorch["hint"]
    assert by_host(doc)["h1"]["libtorch"]["status"] == "ok"


def test_nccl_build_under_the_cluster_env_builds_the_newest_nccl_for_the_host_with_the_older(kit, short_tmp,
                                                                                           testbed_home):
    """Regression (issue 38 item 2): `fdl @cluster nccl build` took the project's libtorch NCCL and said "the
    cluster hosts' NCCL versions are not collected by this fdl yet". It now reads them from the cluster probe
    (the same reports `fdl @cluster probe` prints) and, as seed 000's rig flow says, builds on the host with the
    older NCCL (h3: 2.21.5, a Pascal GPU) the newest NCCL the cluster runs (2.27.5), for that host's GPUs; the
    other host behind (h2: 2.26.2) is named. The project itself has no libtorch at all."""
    from tests.fakes import make_libtorch

    nccl_2_26 = make_libtorch(kit.bed.shared / "lt-2.10-nccl2.26", nccl="2.26.2")
    subprocess.run(["chmod", "-R", "a+rX", str(nccl_2_26)], check=True)
    workers = kit.workers(h2={"env": kit.worker_env(libtorch=nccl_2_26)},
                          h3={"env": kit.worker_env("GTX1080:6.1:8G", libtorch=kit.libtorch_old_nccl)})
    project = kit.project(short_tmp / "proj", workers)
    done = run_fdl("@cluster", "nccl", "build", "--dry-run", "--json", cwd=project, env=testbed_home, timeout=240)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert (plan["host"], plan["remote"], plan["tag"], plan["archs"]) == ("h3", True, "v2.27.5", ["6.1"])
    assert plan["library"] == "~/.flodl/libtorch/nccl/builds/v2.27.5-sm61/lib/libnccl.so.2"
    assert plan["tag_source"] == ("the newest NCCL the cluster runs (2.27.5 on h1, h4), for h3, whose NCCL 2.21.5 "
                                  "is older")
    assert plan["archs_source"] == "detected on h3 by the cluster probe (NVML there) (GPU0 6.1)"
    assert plan["notes"][0] == ("cluster NCCL versions: h1 2.27.5, h2 2.26.2, h3 2.21.5, h4 2.27.5; h3 has the "
                                "older NCCL (2.21.5), so this builds NCCL 2.27.5 for h3")
    assert plan["notes"][1].startswith("also behind: h2 (2.26.2)")
    assert "not collected" not in done.stderr

    named = run_fdl("@cluster", "nccl", "build", "--dry-run", "--json", "--host", "h2", cwd=project,
                    env=testbed_home, timeout=240)
    assert named.returncode == 0, named.stderr
    assert {k: json.loads(named.stdout)[k] for k in ("host", "tag", "archs")} == {
        "host": "h2", "tag": "v2.27.5", "archs": ["9.0"]}

    agreeing = kit.project(short_tmp / "agree")  # every host on NCCL 2.27.5: nobody to build for but here
    human = run_fdl("@cluster", "nccl", "build", "--dry-run", "--archs", "9.0", cwd=agreeing, env=testbed_home,
                    timeout=240)
    assert human.returncode == 0, human.stderr
    assert "every cluster host runs NCCL 2.27.x" in human.stderr and "builds for this machine" in human.stderr
    assert "(this machine)" in human.stdout and "v2.27.5" in human.stdout


def test_nccl_skew_is_an_error_until_the_older_host_preloads_a_match(kit, short_tmp, testbed_home):
    skewed = kit.workers(h3={"env": kit.worker_env(libtorch=kit.libtorch_old_nccl)})
    done, doc = probe(kit.project(short_tmp / "skew", skewed), testbed_home, "--json")
    assert done.returncode == 1
    assert all(h["ok"] for h in doc["hosts"])  # every host is fine on its own
    nccl = cluster_checks(doc)["nccl_match"]
    assert nccl["status"] == "error"
    assert "2.27.5 on h1, h2, h4; 2.21.5 on h3" in nccl["message"]
    assert nccl["hint"].startswith("on h3, build NCCL 2.27.5 with `fdl nccl build --tag v2.27.5`")
    assert "LD_PRELOAD" in nccl["hint"]

    fixed = kit.workers(h3={"env": kit.worker_env(libtorch=kit.libtorch_old_nccl, LD_PRELOAD=str(kit.nccl_2_27))})
    done, doc = probe(kit.project(short_tmp / "fixed", fixed), testbed_home, "--json")
    assert done.returncode == 0, done.stdout
    assert by_host(doc)["h3"]["nccl"]["data"]["origin"] == "LD_PRELOAD"


def test_libtorch_skew_is_an_error(kit, short_tmp, testbed_home):
    skewed = kit.workers(h4={"env": kit.worker_env(libtorch=kit.libtorch_old)})
    done, doc = probe(kit.project(short_tmp / "proj", skewed), testbed_home, "--json")
    assert done.returncode == 1
    check = cluster_checks(doc)["libtorch_match"]
    assert check["status"] == "error"
    assert "2.10.0 on h1, h2, h3; 2.9.0 on h4" in check["message"]
    assert cluster_checks(doc)["nccl_match"]["status"] == "ok"


def test_data_path_missing_on_one_host(kit, short_tmp, testbed_home):
    missing = kit.bed.shared / "no-such-data"
    project = kit.project(short_tmp / "proj", kit.workers(h2={"data_path": str(missing)}))
    done, doc = probe(project, testbed_home, "--json")
    assert done.returncode == 1
    assert by_host(doc)["h2"]["data"]["status"] == "error"
    check = cluster_checks(doc)["data_match"]
    assert check["status"] == "error"
    assert f"available on h1, h3, h4 but not on h2 ({missing})" in check["message"]

    skipped, doc = probe(project, testbed_home, "--json", "--skip-mount")  # flags reach every host
    assert skipped.returncode == 0, skipped.stdout
    assert {by_host(doc)[h]["data"]["status"] for h in ("h1", "h2", "h3", "h4")} == {"skipped"}

    elsewhere, doc = probe(project, testbed_home, "--json", "--data-path", str(kit.data))
    assert elsewhere.returncode == 0
    assert {by_host(doc)[h]["data"]["data"]["path"] for h in ("h1", "h2")} == {str(kit.data)}


def test_this_machine_in_the_roster_is_probed_without_ssh(kit, short_tmp, testbed_home):
    """A worker at the test machine's own bridge address: no sshd, no such user; only the role's local
    connection gets it green, in the same run as the hosts over ssh."""
    workers = kit.workers()[:2] + [{"host": "ctl", "address": kit.bed.gateway, "user": "fdlt-nobody",
                                    "env": kit.worker_env(devices="RTX3060:8.6:12G"), "data_path": str(kit.data)}]
    done, doc = probe(kit.project(short_tmp / "proj", workers), testbed_home, "--json")
    assert done.returncode == 0, done.stdout
    ctl = by_host(doc)["ctl"]
    assert ctl["gpu"]["data"]["devices"][0]["name"] == "RTX3060"  # the worker's env: applied to its local task


def test_ansible_users_get_the_same_inventory_and_probe_without_fdl(kit, short_tmp, testbed_home,
                                                                    installed_collection):
    """ansible-inventory and ansible-playbook from the project directory: the collection installed from its
    tarball, a hosts.fdl.yml source, the shipped ansible.cfg for its SSH settings."""
    from tests.conftest import REPO

    stranger = kit.bed.new_key("ansible-user-wrong")
    project = kit.project(short_tmp / "proj", kit.workers(h4={"identity": str(stranger)}))
    (project / "hosts.fdl.yml").write_text("plugin: flodl.fdl.cluster\n")
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update({**testbed_home, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PYTHONPATH": str(REPO),
                "ANSIBLE_COLLECTIONS_PATH": str(installed_collection)})
    graph = subprocess.run([str(bin_dir / "ansible-inventory"), "-i", "hosts.fdl.yml", "--graph"], cwd=project,
                           env=env, capture_output=True, text=True, timeout=120)
    assert graph.returncode == 0, graph.stderr
    assert "@fdl_workers:" in graph.stdout and "|--h4" in graph.stdout
    assert "@arch_" not in graph.stdout  # these workers name no arch

    play = subprocess.run([str(bin_dir / "ansible-playbook"), "-i", "hosts.fdl.yml", "flodl.fdl.probe"], cwd=project,
                          env=env, capture_output=True, text=True, timeout=180)
    assert play.returncode == 4, play.stdout + play.stderr  # 4: some host unreachable
    recap = play.stdout[play.stdout.index("PLAY RECAP"):]
    for host in ("h1", "h2", "h3"):  # ok=3: the role's argument validation, the probe, the verdict
        assert any(line.startswith(host) and "ok=3" in line and "failed=0" in line for line in recap.splitlines())
        assert re.search(rf'"msg": "{host}: ready: ', play.stdout), play.stdout[-3000:]  # each host's verdict
    assert any(line.startswith("h4") and "unreachable=1" in line for line in recap.splitlines())
