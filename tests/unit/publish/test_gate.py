"""Gate pieces that need no build: vendor headers and the install line for this platform."""

from __future__ import annotations

from pathlib import Path

import pytest

from fdl.hostside.libtorch.variants import Libtorch
from fdl.publish.gate import (
    GateError,
    check_gate_headers,
    header_install_line,
    headers_present,
    package_manager,
)


def fake_tool(directory: Path, name: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)


@pytest.mark.parametrize("tools, manager", [(["apt-get"], "apt"), (["dnf"], "dnf"), (["brew"], "brew"),
                                            ([], None), (["dnf", "apt-get"], "apt")])
def test_package_manager_is_detected_from_path(tmp_path: Path, tools: list[str], manager: str | None) -> None:
    for tool in tools:
        fake_tool(tmp_path / "bin", tool)
    (tmp_path / "bin").mkdir(exist_ok=True)
    assert package_manager(str(tmp_path / "bin")) == manager


@pytest.mark.parametrize("vendor, manager, line", [
    ("nvidia", "apt", "sudo apt-get install nvidia-cuda-toolkit"),
    ("amd", "apt", "sudo apt-get install libamdhip64-dev"),
    ("nvidia", "dnf", "sudo dnf install cuda-toolkit"),
    ("amd", "dnf", "sudo dnf install rocm-hip-devel"),
    ("amd", "brew", "no Homebrew package"),
])
def test_install_line_is_the_platforms_own(vendor: str, manager: str, line: str) -> None:
    assert header_install_line(vendor, manager, root=False).startswith(line)
    assert not header_install_line(vendor, manager, root=True).startswith("sudo")


def test_headers_are_found_through_the_vendor_env(tmp_path: Path) -> None:
    cuda = tmp_path / "cuda"
    (cuda / "include").mkdir(parents=True)
    env = {"CUDA_HOME": str(cuda), "PATH": ""}
    assert not headers_present("nvidia", env, search=[cuda / "include"])
    (cuda / "include" / "cuda_runtime.h").write_text("")
    assert headers_present("nvidia", env)
    rocm = tmp_path / "rocm"
    (rocm / "include" / "hip").mkdir(parents=True)
    (rocm / "include" / "hip" / "hip_runtime.h").write_text("")
    assert headers_present("amd", {"ROCM_PATH": str(rocm)})


def test_missing_headers_refuse_the_gate_with_the_install_line(tmp_path: Path) -> None:
    fake_tool(tmp_path / "bin", "dnf")
    env = {"PATH": str(tmp_path / "bin"), "ROCM_PATH": str(tmp_path / "no-rocm")}
    if headers_present("amd", env):
        pytest.skip("this box has HIP headers in a system directory, so their absence cannot be shown")
    variant = Libtorch(str(tmp_path / "rocm70"), "home", "precompiled/rocm70")
    with pytest.raises(GateError) as info:
        check_gate_headers(variant, env)
    message = info.value.message
    assert "--gate precompiled/rocm70" in message and "hip/hip_runtime.h" in message
    assert ("dnf install rocm-hip-devel" in message) and ("Nothing was touched" in message)
    check_gate_headers(Libtorch(str(tmp_path), "home", "precompiled/cpu"), env)  # CPU needs no headers

