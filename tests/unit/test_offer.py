"""The GPU stack check before a dial, through the real pynvml against a fake libnvidia-ml.so.1. Nothing to offer
is an error of exit 1 here; `fdl join` decides, once before its first dial, that it is permanent
(tests/unit/agent/test_permanent.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fdl.hostside.checks.devices import Devices
from fdl.offer import amd_gpus, check_gpu_stack
from tests.conftest import fdl_env

SCRIPT = """
import json, sys
from fdl.offer import check_gpu_stack
from fdl.config.schema import parse_devices
from fdl.errors import FdlError
try:
    offer = check_gpu_stack(parse_devices(sys.argv[1]), topology=sys.argv[2])
except FdlError as exc:
    print(json.dumps({"code": exc.exit_code, "message": exc.message, "hint": exc.hint}))
else:
    print(json.dumps({"ids": offer.devices.ids, "vendor": offer.vendor, "names": offer.gpu_names,
                      "caps": offer.capabilities, "summary": offer.summary}))
"""


def offer_in_subprocess(devices: str, env: dict, topology: str = "/nonexistent") -> dict:
    """NVML is loaded once per process, from LD_LIBRARY_PATH as it was at start: ask a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", SCRIPT, devices, topology], env=fdl_env(env), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_all_resolves_to_every_gpu(fake_nvml):
    got = offer_in_subprocess("all", fake_nvml.env("H100:9.0:80G,RTX3060:8.6:12G"))
    assert got["ids"] == [0, 1] and got["vendor"] == "nvidia"
    assert got["names"] == ["H100", "RTX3060"] and got["caps"] == [[9, 0], [8, 6]]


def test_explicit_ids_are_checked_against_the_box(fake_nvml):
    assert offer_in_subprocess("1", fake_nvml.env("H100:9.0:80G,RTX3060:8.6:12G"))["ids"] == [1]
    got = offer_in_subprocess("0,3", fake_nvml.env("H100:9.0:80G"))
    assert got["code"] == 1 and "GPU 3" in got["message"]


@pytest.mark.parametrize("script", ["", "init-fail"])
def test_no_gpu_is_refused_and_names_the_cpu_escape(fake_nvml, script):
    got = offer_in_subprocess("all", fake_nvml.env(script))
    assert got["code"] == 1
    assert "nothing to offer" in got["message"]
    assert "--devices cpu:N" in got["hint"]


def test_no_nvml_library_at_all_is_refused(fake_nvml):
    got = offer_in_subprocess("all", fake_nvml.env(None))
    assert got["code"] == 1 and "libnvidia-ml.so.1" in got["message"]


def test_cpu_ranks_need_no_gpu():
    offer = check_gpu_stack(Devices(kind="cpu", count=3))
    assert offer.vendor is None and offer.devices.count == 3 and "3 CPU ranks" in offer.summary


def test_amd_gpus_come_from_the_kfd_topology(tmp_path, fake_nvml):
    topo = tmp_path / "nodes"
    for node, props in {"0": "cpu_cores_count 16\nsimd_count 0\n", "1": "simd_count 440\ngfx_target_version 90010\n",
                        "2": "simd_count 192\ngfx_target_version 110000\n"}.items():
        (topo / node).mkdir(parents=True)
        (topo / node / "properties").write_text(props)
    assert amd_gpus(str(topo)) == ["gfx90a", "gfx1100"]
    got = offer_in_subprocess("all", fake_nvml.env(None), topology=str(topo))
    assert got["vendor"] == "amd" and got["ids"] == [0, 1] and got["names"] == ["gfx90a", "gfx1100"]
