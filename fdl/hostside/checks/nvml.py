"""Thin access to NVML through NVIDIA's own bindings (pynvml, from nvidia-ml-py).

Host-side (fdl/hostside/): standard library and pynvml only. pynvml is the installed one when this Python has
it, else a packed copy shipped as this package's sibling `..pynvml_packed` (the flodl.fdl collection puts one
beside the check library on every host); this file never needs to know which deployment it is in.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TypeVar

T = TypeVar("T")


def load_pynvml() -> Any:
    """pynvml: the installed module, else the packed sibling `..pynvml_packed` shipped beside this package;
    None when neither is there."""
    try:
        import pynvml
    except ImportError:
        try:
            from ..pynvml_packed import load
        except (ImportError, ValueError):  # no sibling (ValueError: no parent package, before Python 3.9)
            return None
        pynvml = load()
    return pynvml


def pynvml_hint() -> str:
    """What to do about a missing pynvml (wherever this runs)."""
    return ("install nvidia-ml-py for the Python that runs the probe (pip install nvidia-ml-py); the flodl.fdl "
            "collection carries its own copy to every host it probes")


def device_count() -> int | None:
    """Number of GPUs NVML reports; None when NVML is unavailable or fails."""
    return _query_or_none(lambda pynvml: int(pynvml.nvmlDeviceGetCount()))


def device_capabilities() -> list[tuple[int, int]] | None:
    """CUDA compute capability (major, minor) of every GPU NVML sees; None when NVML is unavailable."""
    def read(pynvml: Any) -> list[tuple[int, int]]:
        count = int(pynvml.nvmlDeviceGetCount())
        found = []
        for i in range(count):
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(i))
            found.append((int(major), int(minor)))
        return found
    return _query_or_none(read)


def _query_or_none(read: Callable[[Any], T]) -> T | None:
    """`read(pynvml)` inside an NVML session; None when NVML is unavailable or the query fails."""
    try:
        with nvml_session() as pynvml:
            try:
                return read(pynvml)
            except pynvml.NVMLError:
                return None
    except NvmlUnavailable:
        return None


# NVML return codes fdl explains to a person (nvml.h); pynvml exposes them as NVMLError.value.
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18


@dataclass
class GpuHealth:
    """One GPU's health readings; a reading is None when its query was unsupported or failed.

    `unsupported` lists the query groups NVML answered NOT_SUPPORTED (the
    feature does not exist on this board: ECC on a GeForce, MIG before
    Ampere); `failed` maps the others that failed to NVML's error text.
    """

    persistence: bool | None = None
    ecc_current: bool | None = None
    ecc_pending: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    retired_sbe: int | None = None  # pages retired after multiple single-bit errors
    retired_dbe: int | None = None  # pages retired after a double-bit error
    retired_pending: bool | None = None  # a retirement waits for the next reset
    remapped_corrected: int | None = None
    remapped_uncorrected: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None  # the most this GPU can do in this slot
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    pstate: int | None = None  # 0 = full performance ... 15 = idle
    clock_reasons: int | None = None  # NVML's clock event (throttle) reason bit mask
    mig_current: bool | None = None
    mig_pending: bool | None = None
    mig_instances: list[str] = field(default_factory=list)  # MIG device UUIDs
    minor_number: int | None = None  # N of /dev/nvidiaN
    unsupported: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


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
    health: GpuHealth | None = None

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}"


@dataclass
class UnreachableDevice:
    """A GPU NVML counts but cannot open (GPU_IS_LOST: fallen off the bus; NO_PERMISSION: hidden by a cgroup)."""

    index: int
    error: str
    code: int | None


@dataclass
class NvmlInventory:
    """What NVML says about this host: driver, CUDA driver version, devices."""

    driver_version: str | None
    cuda_driver_version: str | None  # "12.4", decoded from NVML's 12040
    devices: list[NvmlDevice] = field(default_factory=list)
    count: int = 0  # what NVML counts, unreachable devices included
    unreachable: list[UnreachableDevice] = field(default_factory=list)


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


@contextmanager
def nvml_session() -> Iterator[Any]:
    """NVML initialised for the with-block and shut down after it; yields pynvml, raises NvmlUnavailable."""
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
        yield pynvml
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def read_inventory() -> NvmlInventory:
    """Initialise NVML once, read driver and every device, shut it down; raise NvmlUnavailable on failure."""
    with nvml_session() as pynvml:
        try:
            return _read_inventory(pynvml)
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable("query-failed", _nvml_text(exc), getattr(exc, "value", None)) from None


def _read_inventory(pynvml: Any) -> NvmlInventory:
    """Driver, CUDA driver version and every device, from an open NVML session."""
    driver = _optional(pynvml, pynvml.nvmlSystemGetDriverVersion)
    cuda = _optional(pynvml, pynvml.nvmlSystemGetCudaDriverVersion)
    inventory = NvmlInventory(driver_version=None if driver is None else str(driver),
                              cuda_driver_version=None if cuda is None else decode_cuda_version(int(cuda)))
    inventory.count = int(pynvml.nvmlDeviceGetCount())
    for index in range(inventory.count):
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as exc:
            inventory.unreachable.append(UnreachableDevice(index, _nvml_text(exc), getattr(exc, "value", None)))
            continue
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        uuid = _optional(pynvml, pynvml.nvmlDeviceGetUUID, handle)
        inventory.devices.append(NvmlDevice(
            index=index, name=str(pynvml.nvmlDeviceGetName(handle)), major=int(major), minor=int(minor),
            memory_total=int(memory.total), memory_free=int(memory.free),
            uuid=None if uuid is None else str(uuid), health=read_health(pynvml, handle)))
    return inventory


def read_health(pynvml: Any, handle: Any) -> GpuHealth:
    """Every health reading of one GPU; a query that fails is noted in the result, never raised."""
    health = GpuHealth()

    def query(name: str, read: Callable[[], None]) -> None:
        try:
            read()
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                health.unsupported.append(name)
            else:
                health.failed[name] = _nvml_text(exc)

    def persistence() -> None:
        health.persistence = bool(pynvml.nvmlDeviceGetPersistenceMode(handle))

    def ecc() -> None:
        current, pending = pynvml.nvmlDeviceGetEccMode(handle)
        health.ecc_current, health.ecc_pending = bool(current), bool(pending)

    def ecc_errors() -> None:
        uncorrected = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        health.ecc_uncorrected_volatile = int(pynvml.nvmlDeviceGetTotalEccErrors(
            handle, uncorrected, pynvml.NVML_VOLATILE_ECC))
        health.ecc_uncorrected_aggregate = int(pynvml.nvmlDeviceGetTotalEccErrors(
            handle, uncorrected, pynvml.NVML_AGGREGATE_ECC))

    def retired_pages() -> None:
        health.retired_sbe = len(pynvml.nvmlDeviceGetRetiredPages(
            handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS))
        health.retired_dbe = len(pynvml.nvmlDeviceGetRetiredPages(
            handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))
        health.retired_pending = bool(pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))

    def row_remap() -> None:
        corrected, uncorrected, pending, failure = pynvml.nvmlDeviceGetRemappedRows(handle)
        health.remapped_corrected, health.remapped_uncorrected = int(corrected), int(uncorrected)
        health.remap_pending, health.remap_failure = bool(pending), bool(failure)

    def pcie() -> None:
        health.pcie_gen = int(pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle))
        health.pcie_gen_max = int(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))
        health.pcie_width = int(pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle))
        health.pcie_width_max = int(pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle))

    def pstate() -> None:
        health.pstate = int(pynvml.nvmlDeviceGetPerformanceState(handle))

    def clock_reasons() -> None:
        current = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)  # bindings before 12.535 lack it
        try:  # the current name; drivers before 535 only know the older "throttle" one
            if current is None:
                raise pynvml.NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
            health.clock_reasons = int(current(handle))
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) != NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
            health.clock_reasons = int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))

    def mig() -> None:
        current, pending = pynvml.nvmlDeviceGetMigMode(handle)
        health.mig_current, health.mig_pending = bool(current), bool(pending)
        if health.mig_current:
            for slot in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
                try:
                    instance = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                except pynvml.NVMLError as exc:
                    if getattr(exc, "value", None) == NVML_ERROR_NOT_FOUND:
                        continue  # an empty slot
                    raise
                health.mig_instances.append(str(pynvml.nvmlDeviceGetUUID(instance)))

    def minor_number() -> None:
        health.minor_number = int(pynvml.nvmlDeviceGetMinorNumber(handle))

    for name, read in (("persistence", persistence), ("ecc", ecc), ("ecc_errors", ecc_errors),
                       ("retired_pages", retired_pages), ("row_remap", row_remap), ("pcie", pcie),
                       ("pstate", pstate), ("clock_reasons", clock_reasons), ("mig", mig),
                       ("minor_number", minor_number)):
        query(name, read)
    return health


def _optional(pynvml: Any, function: Callable[..., Any], *args: Any) -> Any:
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
