"""Thin access to NVML through NVIDIA's own bindings (pynvml, from nvidia-ml-py).

Standard library and pynvml only: this file also runs inside Ansible modules on
remote hosts, where fdl ships pynvml next to it as module_utils.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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


# NVML return codes fdl explains to a person (nvml.h); pynvml exposes them as NVMLError.value.
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18


@dataclass
class NvmlDevice:
    """One GPU as NVML reports it (memory in bytes)."""

    index: int
    name: str
    major: int
    minor: int
    memory_total: int
    memory_free: int
    uuid: str | None = None

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}"


@dataclass
class NvmlInventory:
    """What NVML says about this host: driver, CUDA driver version, devices."""

    driver_version: str | None
    cuda_driver_version: str | None  # "12.4", decoded from NVML's 12040
    devices: list[NvmlDevice] = field(default_factory=list)


class NvmlUnavailable(Exception):
    """NVML could not be used: `reason` is one of pynvml-missing, library-missing, init-failed, query-failed."""

    def __init__(self, reason: str, detail: str, code: int | None = None):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.code = code


def decode_cuda_version(value: int) -> str:
    """NVML's CUDA driver version integer (12040) as "12.4"."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def read_inventory() -> NvmlInventory:
    """Initialise NVML once, read driver and every device, shut it down; raise NvmlUnavailable on failure."""
    pynvml = load_pynvml()
    if pynvml is None:
        raise NvmlUnavailable("pynvml-missing", "the pynvml module (package nvidia-ml-py) is not importable")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        code = getattr(exc, "value", None)
        reason = "library-missing" if code == NVML_ERROR_LIBRARY_NOT_FOUND else "init-failed"
        raise NvmlUnavailable(reason, _nvml_text(exc), code) from None
    try:
        driver = _optional(pynvml, pynvml.nvmlSystemGetDriverVersion)
        cuda = _optional(pynvml, pynvml.nvmlSystemGetCudaDriverVersion)
        inventory = NvmlInventory(driver_version=None if driver is None else str(driver),
                                  cuda_driver_version=None if cuda is None else decode_cuda_version(int(cuda)))
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            uuid = _optional(pynvml, pynvml.nvmlDeviceGetUUID, handle)
            inventory.devices.append(NvmlDevice(
                index=index, name=str(pynvml.nvmlDeviceGetName(handle)), major=int(major), minor=int(minor),
                memory_total=int(memory.total), memory_free=int(memory.free),
                uuid=None if uuid is None else str(uuid)))
        return inventory
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable("query-failed", _nvml_text(exc), getattr(exc, "value", None)) from None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _optional(pynvml, function, *args):
    """A query some drivers lack or refuse: None instead of failing the whole inventory."""
    try:
        return function(*args)
    except pynvml.NVMLError:
        return None


def _nvml_text(exc: Exception) -> str:
    try:
        return str(exc)
    except Exception:  # pynvml asks the library for the text; a broken library can fail here too
        return f"NVML error {getattr(exc, 'value', '?')}"
