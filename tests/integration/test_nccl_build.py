"""`fdl nccl build` through the real role, playbook and ansible-playbook on this machine.

These machines (and CI) have no Docker engine, so the one mocked part is the docker
client: tests/fakes/docker_standin.py is installed as `docker` on PATH. It records
every invocation and, for `docker cp`, writes the libnccl.so.2.X.Y the image would
hold. Everything else is real: typer CLI, planner, pynvml over a fake
libnvidia-ml.so.1 (tests/fakes/fake_nvml.c), ansible-runner, ansible-playbook, the role's tasks, the Jinja2
Dockerfile template and the fdl_nccl_install module's atomic rename.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from fdl import resources
from tests.conftest import fdl_env, run_fdl
from tests.fakes.nccl import clean_path, docker_calls, install_docker_standin, tree
from tests.fakes.nccl_fixtures import nccl_project  # noqa: F401 - pytest fixture

pytestmark = pytest.mark.slow
MIXED = "GTX1080:6.1:8G,RTXPRO6000:12.0:96G"
NAME = "v2.27.5-sm61-sm120"


@pytest.fixture
def docker(tmp_path) -> dict:
    """The docker stand-in on PATH, with its call log and state."""
    bin_dir = tmp_path / "bin"
    install_docker_standin(bin_dir)
    return {"bin": bin_dir, "log": tmp_path / "docker-calls.jsonl",
            "env": {"PATH": clean_path(bin_dir), "FAKE_DOCKER_LOG": str(tmp_path / "docker-calls.jsonl"),
                    "FAKE_DOCKER_STATE": str(tmp_path / "docker-state.json")}}


def build(project: Path, nvml: Path, docker: dict, *args: str, **env: str):
    return run_fdl("nccl", "build", *args, cwd=project,
                   env={**nvml.env(MIXED), **docker["env"], **env}, timeout=300)


def leftovers(project: Path) -> list[str]:
    builds = project / "libtorch/nccl/builds"
    return sorted(p.name for p in builds.iterdir() if ".partial-" in p.name or ".old-" in p.name) \
        if builds.exists() else []


def test_build_runs_the_planned_docker_commands_and_puts_the_library_in_place(nccl_project, fake_nvml, docker):
    planned = json.loads(build(nccl_project, fake_nvml, docker, "--dry-run", "--json").stdout)
    result = build(nccl_project, fake_nvml, docker)
    assert result.returncode == 0, result.stdout + result.stderr

    # The build time is stated before the build starts.
    assert "this takes 5-15 minutes" in result.stderr.splitlines()[0]
    # The role ran exactly the docker commands the dry run printed.
    calls = [["docker", *argv] for argv in docker_calls(docker["log"])]
    copy = calls[4]  # after --version, info, build, create
    container, staging = copy[2].partition(":")[0], copy[3]
    expected = planned["docker_commands"]
    assert calls == [
        ["docker", "--version"],
        expected["preflight"],
        expected["build"],
        expected["create"],
        ["docker", "cp", expected["copy"][2].replace("<container>", container), staging],
        ["docker", "rm", container],
    ]
    assert staging.startswith(f"{nccl_project}/libtorch/nccl/builds/.{NAME}.partial-") and staging.endswith("/lib")

    # The Dockerfile was rendered into the context and declares the gencode list.
    dockerfile = (nccl_project / f"libtorch/nccl/context/{NAME}/Dockerfile.nccl.source").read_text()
    gencode = ("-gencode=arch=compute_61,code=sm_61 -gencode=arch=compute_120,code=sm_120 "
               "-gencode=arch=compute_120,code=compute_120")
    assert f'ENV NVCC_GENCODE="{gencode}"' in dockerfile
    assert "git clone --depth 1 --branch v2.27.5-1 https://github.com/NVIDIA/nccl.git /opt/nccl" in dockerfile
    assert f'RUN make -j{planned["jobs"]} src.build NVCC_GENCODE="$NVCC_GENCODE"' in dockerfile
    assert dockerfile.startswith("#")  # ansible_managed header

    library = nccl_project / f"libtorch/nccl/builds/{NAME}/lib/libnccl.so.2"
    assert os.readlink(library) == "libnccl.so.2.27.5" and library.read_bytes().startswith(b"\x7fELF")
    manifest = json.loads((library.parent.parent / "fdl-nccl-build.json").read_text())
    assert manifest["tag"] == "v2.27.5-1" and manifest["archs"] == ["6.1", "12.0"]
    assert leftovers(nccl_project) == []

    # What to paste into fdl.cluster.yml.
    assert f"Built {library} on localhost" in result.stdout
    assert f"      LD_PRELOAD: {library}\n" in result.stdout
    assert "env:" in result.stdout and "workers:" in result.stdout

    # A rebuild replaces the earlier build in one step; --json carries the result.
    (library.parent / "marker-from-first-build").write_text("x")
    again = build(nccl_project, fake_nvml, docker, "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["library"] == str(library) and report["replaced"] is True
    assert f"LD_PRELOAD: {library}" in report["preload"]
    assert not (library.parent / "marker-from-first-build").exists()
    assert leftovers(nccl_project) == []


@pytest.mark.parametrize("case, says, reached_build", [
    ("no-client", "docker is not installed on localhost", False),
    ("daemon-down", "the docker daemon on localhost is not reachable", False),
    ("build-fails", "Unsupported gpu architecture", True),
    ("wrong-version", "did not produce libnccl.so.2.27.5", True),
])
def test_failures_exit_1_and_leave_the_output_path_alone(nccl_project, fake_nvml, docker, case, says,
                                                         reached_build):
    env = {"no-client": {"PATH": clean_path()}, "daemon-down": {"FAKE_DOCKER_DAEMON": "down"},
           "build-fails": {"FAKE_DOCKER_BUILD_FAIL": "1"}, "wrong-version": {"FAKE_DOCKER_LIB_VERSION": "2.26.2"}}
    before = tree(nccl_project)
    result = build(nccl_project, fake_nvml, docker, **env[case])
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.count("fdl: error: NCCL build on localhost failed") == 1
    assert says in result.stderr
    assert f"{NAME} was left as it was" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (nccl_project / f"libtorch/nccl/builds/{NAME}").exists()
    assert leftovers(nccl_project) == []
    ran_build = any(call[:1] == ["build"] for call in docker_calls(docker["log"]))
    assert ran_build is reached_build
    if not reached_build:  # refused in preflight: nothing at all was written
        assert tree(nccl_project) == before
    if case == "build-fails":  # the last lines of the build log are shown
        assert "  | ERROR: failed to solve" in result.stderr


def test_progress_on_a_terminal_and_the_snippet_names_this_hosts_worker(nccl_project, fake_nvml, docker):
    import socket

    (nccl_project / "fdl.cluster.yml").write_text(
        "cluster:\n  workers:\n"
        f"    - host: pascal-box\n      address: {socket.gethostname()}\n"
        "    - host: other\n      address: 10.9.9.9\n")
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "fdl", "@cluster", "nccl", "build", "--tag", "v2.27.5"],
                              cwd=nccl_project, env=fdl_env({**fake_nvml.env(MIXED), **docker["env"]}),
                              stdout=subprocess.PIPE, stderr=terminal, text=True, timeout=300)
        os.close(terminal)
        terminal = -1
        chunks = []
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO once the terminal side is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(controller)
        if terminal != -1:
            os.close(terminal)
    shown = b"".join(chunks).decode()
    assert proc.returncode == 0, shown
    for step in ("Look for the docker client", "Render Dockerfile.nccl.source into the build context",
                 "Build the NCCL image (5 to 15 minutes", "Move the staged build into place"):
        assert f"  - {step}" in shown
    assert "Preload it on pascal-box" in proc.stdout and "  - host: pascal-box" in proc.stdout


def ansible(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    bin_dir = Path(sys.executable).parent
    full = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(resources.collections_path()), "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCALHOST_WARNING": "0", **(env or {})}
    return subprocess.run([str(bin_dir / "ansible-playbook"), *args], env=full, capture_output=True, text=True,
                          timeout=300)


def test_playbook_and_role_pass_the_syntax_check():
    result = ansible("--syntax-check", "-i", "localhost,", str(resources.playbook("nccl_build.yml")))
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_mode_run_changes_nothing(nccl_project, fake_nvml, docker, tmp_path):
    """ansible-playbook --check, as an Ansible user would run the role: preflight runs, nothing is written."""
    plan = json.loads(build(nccl_project, fake_nvml, docker, "--dry-run", "--json").stdout)
    (tmp_path / "vars.json").write_text(json.dumps(plan["role_vars"]))  # what fdl passes the role
    before = tree(nccl_project)
    # This run's $HOME is not the account's home in the password database, and ansible-core's async_status
    # looks for a job under the latter while the job writes under $HOME: an Ansible user in that position
    # names the directory, as fdl's own inventory does for this machine (fdl.cluster.inventory.local_vars).
    async_dir = Path(os.path.expanduser("~")) / ".ansible_async"
    result = ansible("--check", "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
                     "-e", f"ansible_async_dir={async_dir}",
                     "-e", f"@{tmp_path / 'vars.json'}", str(resources.playbook("nccl_build.yml")),
                     env=docker["env"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "failed=0" in result.stdout
    assert tree(nccl_project) == before
    assert [c[0] for c in docker_calls(docker["log"])] == ["--version", "info"]


def test_the_role_refuses_missing_inputs(tmp_path, docker):
    """Calling the role without the plan's variables fails in preflight, before any docker call."""
    result = ansible("--check", "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
                     str(resources.playbook("nccl_build.yml")), env=docker["env"])
    assert result.returncode != 0
    assert "fdl_nccl needs fdl_nccl_tag (like v2.27.5-1)" in result.stdout
    assert docker_calls(docker["log"]) == []
