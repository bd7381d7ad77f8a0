"""Thin decoders of NVML answers, shared by the sampler and the event loop (nvml_source.py).

No state here: loading the library, turning NVML's bytes, handles and field values into plain
Python, and the event masks the agent registers for.
"""

from __future__ import annotations

import ctypes
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpuhealth.agent.model import DeviceFacts
from gpuhealth.agent.nvml_port import Handle, Nvml
from gpuhealth.api.recovery import RecoveryAction

log = logging.getLogger("gpuhealth.agent.nvml_source")

EVENT_XID = int(getattr(pynvml, "nvmlEventTypeXidCriticalError", 0x8))
EVENT_SBE = int(getattr(pynvml, "nvmlEventTypeSingleBitEccError", 0x1))
EVENT_DBE = int(getattr(pynvml, "nvmlEventTypeDoubleBitEccError", 0x2))
# NVML 13: the GPU became unusable / its required recovery action changed. Older pynvml lacks the
# names; the values are NVML's (nvml.h), and older drivers simply do not offer them.
EVENT_UNAVAILABLE = int(getattr(pynvml, "nvmlEventTypeGpuUnavailableError", 0x4000))
EVENT_RECOVERY = int(getattr(pynvml, "nvmlEventTypeGpuRecoveryAction", 0x8000))
_FI_RECOVERY_ACTION = int(getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230))
_VALUE_TYPE_ULL = 3
_VALUE_TYPE_SLL = 4


def load_nvml_library(path: str) -> None:
    """Make pynvml use the NVML shared library at ``path``.

    pynvml hard-codes ``CDLL("libnvidia-ml.so.1")`` on first init but only when its module
    global ``nvmlLib`` is unset, so preloading that global (under pynvml's own lock, and
    dropping its cache of resolved function pointers) is the least invasive hook. Used for
    drivers installed off the loader path and for the fake NVML in tests. Raises OSError.
    """
    lib = ctypes.CDLL(path)
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()


def nvml_text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace").rstrip("\x00")
    return str(value)


def handle_address(handle: object) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value  # type: ignore[arg-type]
    except (TypeError, ctypes.ArgumentError):
        return None


def field_int(value: Any) -> int:
    """The integer an ``nvmlFieldValue_t`` holds, by its value type."""
    value_type = int(value.valueType)
    return (
        int(value.value.ullVal)
        if value_type == _VALUE_TYPE_ULL
        else int(value.value.sllVal)
        if value_type == _VALUE_TYPE_SLL
        else int(value.value.uiVal)
    )


def field_ints(nvml: Nvml, handle: Handle, ids: list[tuple[int, int]]) -> list[int | None]:
    """Field values by ``(fieldId, scopeId)`` in one call; None for each one NVML does not offer (drivers
    that predate a field answer "invalid argument" or "not supported" for it). A lost GPU raises."""
    out: list[int | None] = []
    for value in nvml.nvmlDeviceGetFieldValues(handle, ids):
        ret = int(value.nvmlReturn)
        if ret == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise pynvml.NVMLError(ret)
        out.append(field_int(value) if ret == pynvml.NVML_SUCCESS else None)
    return out


def recovery_action(nvml: Nvml, handle: Handle) -> RecoveryAction | None:
    values = nvml.nvmlDeviceGetFieldValues(handle, [_FI_RECOVERY_ACTION])
    value = values[0]
    ret = int(value.nvmlReturn)
    if ret in (pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_NOT_SUPPORTED):
        # Drivers that predate the field answer "invalid argument" for its id.
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    if ret != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(ret)
    raw = field_int(value)
    action = RecoveryAction.from_nvml(raw)
    if action is None:
        log.warning("GPU recovery action %d is newer than this agent knows; omitted (unknown)", raw)
    return action


@dataclass(frozen=True)
class FactRead:
    """How the agent reads one fact of api/device_facts.py GpuFacts: the call, and how often. nvml_source.py
    asks it through its usual NotSupported / lost handling (a fact NVML refuses is named by its report key
    in ``unsupported``); between reads the last answer stands."""

    read: Callable[[Nvml, Handle], object]
    every_s: float = 0.0  # 0: every sample


def inforom_corrupt(nvml: Nvml, handle: Handle) -> bool:
    """nvmlDeviceValidateInforom: the InfoROM read back from flash and its checksums verified; corrupt on
    NVML_ERROR_CORRUPTED_INFOROM (any other error is the query's: unsupported, lost, or failed)."""
    try:
        nvml.nvmlDeviceValidateInforom(handle)
    except pynvml.NVMLError_CorruptedInforom:
        return True
    return False


# Each GpuFacts field's read, by attribute (tests/unit/agent/test_agent_nvml_scripted.py holds the two to
# each other). The InfoROM is read from flash: at most hourly, as DCGM's InfoROM health watch does
# (github.com/NVIDIA/DCGM modules/health/DcgmHealthWatch.cpp SetInforom: an update interval of at least 1 h).
GPU_FACT_READS: dict[str, FactRead] = {"inforom_corrupt": FactRead(inforom_corrupt, every_s=3600.0)}


class Lost(Exception):
    """NVML said GPU_IS_LOST for this device; abandon the rest of its sample."""


@dataclass
class Device:
    index: int
    handle: Any = None
    facts: DeviceFacts = field(default_factory=lambda: DeviceFacts(index=0))
    thresholds: tuple[int | None, int | None] = (None, None)
    static_unsupported: set[str] = field(default_factory=set)
    warned: set[str] = field(default_factory=set)
    # NVML's GpuUnavailableError event said so: the GPU reports lost for the rest of this NVML
    # session (a fresh nvmlInit rediscovers it), even if some queries still answer.
    unavailable: bool = False
    # The fabric (nvml_fabric.py): the NVLinks this GPU has (found once per handle), the PCIe
    # generation last read while it was busy, and the throttle counters of the last window.
    links: tuple[int, ...] | None = None
    # Parts of the fabric reads this GPU answered NOT_SUPPORTED for, not asked again on this handle
    # (a refused call costs an exception per link and sample).
    absent: set[str] = field(default_factory=set)
    pcie_generation: int | None = None
    # GpuFacts read less often than every sample (nvml_calls.GPU_FACT_READS): attribute -> when it was
    # read (monotonic), its value, whether NVML refused it. Emptied with a new handle.
    fact_reads: dict[str, tuple[float, object, bool]] = field(default_factory=dict)
    throttle_history: deque[tuple[float, tuple[int | None, ...]]] = field(default_factory=deque)
