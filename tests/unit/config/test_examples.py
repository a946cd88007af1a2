"""The example configurations in examples/ load through fdl's own loader and schema, and say what they claim."""

from __future__ import annotations

import shutil
from pathlib import Path

from fdl.config.project import EnvSelection, load_config
from fdl.hostside.checks.devices import Devices

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_the_three_host_cluster_example_loads_under_its_env(tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    shutil.copytree(EXAMPLES / "cluster", root)
    cfg = load_config(root, EnvSelection("cluster", "@sigil"))
    assert not cfg.warnings, cfg.warnings  # no unknown keys: every annotated key is one fdl reads
    cluster = cfg.cluster
    assert cluster is not None and cluster.controller.address == "10.0.0.11:1337"
    assert [(w.host, w.address, w.user, w.arch, w.local_devices) for w in cluster.workers] == [
        ("node-a", "10.0.0.11", "op", "precompiled/cu128", Devices(ids=(0, 1))),
        ("node-b", "10.0.0.12", "op", "precompiled/cu128", Devices(ids=(0, 1, 2, 3))),
        ("node-c", "10.0.0.13", "train", "precompiled/cu126", Devices(ids=(0,))),
    ]
    assert cluster.workers[2].env_dict["LD_PRELOAD"].endswith("/libnccl.so.2")
    assert cfg.commands["train"].cluster and cfg.commands["train"].bin == "target/release/train"
    assert cfg.commands["test"].run == "cargo test"
    # Without the env the base alone loads: commands, no cluster.
    base = load_config(root, EnvSelection())
    assert base.cluster is None and set(base.commands) == {"test", "train"}


def test_the_quickstart_example_loads(tmp_path: Path) -> None:
    cfg = load_config(EXAMPLES / "quickstart", EnvSelection())
    assert cfg.commands["train"].local_devices == Devices(kind="cpu", count=2) and not cfg.warnings
