"""The global --gpus selection: `all` or explicit physical indices like `0,1` (read by
fdl.hostside.checks.devices)."""

from __future__ import annotations

from typing import NamedTuple

from fdl.errors import UsageError
from fdl.hostside.checks.devices import parse_gpu_ids


class GpuSelection(NamedTuple):
    """ids=None means every visible GPU."""

    spec: str
    ids: tuple[int, ...] | None

    def __str__(self) -> str:
        return "all" if self.ids is None else ",".join(map(str, self.ids))


def parse_gpus(spec: str, present: int | None = -1) -> GpuSelection:
    """Parse a --gpus value; present=-1 asks NVML how many GPUs exist (None: unknown)."""
    text = spec.strip()
    if not text:
        raise UsageError("--gpus needs a value: 'all' or GPU indices like 0,1.")
    if text == "all":
        return GpuSelection(spec, None)
    try:
        ids = parse_gpu_ids(text)
    except ValueError as exc:
        raise UsageError(f"--gpus {spec!r}: {exc}.") from None
    if present == -1:
        present = nvml_device_count()
    if present is not None:
        beyond = [i for i in ids if i >= present]
        if beyond:
            raise UsageError(
                f"--gpus {spec!r}: GPU {beyond[0]} does not exist; this host has {present} GPU"
                f"{'s' if present != 1 else ''} (indices 0 to {present - 1})." if present else
                f"--gpus {spec!r}: this host has no GPUs that NVML can see."
            )
    return GpuSelection(spec, ids)


def nvml_device_count() -> int | None:
    """How many GPUs NVML reports, or None when it cannot tell (no driver, no library)."""
    from fdl.hostside.checks.nvml import device_count

    return device_count()
