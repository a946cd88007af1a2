"""Fixtures for cluster tests on the testbed: fake GPUs, libtorch trees and data every host can read."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.fakes import FakeNvml, build_fake_nccl, build_fake_nvml, make_libtorch
from tests.testbed import Testbed


@dataclass
class Kit:
    """What the hosts share (under the testbed's world-readable directory)."""

    bed: Testbed
    nvml: FakeNvml
    data: Path  # an existing shared data directory
    libtorch: Path  # libtorch 2.10.0, cu128, bundling NCCL 2.27.5
    libtorch_old_nccl: Path  # libtorch 2.10.0, cu128, bundling NCCL 2.21.5
    libtorch_old: Path  # libtorch 2.9.0, cu128, bundling NCCL 2.27.5
    nccl_2_27: Path  # a libnccl.so.2 of NCCL 2.27.5, for LD_PRELOAD

    def worker_env(self, devices: str = "H100:9.0:80G", libtorch: Path | None = None, **extra: str) -> dict:
        """A worker's env: — its fake GPUs and its libtorch — as fdl.cluster.yml carries it."""
        return {**self.nvml.env(devices), "LIBTORCH": str(libtorch or self.libtorch), **extra}

    def workers(self, **per_host: dict) -> list[dict]:
        """Every testbed host as a green worker; per_host={"h2": {...}} overrides keys of one host."""
        entries = []
        for host in self.bed.hosts:
            entry = host.worker(env=self.worker_env(), data_path=str(self.data))
            entry.update(per_host.get(host.name, {}))
            entries.append(entry)
        return entries

    def project(self, root: Path, workers: list[dict] | None = None, **cluster_keys) -> Path:
        """A project directory: fdl.yml plus fdl.cluster.yml for these workers."""
        root.mkdir(parents=True, exist_ok=True)
        (root / "fdl.yml").write_text("commands:\n  hello: echo hello\n")
        doc = self.bed.cluster(workers if workers is not None else self.workers())
        doc["cluster"].update(cluster_keys)
        (root / "fdl.cluster.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        return root


@pytest.fixture(scope="module")
def kit(testbed: Testbed) -> Kit:
    shared = testbed.shared
    data = testbed.storage  # shared storage: a mount every host sees, writable by every host's user
    kit = Kit(
        bed=testbed,
        nvml=FakeNvml(build_fake_nvml(shared / "nvml")),
        data=data,
        libtorch=make_libtorch(shared / "lt-2.10-nccl2.27", nccl="2.27.5"),
        libtorch_old_nccl=make_libtorch(shared / "lt-2.10-nccl2.21", nccl="2.21.5"),
        libtorch_old=make_libtorch(shared / "lt-2.9", torch="2.9.0", nccl="2.27.5"),
        nccl_2_27=build_fake_nccl(shared / "nccl-2.27.5", "2.27.5"),
    )
    subprocess.run(["chmod", "-R", "a+rX", str(shared)], check=True)
    return kit
