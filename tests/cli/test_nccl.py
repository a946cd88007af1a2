"""`fdl nccl build --dry-run` and the planning refusals, through the real CLI.

GPU archs are detected by the real pynvml bindings against the shared fake
libnvidia-ml.so.1 (tests/fakes/fake_nvml.c, compiled for this test session); the
project's libtorch variants carry loadable fake libnccl builds that answer
ncclGetVersion.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_fdl
from tests.fakes.nccl import tree
from tests.fakes.nccl_fixtures import nccl_project  # noqa: F401 - pytest fixture

MIXED = "GTX1080:6.1:8G,RTXPRO6000:12.0:96G,GTX1080:6.1:8G"


def dry_run(project, nvml, gpus, *args):
    return run_fdl("nccl", "build", "--dry-run", *args, cwd=project, env=nvml.env(gpus))


def test_dry_run_plans_for_the_mixed_gpus_nvml_reports(nccl_project, fake_nvml):
    before = tree(nccl_project)
    result = dry_run(nccl_project, fake_nvml, MIXED)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "v2.27.5 (git tag v2.27.5-1)" in out
    assert "precompiled/cu128" in out  # where the tag came from
    assert "6.1, 12.0" in out and "GPU0 6.1, GPU1 12.0, GPU2 6.1" in out
    for flag in ("-gencode=arch=compute_61,code=sm_61", "-gencode=arch=compute_120,code=sm_120",
                 "-gencode=arch=compute_120,code=compute_120"):
        assert flag in out
    context = nccl_project / "libtorch/nccl/context/v2.27.5-sm61-sm120"
    assert f"{context}/Dockerfile.nccl.source" in out
    assert (f"docker build --tag fdl-nccl:v2.27.5-sm61-sm120 --file {context}/Dockerfile.nccl.source "
            f"{context}") in out
    assert f"{nccl_project}/libtorch/nccl/builds/v2.27.5-sm61-sm120/lib/libnccl.so.2" in out
    assert "5-15 minutes" in out
    assert tree(nccl_project) == before  # a dry run changes nothing


def test_dry_run_json_twin_carries_the_same_plan(nccl_project, fake_nvml):
    result = dry_run(nccl_project, fake_nvml, MIXED, "--json", "--jobs", "8")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["tag"] == "v2.27.5" and plan["git_ref"] == "v2.27.5-1"
    assert plan["archs"] == ["6.1", "12.0"] and plan["archs_label"] == "sm61-sm120"
    assert plan["jobs"] == 8
    assert plan["library"] == f"{nccl_project}/libtorch/nccl/builds/v2.27.5-sm61-sm120/lib/libnccl.so.2"
    assert plan["docker_commands"]["create"] == ["docker", "create", "fdl-nccl:v2.27.5-sm61-sm120"]


def test_explicit_tag_and_archs_need_no_gpu_and_no_libtorch(tmp_path, fake_nvml):
    (tmp_path / "fdl.yml").write_text("commands: {}\n")
    result = dry_run(tmp_path, fake_nvml, "", "--tag", "v2.26.2", "--archs", "6.1;12.0", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert (plan["tag"], plan["tag_source"], plan["archs_source"]) == ("v2.26.2", "--tag", "--archs")
    assert plan["output_dir"].endswith("/libtorch/nccl/builds/v2.26.2-sm61-sm120")


def test_without_a_project_the_plan_roots_in_the_working_directory(tmp_path, fake_nvml):
    result = dry_run(tmp_path, fake_nvml, "", "--tag", "v2.27.5", "--archs", "8.6", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["root"] == str(tmp_path.resolve())


@pytest.mark.parametrize("args, says", [
    (["--tag", "latest"], "--tag 'latest' is not an NCCL release tag"),
    (["--tag", "v2.27"], "--tag 'v2.27' is not an NCCL release tag"),
    (["--archs", "6.1;7.4"], "'7.4' is not a CUDA compute capability"),
    (["--archs", "sm_35"], "older than anything"),
    (["--jobs", "0"], "--jobs 0"),
    (["--base-image", "cuda image; rm -rf /"], "is not a Docker image reference"),
])
def test_bad_input_is_refused_with_exit_1(nccl_project, fake_nvml, args, says):
    before = tree(nccl_project)
    result = dry_run(nccl_project, fake_nvml, MIXED, *args)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("fdl: error: ")
    assert says in result.stderr
    assert "Traceback" not in result.stderr
    assert tree(nccl_project) == before


def test_no_gpus_and_no_archs(nccl_project, fake_nvml):
    result = dry_run(nccl_project, fake_nvml, "none")
    assert result.returncode == 1
    assert "this host has no GPUs that NVML can see" in result.stderr
    assert "--archs" in result.stderr


def test_nvml_failing_and_no_archs(nccl_project, fake_nvml):
    result = dry_run(nccl_project, fake_nvml, "init-fail")
    assert result.returncode == 1
    assert "cannot detect the GPU architectures of this host" in result.stderr
    assert "--archs" in result.stderr


def test_no_bundled_nccl_and_no_tag(tmp_path, fake_nvml):
    (tmp_path / "fdl.yml").write_text("commands: {}\n")
    result = dry_run(tmp_path, fake_nvml, MIXED)
    assert result.returncode == 1
    assert "cannot tell which NCCL version to build" in result.stderr
    assert "--tag v2.27.5" in result.stderr


def closed_port() -> int:
    """A loopback port nothing listens on: a worker there is unreachable at once (refused), and no traffic
    leaves this machine."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


CLUSTER = f"""\
cluster:
  controller: 127.0.0.1:1337
  ssh: {{user: op, known_hosts: /dev/null}}
  workers:
    - host: node-b
      address: 127.0.0.1
      port: {closed_port()}
      local_devices: [0]
"""


def test_host_needs_a_cluster_env(nccl_project, fake_nvml):
    result = dry_run(nccl_project, fake_nvml, MIXED, "--host", "node-b", "--archs", "6.1")
    assert result.returncode == 1
    assert "no cluster is configured here" in result.stderr
    assert "fdl @cluster nccl build --host node-b" in result.stderr


def test_host_must_be_a_worker(nccl_project, fake_nvml):
    (nccl_project / "fdl.cluster.yml").write_text(CLUSTER)
    result = run_fdl("@cluster", "nccl", "build", "--dry-run", "--host", "node-x", "--archs", "6.1",
                     cwd=nccl_project, env=fake_nvml.env(MIXED))
    assert result.returncode == 1
    assert "--host node-x: no worker of that name" in result.stderr and "node-b" in result.stderr


def test_worker_plan_without_archs_asks_for_them_when_its_probe_reports_no_gpu(nccl_project, fake_nvml, tmp_path):
    """The worker's GPUs come from the cluster probe; node-b cannot be reached, so they are unknown: the error
    names it and why, and asks for --archs."""
    (nccl_project / "fdl.cluster.yml").write_text(CLUSTER)
    result = run_fdl("@cluster", "nccl", "build", "--dry-run", "--host", "node-b", "--tag", "v2.27.5",
                     cwd=nccl_project, env={**fake_nvml.env(MIXED), "HOME": str(tmp_path)}, timeout=180)
    assert result.returncode == 1
    assert "fdl cannot tell the GPU architectures of node-b: its probe reported no GPU (node-b " in result.stderr
    assert "is unreachable" in result.stderr and "--archs" in result.stderr


def test_worker_plan_targets_the_worker(nccl_project, fake_nvml, tmp_path):
    """Without --tag the version comes from the cluster's hosts; none reports one (node-b is unreachable), so
    the project's libtorch decides, and the notes say why."""
    (nccl_project / "fdl.cluster.yml").write_text(CLUSTER)
    result = run_fdl("@cluster", "nccl", "build", "--dry-run", "--json", "--host", "node-b", "--archs", "6.1",
                     cwd=nccl_project, env={**fake_nvml.env(MIXED), "HOME": str(tmp_path)}, timeout=180)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["host"] == "node-b" and plan["remote"] is True
    assert plan["library"] == "~/.flodl/libtorch/nccl/builds/v2.27.5-sm61/lib/libnccl.so.2"
    assert "no cluster host reported an NCCL version" in plan["notes"][0]
    assert plan["notes"][1].startswith("not compared (no NCCL version reported): node-b: node-b (")
    assert "not collected by this fdl yet" not in result.stderr
    tagged = run_fdl("@cluster", "nccl", "build", "--dry-run", "--json", "--host", "node-b", "--archs", "6.1",
                     "--tag", "v2.26.2", cwd=nccl_project, env=fake_nvml.env(MIXED))
    assert json.loads(tagged.stdout)["notes"] == []  # --tag and --archs: nothing to ask the hosts


def test_no_version_anywhere_says_the_cluster_reported_none_either(tmp_path, fake_nvml):
    (tmp_path / "fdl.yml").write_text("commands: {}\n")
    (tmp_path / "fdl.cluster.yml").write_text(CLUSTER)
    result = run_fdl("@cluster", "nccl", "build", "--dry-run", "--archs", "6.1", cwd=tmp_path,
                     env={**fake_nvml.env(MIXED), "HOME": str(tmp_path)}, timeout=180)
    assert result.returncode == 1
    assert "cannot tell which NCCL version to build" in result.stderr
    assert "No cluster host reports one either (node-b: node-b (" in result.stderr


def test_help_lists_the_command():
    result = run_fdl("--help")
    assert result.returncode == 0 and "nccl" in result.stdout
    result = run_fdl("nccl", "build", "--help")
    assert result.returncode == 0
    for flag in ("--tag", "--archs", "--jobs", "--dry-run", "--json", "--host"):
        assert flag in result.stdout
