"""NCCL discovery order, its version (a real ctypes call into a compiled fake), and the --docker check."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from fdl.hostside.checks.nccl import check_docker_service, check_nccl, decode_version, find_nccl, library_version
from fdl.hostside.checks.report import ERROR, OK, SKIPPED, WARNING
from fdl.hostside.libtorch.resolve import resolve_libtorch
from tests.fakes import build_fake_nccl, make_libtorch


def _no_system_nccl() -> None:
    if find_nccl(None, {}) is not None:
        pytest.skip("this host has a system libnccl.so.2, so 'no NCCL anywhere' cannot be arranged here")


def test_version_codes_decode_in_both_encodings() -> None:
    assert decode_version(22705) == "2.27.5"
    assert decode_version(21805) == "2.18.5"
    assert decode_version(2804) == "2.8.4"  # before 2.9 the code was major*1000 + minor*100 + patch


def test_version_comes_from_ncclGetVersion_when_the_library_loads(tmp_path: Path) -> None:
    # file says 2.21.5, the library itself says 2.27.5: the library wins
    link = build_fake_nccl(tmp_path, "2.21.5", reported="2.27.5")
    assert library_version(str(link)) == ("2.27.5", "ncclGetVersion")


def test_version_falls_back_to_the_file_name(tmp_path: Path) -> None:
    (tmp_path / "libnccl.so.2.19.3").write_bytes(b"not an ELF file")
    (tmp_path / "libnccl.so.2").symlink_to("libnccl.so.2.19.3")
    assert library_version(str(tmp_path / "libnccl.so.2")) == ("2.19.3", "filename")


def test_libtorch_bundled_nccl_comes_before_ld_library_path(tmp_path: Path) -> None:
    vdir = make_libtorch(tmp_path / "lt", "", nccl="2.27.5")
    other = tmp_path / "other"
    build_fake_nccl(other, "2.18.5")
    found = find_nccl(str(vdir), {"LD_LIBRARY_PATH": str(other)})
    assert (found.origin, Path(found.real_path).name) == ("libtorch", "libnccl.so.2.27.5")


def test_ld_preload_wins(tmp_path: Path) -> None:
    vdir = make_libtorch(tmp_path / "lt", "", nccl="2.27.5")
    pinned = build_fake_nccl(tmp_path / "nccl" / "builds" / "v2.26.2-sm61" / "lib", "2.26.2")
    found = find_nccl(str(vdir), {"LD_PRELOAD": f"/nonexistent/libfoo.so {pinned}"})
    assert (found.origin, found.path) == ("LD_PRELOAD", str(pinned))


def test_cuda_libtorch_reports_the_nccl_it_would_load(tmp_path: Path) -> None:
    info = resolve_libtorch(str(make_libtorch(tmp_path / "lt", "", nccl="2.27.5")), {}, None, None)
    result, _ = check_nccl(info, environ={})
    assert result.status == OK
    assert result.data["version"] == "2.27.5" and result.data["version_source"] == "ncclGetVersion"
    assert "NCCL 2.27.5" in result.message


def test_unreadable_version_is_a_warning(tmp_path: Path) -> None:
    vdir = make_libtorch(tmp_path / "lt", "", nccl="2", nccl_loadable=False)
    info = resolve_libtorch(str(vdir), {}, None, None)
    result, _ = check_nccl(info, environ={})
    assert result.status == WARNING and "version cannot be read" in result.message


def test_cuda_libtorch_without_nccl_is_an_error(tmp_path: Path) -> None:
    _no_system_nccl()
    info = resolve_libtorch(str(make_libtorch(tmp_path / "lt", "")), {}, None, None)
    result, _ = check_nccl(info, environ={})
    assert result.status == ERROR and "No libnccl.so.2" in result.message and "--docker" in result.hint


def test_cpu_libtorch_without_nccl_is_skipped(tmp_path: Path) -> None:
    _no_system_nccl()
    info = resolve_libtorch(str(make_libtorch(tmp_path / "lt", "", cuda="none", archs="cpu")), {}, None, None)
    result, _ = check_nccl(info, environ={})
    assert result.status == SKIPPED and "CPU libtorch" in result.message


# ---- --docker SERVICE ----

STAND_IN = """#!/bin/sh
# Stand-in for the docker CLI (no Docker engine or compose plugin on the test machines).
printf '%s|%s\\n' "$PWD" "$*" >> "$FDLP3_DOCKER_LOG"
if [ "$1 $2 $3" = "compose config --services" ]; then
    if [ -n "$FDLP3_DOCKER_FAIL" ]; then echo "$FDLP3_DOCKER_FAIL" >&2; exit 14; fi
    printf 'dev\\ncuda\\n'
    exit 0
fi
echo "stand-in docker: unexpected arguments: $*" >&2
exit 64
"""


@pytest.fixture
def docker_bin(tmp_path: Path) -> Path:
    """A directory whose `docker` is a stand-in script: mock, because no Docker engine exists here."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    script.write_text(STAND_IN)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def test_docker_service_that_exists_passes_and_skips_host_nccl(tmp_path: Path, docker_bin: Path) -> None:
    """Stand-in docker script (no engine here): the service is listed, so the check passes."""
    log = tmp_path / "docker.log"
    env = {"PATH": str(docker_bin), "FDLP3_DOCKER_LOG": str(log)}
    result, library = check_nccl(None, docker="cuda", project_root=str(tmp_path), environ=env)
    assert (result.status, library) == (OK, None)
    assert result.data["services"] == ["dev", "cuda"]
    assert log.read_text() == f"{tmp_path}|compose config --services\n"  # ran in the project directory


def test_docker_service_missing_names_the_ones_there(tmp_path: Path, docker_bin: Path) -> None:
    """Stand-in docker script (no engine here)."""
    env = {"PATH": str(docker_bin), "FDLP3_DOCKER_LOG": str(tmp_path / "log")}
    result = check_docker_service("rocm", str(tmp_path), env)
    assert result.status == ERROR and "no service named 'rocm'" in result.message and "dev, cuda" in result.message


def test_docker_compose_failure_is_reported_with_its_words(tmp_path: Path, docker_bin: Path) -> None:
    """Stand-in docker script (no engine here) that fails the way compose does without a compose file."""
    env = {"PATH": str(docker_bin), "FDLP3_DOCKER_LOG": str(tmp_path / "log"),
           "FDLP3_DOCKER_FAIL": "no configuration file provided: not found"}
    result = check_docker_service("cuda", str(tmp_path), env)
    assert result.status == ERROR
    assert "exit 14" in result.message and "no configuration file provided" in result.message


def test_docker_not_installed_is_a_clear_error(tmp_path: Path) -> None:
    result = check_docker_service("cuda", str(tmp_path), {"PATH": str(tmp_path)})
    assert result.status == ERROR and "docker command is not installed" in result.message
    assert "compose plugin" in result.hint


def test_real_docker_cli_without_compose_plugin(tmp_path: Path) -> None:
    """The real docker CLI where it lacks the compose plugin (as on these machines): a clear error."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI on this host")
    has_compose = subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    if has_compose:
        pytest.skip("this docker has the compose plugin; the stand-in tests cover the rest")
    result = check_docker_service("cuda", str(tmp_path), {"PATH": os.path.dirname(docker)})
    assert result.status == ERROR and "docker compose config --services` failed" in result.message
