"""The NVML port: the NVML calls the agent makes, as a typed Protocol, and the adapter over pynvml.

Why a port: the agent's NVML readers (nvml_source.py, nvml_events.py, nvml_fabric.py, nvml_mig.py,
nvml_calls.py) take an :class:`Nvml` instead of calling ``pynvml`` directly, so a unit test can script
NVML in Python (a GPU lost mid-sample, a field the driver lacks, a value newer than the agent's
tables) where the C fake (devkit/fakenvml) would need a new scenario verb. End-to-end runs keep the
C fake under the real pynvml through :data:`PYNVML`.

What stays pynvml's: the constants (``pynvml.NVML_*``), the error classes (a scripted NVML raises
``pynvml.NVMLError_*`` like the real one, so the readers' ``except`` clauses are the production
ones), ctypes structures the caller allocates (GPU fabric info v3), and loading the library
(``load_nvml_library`` configures pynvml itself).

The Protocol declares exactly the calls the agent makes (tests/unit/agent/test_nvml_port.py parses
the readers and compares, and checks every member exists in pynvml). Handles and event sets are
opaque: only NVML looks into them. The names are NVML's, so each member reads as the C function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeAlias

import pynvml

__all__ = ["PYNVML", "EventData", "EventSet", "FieldNumber", "FieldValue", "Handle", "Nvml", "PciInfo", "PynvmlNvml"]

# Opaque to the agent: a device (GPU or MIG device) handle, an event set.
Handle: TypeAlias = object
EventSet: TypeAlias = object


class PciInfo(Protocol):
    """The part of ``nvmlPciInfo_t`` the agent reads."""

    @property
    def busId(self) -> str | bytes: ...


class FieldNumber(Protocol):
    """``nvmlValue_t``: which member holds the number depends on the value type."""

    @property
    def ullVal(self) -> int: ...

    @property
    def sllVal(self) -> int: ...

    @property
    def uiVal(self) -> int: ...


class FieldValue(Protocol):
    """The part of ``nvmlFieldValue_t`` the agent reads (one per requested field id)."""

    @property
    def nvmlReturn(self) -> int: ...

    @property
    def valueType(self) -> int: ...

    @property
    def value(self) -> FieldNumber: ...


class EventData(Protocol):
    """The part of ``nvmlEventData_t`` the agent reads (its instance ids are read where present)."""

    @property
    def eventType(self) -> int: ...

    @property
    def device(self) -> Handle: ...

    @property
    def eventData(self) -> int: ...


class Nvml(Protocol):
    """The NVML functions the agent calls, by their pynvml names and signatures. Each raises
    ``pynvml.NVMLError`` (its per-code subclasses) as NVML answers; a function the driver or binding
    lacks raises ``NVMLError_FunctionNotFound``."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlSystemGetCudaDriverVersion_v2(self) -> int: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle: ...
    def nvmlDeviceGetUUID(self, handle: Handle) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Handle) -> str | bytes: ...
    def nvmlDeviceGetPciInfo(self, handle: Handle) -> PciInfo: ...
    def nvmlDeviceGetTemperatureThreshold(self, handle: Handle, threshold: int) -> int: ...
    def nvmlDeviceGetMigMode(self, handle: Handle) -> Sequence[int]: ...
    def nvmlDeviceGetEccMode(self, handle: Handle) -> Sequence[int]: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, error_type: int, counter_type: int) -> int: ...
    def nvmlDeviceGetRetiredPages(self, handle: Handle, cause: int) -> Sequence[int]: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Handle) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> Sequence[int]: ...
    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int: ...
    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int: ...
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Handle) -> int: ...
    def nvmlDeviceGetFieldValues(
        self, handle: Handle, field_ids: Sequence[int | tuple[int, int]]
    ) -> Sequence[FieldValue]: ...
    def nvmlEventSetCreate(self) -> EventSet: ...
    def nvmlEventSetFree(self, event_set: EventSet) -> None: ...
    def nvmlEventSetWait(self, event_set: EventSet, timeout_ms: int) -> EventData: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int: ...
    def nvmlDeviceRegisterEvents(self, handle: Handle, event_types: int, event_set: EventSet) -> None: ...
    def nvmlDeviceGetNvLinkCapability(self, handle: Handle, link: int, capability: int) -> int: ...
    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Handle, link: int, counter: int) -> int: ...
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Handle, link: int) -> int: ...
    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int: ...
    def nvmlDeviceGetP2PStatus(self, handle: Handle, peer: Handle, p2p_index: int) -> int: ...
    def nvmlDeviceGetGpuFabricInfoV(self, handle: Handle, info: object) -> None: ...
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Handle) -> int: ...
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Handle) -> int: ...
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Handle) -> int: ...
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Handle) -> int: ...
    def nvmlDeviceGetPcieReplayCounter(self, handle: Handle) -> int: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> Handle: ...
    def nvmlDeviceGetGpuInstanceId(self, handle: Handle) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, handle: Handle) -> int: ...
    def nvmlDeviceValidateInforom(self, handle: Handle) -> None: ...


def _fn(name: str) -> Callable[..., Any]:
    """pynvml's wrapper ``name``; FunctionNotFound (as NVML itself says it) when this pynvml lacks it."""
    fn: Callable[..., Any] | None = getattr(pynvml, name, None)
    if fn is None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    return fn


class PynvmlNvml:
    """The production :class:`Nvml`: each call is pynvml's, unchanged (looked up at call time, so
    ``load_nvml_library`` and tests that patch pynvml keep working)."""

    def nvmlInit(self) -> None:
        _fn("nvmlInit")()

    def nvmlShutdown(self) -> None:
        _fn("nvmlShutdown")()

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        result: str | bytes = _fn("nvmlSystemGetDriverVersion")()
        return result

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        result: int = _fn("nvmlSystemGetCudaDriverVersion_v2")()
        return result

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        result: int = _fn("nvmlSystemGetCudaDriverVersion")()
        return result

    def nvmlDeviceGetCount(self) -> int:
        result: int = _fn("nvmlDeviceGetCount")()
        return result

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        result: Handle = _fn("nvmlDeviceGetHandleByIndex")(index)
        return result

    def nvmlDeviceGetUUID(self, handle: Handle) -> str | bytes:
        result: str | bytes = _fn("nvmlDeviceGetUUID")(handle)
        return result

    def nvmlDeviceGetName(self, handle: Handle) -> str | bytes:
        result: str | bytes = _fn("nvmlDeviceGetName")(handle)
        return result

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> PciInfo:
        result: PciInfo = _fn("nvmlDeviceGetPciInfo")(handle)
        return result

    def nvmlDeviceGetTemperatureThreshold(self, handle: Handle, threshold: int) -> int:
        result: int = _fn("nvmlDeviceGetTemperatureThreshold")(handle, threshold)
        return result

    def nvmlDeviceGetMigMode(self, handle: Handle) -> Sequence[int]:
        result: Sequence[int] = _fn("nvmlDeviceGetMigMode")(handle)
        return result

    def nvmlDeviceGetEccMode(self, handle: Handle) -> Sequence[int]:
        result: Sequence[int] = _fn("nvmlDeviceGetEccMode")(handle)
        return result

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, error_type: int, counter_type: int) -> int:
        result: int = _fn("nvmlDeviceGetTotalEccErrors")(handle, error_type, counter_type)
        return result

    def nvmlDeviceGetRetiredPages(self, handle: Handle, cause: int) -> Sequence[int]:
        result: Sequence[int] = _fn("nvmlDeviceGetRetiredPages")(handle, cause)
        return result

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Handle) -> int:
        result: int = _fn("nvmlDeviceGetRetiredPagesPendingStatus")(handle)
        return result

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> Sequence[int]:
        result: Sequence[int] = _fn("nvmlDeviceGetRemappedRows")(handle)
        return result

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        result: int = _fn("nvmlDeviceGetTemperature")(handle, sensor)
        return result

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        result: int = _fn("nvmlDeviceGetPowerUsage")(handle)
        return result

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        result: int = _fn("nvmlDeviceGetCurrentClocksEventReasons")(handle)
        return result

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Handle) -> int:
        result: int = _fn("nvmlDeviceGetCurrentClocksThrottleReasons")(handle)
        return result

    def nvmlDeviceGetFieldValues(
        self, handle: Handle, field_ids: Sequence[int | tuple[int, int]]
    ) -> Sequence[FieldValue]:
        result: Sequence[FieldValue] = _fn("nvmlDeviceGetFieldValues")(handle, field_ids)
        return result

    def nvmlEventSetCreate(self) -> EventSet:
        result: EventSet = _fn("nvmlEventSetCreate")()
        return result

    def nvmlEventSetFree(self, event_set: EventSet) -> None:
        _fn("nvmlEventSetFree")(event_set)

    def nvmlEventSetWait(self, event_set: EventSet, timeout_ms: int) -> EventData:
        result: EventData = _fn("nvmlEventSetWait")(event_set, timeout_ms)
        return result

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        result: int = _fn("nvmlDeviceGetSupportedEventTypes")(handle)
        return result

    def nvmlDeviceRegisterEvents(self, handle: Handle, event_types: int, event_set: EventSet) -> None:
        _fn("nvmlDeviceRegisterEvents")(handle, event_types, event_set)

    def nvmlDeviceGetNvLinkCapability(self, handle: Handle, link: int, capability: int) -> int:
        result: int = _fn("nvmlDeviceGetNvLinkCapability")(handle, link, capability)
        return result

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Handle, link: int, counter: int) -> int:
        result: int = _fn("nvmlDeviceGetNvLinkErrorCounter")(handle, link, counter)
        return result

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Handle, link: int) -> int:
        result: int = _fn("nvmlDeviceGetNvLinkRemoteDeviceType")(handle, link)
        return result

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        result: int = _fn("nvmlDeviceGetNvLinkState")(handle, link)
        return result

    def nvmlDeviceGetP2PStatus(self, handle: Handle, peer: Handle, p2p_index: int) -> int:
        result: int = _fn("nvmlDeviceGetP2PStatus")(handle, peer, p2p_index)
        return result

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Handle, info: object) -> None:
        _fn("nvmlDeviceGetGpuFabricInfoV")(handle, info)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Handle) -> int:
        result: int = _fn("nvmlDeviceGetCurrPcieLinkWidth")(handle)
        return result

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Handle) -> int:
        result: int = _fn("nvmlDeviceGetMaxPcieLinkWidth")(handle)
        return result

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Handle) -> int:
        result: int = _fn("nvmlDeviceGetCurrPcieLinkGeneration")(handle)
        return result

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Handle) -> int:
        result: int = _fn("nvmlDeviceGetMaxPcieLinkGeneration")(handle)
        return result

    def nvmlDeviceGetPcieReplayCounter(self, handle: Handle) -> int:
        result: int = _fn("nvmlDeviceGetPcieReplayCounter")(handle)
        return result

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:
        result: int = _fn("nvmlDeviceGetMaxMigDeviceCount")(handle)
        return result

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> Handle:
        result: Handle = _fn("nvmlDeviceGetMigDeviceHandleByIndex")(handle, index)
        return result

    def nvmlDeviceGetGpuInstanceId(self, handle: Handle) -> int:
        result: int = _fn("nvmlDeviceGetGpuInstanceId")(handle)
        return result

    def nvmlDeviceGetComputeInstanceId(self, handle: Handle) -> int:
        result: int = _fn("nvmlDeviceGetComputeInstanceId")(handle)
        return result

    def nvmlDeviceValidateInforom(self, handle: Handle) -> None:
        _fn("nvmlDeviceValidateInforom")(handle)


PYNVML: Nvml = PynvmlNvml()
"""The default port of every NVML reader: the real pynvml."""
