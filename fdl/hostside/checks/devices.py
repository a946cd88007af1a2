"""Which devices a host offers, and the one parser of a device selection.

`--gpus`, `--devices`, `join.devices`, a worker's `local_devices`, the
probe's declared GPUs and its explicit selection all say the same thing:
GPU ids (`0,1` or `[0, 1]`), every GPU (`all`), or, where ranks may run on
CPU, `cpu:N`. `parse_devices` reads all of them into a `Devices`;
`parse_gpu_ids` is its GPU-id half, for selections that cannot name CPU
ranks. Host-side (fdl/hostside/): the probe runs it on every host, and the
configuration reader the inventory plugin carries imports it too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

MAX_GPU_ID = 1023
MAX_CPU_RANKS = 256
_DIGITS_RE = re.compile(r"0|[1-9][0-9]{0,8}")  # a plain decimal: no sign, no leading zero, ASCII only


@dataclass(frozen=True)
class Selection:
    """Which GPUs ranks may use: indices into NVML's list; None = every device."""

    source: str | None  # "--gpus", "local_devices", "CUDA_VISIBLE_DEVICES" or None (no selection)
    spec: str | None
    indices: tuple[int, ...] | None
    missing: tuple[str, ...] = ()  # entries naming a device this host does not have


class Devices(NamedTuple):
    """What a host offers: GPU ids, all GPUs (ids=None), or N CPU ranks (gloo)."""

    kind: str = "gpu"  # "gpu" | "cpu"
    ids: tuple[int, ...] | None = None  # gpu ids; None = every GPU present
    count: int = 0  # type: ignore[assignment]  # cpu ranks (the field shadows tuple.count)

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    def ranks(self, gpus_present: int | None = None) -> int:
        if self.is_cpu:
            return self.count
        if self.ids is not None:
            return len(self.ids)
        return gpus_present or 0

    def __str__(self) -> str:
        if self.is_cpu:
            return f"cpu:{self.count}"
        return "all" if self.ids is None else ",".join(map(str, self.ids))


def parse_gpu_ids(value: Any) -> tuple[int, ...]:
    """GPU ids, as text (`"0,1"`), one number or a list; raises ValueError with the reason (no trailing period)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a GPU index")
    if isinstance(value, int):
        value = [value]
    elif isinstance(value, str):
        value = [part.strip() for part in value.split(",")]
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError("expected GPU indices like 0,1")
    ids: list[int] = []
    for item in value:
        index = _gpu_index(item)
        if index in ids:
            raise ValueError(f"GPU {index} is listed twice")
        ids.append(index)
    return tuple(ids)


def _gpu_index(item: Any) -> int:
    if isinstance(item, str):
        if not item:
            raise ValueError("an empty entry; list indices like 0,1 with no gaps")
        if item.startswith("-") and _DIGITS_RE.fullmatch(item[1:]):
            raise ValueError(f"{item} is negative; GPU indices start at 0")
        if not _DIGITS_RE.fullmatch(item):
            raise ValueError(f"{item!r} is not a GPU index; use 'all' or whole numbers like 0,1")
        item = int(item)
    if isinstance(item, bool) or not isinstance(item, int):
        raise ValueError(f"{item!r} is not a GPU index; use whole numbers like 0,1")
    if item < 0:
        raise ValueError(f"{item} is negative; GPU indices start at 0")
    if item > MAX_GPU_ID:
        raise ValueError(f"{item} is not a GPU index (0 to {MAX_GPU_ID})")
    return int(item)


DEVICE_FORMS = "GPU ids (0,1), all, or cpu:N for N CPU ranks"  # what a declaration may say, in a hint's words


def parse_declared(value: Any, what: str) -> Devices | None:
    """What a host declares it offers (`fdl probe --devices`, the fdl_probe role's `fdl_probe_devices`), read
    by parse_devices; None for no particular device (`all`). Raises ValueError naming `what` and the value
    (`--devices 'cpu:two': cpu:N needs N from 1 to 256`), the one refusal both callers print."""
    try:
        devices = parse_devices(value)
    except ValueError as exc:
        raise ValueError(f"{what} {value!r}: {exc}") from None
    return None if not devices.is_cpu and devices.ids is None else devices


def probe_declaration(devices: Devices | None) -> list[int] | str | None:
    """A declaration as the probe's `local_devices` option takes it: "cpu:N", GPU ids, or None (every GPU)."""
    if devices is None or (not devices.is_cpu and devices.ids is None):
        return None
    return str(devices) if devices.is_cpu else list(devices.ids or ())


def parse_devices(value: Any) -> Devices:
    """`[0, 1]`, `"0,1"`, `all`, `cpu:N` -> Devices; raises ValueError with the reason (no trailing period)."""
    if isinstance(value, Devices):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text == "all":
            return Devices()
        if text.startswith("cpu:"):
            count = text[4:]
            if not _DIGITS_RE.fullmatch(count) or not 1 <= int(count) <= MAX_CPU_RANKS:
                raise ValueError(f"cpu:N needs N from 1 to {MAX_CPU_RANKS}")
            return Devices(kind="cpu", count=int(count))
        value = text
    return Devices(ids=parse_gpu_ids(value))
