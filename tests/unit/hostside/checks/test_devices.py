"""One device-selection parser: --gpus, --devices, join.devices, local_devices and the probe's selection
read GPU ids the same way (fdl.hostside.checks.devices) and refuse the same spellings for the same reason."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from fdl.agent.options import resolve_options
from fdl.config.project import load_config
from fdl.errors import ConfigError, UsageError
from fdl.gpus import parse_gpus
from fdl.hostside.checks.devices import Devices, parse_devices, parse_gpu_ids
from fdl.hostside.checks.gpu import parse_selection
from fdl.hostside.checks.health import declared_gpu_ids


@pytest.mark.parametrize(("text", "ids"), [("0", (0,)), ("0,1", (0, 1)), (" 3 , 1 ", (3, 1)), ("1023", (1023,))])
def test_every_reader_takes_the_same_gpu_ids(text: str, ids: tuple[int, ...]) -> None:
    assert parse_gpu_ids(text) == ids
    assert parse_devices(text) == Devices(ids=ids)
    assert parse_gpus(text, present=None).ids == ids
    assert declared_gpu_ids(text) == list(ids)
    assert parse_gpu_ids(list(ids)) == ids


@pytest.mark.parametrize(("text", "reason"), [
    ("0,0", "GPU 0 is listed twice"),
    ("x", "'x' is not a GPU index"),
    ("-1", "-1 is negative"),
    ("0,,1", "an empty entry"),
    ("1024", "1024 is not a GPU index (0 to 1023)"),
    ("01", "'01' is not a GPU index"),
])
def test_every_reader_refuses_the_same_spelling_for_the_same_reason(tmp_path: Path, text: str,
                                                                    reason: str) -> None:
    """Regression: --gpus, --devices and join.devices had parsers of their own, with different words (and
    different limits) for the same mistake."""
    with pytest.raises(ValueError, match=re.escape(reason)):
        parse_devices(text)
    with pytest.raises(UsageError) as gpus:
        parse_gpus(text, present=None)
    assert gpus.value.message == f"--gpus {text!r}: {reason}" + gpus.value.message.split(reason, 1)[1]
    with pytest.raises(UsageError) as flag:
        resolve_options(None, {"controller": "h", "bin": "/x", "devices": text}, None, environ={})
    assert f"--devices {text!r}: {reason}" in flag.value.message
    (tmp_path / "fdl.yml").write_text(textwrap.dedent(f"""
        join: {{devices: '{text}'}}
        """))
    with pytest.raises(ConfigError, match=re.escape(reason)):
        load_config(tmp_path)


def test_all_and_cpu_ranks() -> None:
    assert parse_devices("all") == Devices() and parse_devices("cpu:4") == Devices(kind="cpu", count=4)
    assert parse_devices(Devices(kind="cpu", count=2)) == Devices(kind="cpu", count=2)  # a parsed value passes
    assert str(parse_devices([1, 0])) == "1,0"
    assert declared_gpu_ids("cpu:2") is None and declared_gpu_ids("all") is None
    with pytest.raises(ValueError, match="cpu:N needs N from 1 to 256"):
        parse_devices("cpu:0")
    with pytest.raises(UsageError, match="'cpu:2' is not a GPU index"):
        parse_gpus("cpu:2", present=None)  # --gpus selects GPUs only


def test_the_probe_selection_splits_the_parsed_ids_into_present_and_missing() -> None:
    devices = [SimpleNamespace(index=0, uuid="GPU-a", health=None), SimpleNamespace(index=1, uuid="GPU-b",
                                                                                   health=None)]
    chosen = parse_selection("1,3", {}, devices)
    assert (chosen.indices, chosen.missing) == ((1,), ("3",))
    assert parse_selection([0, 1], {}, devices, "local_devices").indices == (0, 1)
    assert parse_selection("all", {}, devices).indices is None
    garbage = parse_selection("0,x", {}, devices)
    assert garbage.indices == () and garbage.missing == ("0,x",)
