"""Thin access to NVML through NVIDIA's own bindings (pynvml, from nvidia-ml-py).

Standard library and pynvml only: this file also runs inside Ansible modules on
remote hosts, where fdl ships pynvml next to it as module_utils.
"""

from __future__ import annotations


def load_pynvml():
    """Import pynvml, locally or from the module_utils fdl ships to a remote host; None if absent."""
    try:
        import pynvml  # noqa: PLC0415 - loaded only when a command needs NVML
    except ImportError:
        try:
            from ansible.module_utils import pynvml  # type: ignore[no-redef]  # noqa: PLC0415
        except ImportError:
            return None
    return pynvml


def device_count() -> int | None:
    """Number of GPUs NVML reports; None when NVML is unavailable or fails."""
    pynvml = load_pynvml()
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def device_capabilities() -> list[tuple[int, int]] | None:
    """CUDA compute capability (major, minor) of every GPU NVML sees; None when NVML is unavailable."""
    pynvml = load_pynvml()
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        return [tuple(pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(count)]
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
