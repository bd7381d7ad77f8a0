"""A scripted NVML in Python, behind the agent's NVML port (operator/gpuhealth/agent/nvml_port.py).

For the unit tests of cases the C fake (devkit/fakenvml) reaches only with a new scenario verb: one
call failing at one point of a sample, a field the driver does not know, a value newer than the
agent's tables, a binding without a function. Every GPU answers as a healthy PCIe H100 by default;
a test scripts one call of one GPU with :meth:`ScriptedNvml.script` (a value, an exception to raise,
or a function of the call's arguments). Errors are pynvml's own classes, so the readers' ``except``
clauses are the production ones. End-to-end behaviour stays tested on the C fake through pynvml.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpuhealth.agent.nvml_port import EventData, EventSet, FieldValue, Handle, PciInfo

FI_RECOVERY_ACTION = 230
_VALUE_TYPE_ULL = 3


@dataclass(frozen=True)
class ScriptedHandle:
    """A GPU's handle: opaque to the agent, its index to the fake."""

    index: int


@dataclass(frozen=True)
class ScriptedPciInfo:
    busId: str


@dataclass(frozen=True)
class ScriptedNumber:
    ullVal: int = 0
    sllVal: int = 0
    uiVal: int = 0


@dataclass(frozen=True)
class ScriptedField:
    nvmlReturn: int
    valueType: int = _VALUE_TYPE_ULL
    value: ScriptedNumber = ScriptedNumber()


def nvml_error(code: int) -> pynvml.NVMLError:
    """The pynvml exception NVML's return code ``code`` raises (its per-code subclass)."""
    return pynvml.NVMLError(code)


@dataclass
class ScriptedNvml:
    """``gpus`` healthy GPUs; ``fields[(index, fieldId)]`` is a field's value, or its NVML return code
    when scripted with :meth:`field_fails`; ``calls`` records each call's name, in order."""

    gpus: int = 2
    fields: dict[tuple[int, int], int] = field(default_factory=dict)
    field_errors: dict[tuple[int, int], int] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    _scripts: dict[tuple[str, int | None], Any] = field(default_factory=dict)

    def script(self, name: str, answer: object, gpu: int | None = None) -> None:
        """From now on ``name`` (of GPU ``gpu``, or of any) answers ``answer``: an exception is raised,
        a callable is called with the call's arguments, anything else is returned."""
        self._scripts[(name, gpu)] = answer

    def unscript(self, name: str, gpu: int | None = None) -> None:
        self._scripts.pop((name, gpu), None)

    def field_fails(self, gpu: int, field_id: int, code: int) -> None:
        self.field_errors[(gpu, field_id)] = code

    def _answer(self, name: str, handle: Handle | None, default: Callable[[], Any], *args: object) -> Any:
        self.calls.append(name)
        index = handle.index if isinstance(handle, ScriptedHandle) else None
        for key in ((name, index), (name, None)):
            if key in self._scripts:
                answer = self._scripts[key]
                if isinstance(answer, BaseException):
                    raise answer
                return answer(*args) if callable(answer) else answer
        return default()

    @staticmethod
    def _absent() -> Any:
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # ---- the Nvml port -------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._answer("nvmlInit", None, lambda: None)

    def nvmlShutdown(self) -> None:
        self._answer("nvmlShutdown", None, lambda: None)

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        result: str = self._answer("nvmlSystemGetDriverVersion", None, lambda: "570.86.15")
        return result

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return int(self._answer("nvmlSystemGetCudaDriverVersion_v2", None, lambda: 12080))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return int(self._answer("nvmlSystemGetCudaDriverVersion", None, lambda: 12080))

    def nvmlDeviceGetCount(self) -> int:
        return int(self._answer("nvmlDeviceGetCount", None, lambda: self.gpus))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        handle = ScriptedHandle(index)
        result: Handle = self._answer("nvmlDeviceGetHandleByIndex", handle, lambda: handle, index)
        return result

    def nvmlDeviceGetUUID(self, handle: Handle) -> str | bytes:
        result: str = self._answer("nvmlDeviceGetUUID", handle, lambda: f"GPU-scripted-{self._index(handle)}")
        return result

    def nvmlDeviceGetName(self, handle: Handle) -> str | bytes:
        result: str = self._answer("nvmlDeviceGetName", handle, lambda: "NVIDIA H100 PCIe")
        return result

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> PciInfo:
        bus = f"00000000:{0x18 + self._index(handle):02X}:00.0"
        result: PciInfo = self._answer("nvmlDeviceGetPciInfo", handle, lambda: ScriptedPciInfo(bus))
        return result

    def nvmlDeviceGetTemperatureThreshold(self, handle: Handle, threshold: int) -> int:
        shutdown = threshold == pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
        return int(self._answer("nvmlDeviceGetTemperatureThreshold", handle, lambda: 92 if shutdown else 87, threshold))

    def nvmlDeviceGetMigMode(self, handle: Handle) -> Sequence[int]:
        result: Sequence[int] = self._answer("nvmlDeviceGetMigMode", handle, lambda: [0, 0])
        return result

    def nvmlDeviceGetEccMode(self, handle: Handle) -> Sequence[int]:
        result: Sequence[int] = self._answer("nvmlDeviceGetEccMode", handle, lambda: [1, 1])
        return result

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, error_type: int, counter_type: int) -> int:
        return int(self._answer("nvmlDeviceGetTotalEccErrors", handle, lambda: 0, error_type, counter_type))

    def nvmlDeviceGetRetiredPages(self, handle: Handle, cause: int) -> Sequence[int]:
        result: Sequence[int] = self._answer("nvmlDeviceGetRetiredPages", handle, lambda: [], cause)
        return result

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Handle) -> int:
        return int(self._answer("nvmlDeviceGetRetiredPagesPendingStatus", handle, lambda: 0))

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> Sequence[int]:
        result: Sequence[int] = self._answer("nvmlDeviceGetRemappedRows", handle, lambda: [0, 0, 0, 0])
        return result

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        return int(self._answer("nvmlDeviceGetTemperature", handle, lambda: 35, sensor))

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        return int(self._answer("nvmlDeviceGetPowerUsage", handle, lambda: 120_000))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        return int(self._answer("nvmlDeviceGetCurrentClocksEventReasons", handle, lambda: 0))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Handle) -> int:
        return int(self._answer("nvmlDeviceGetCurrentClocksThrottleReasons", handle, lambda: 0))

    def nvmlDeviceGetFieldValues(
        self, handle: Handle, field_ids: Sequence[int | tuple[int, int]]
    ) -> Sequence[FieldValue]:
        index = self._index(handle)

        def values() -> list[ScriptedField]:
            out = []
            for requested in field_ids:
                field_id = requested[0] if isinstance(requested, tuple) else requested
                if (index, field_id) in self.field_errors:
                    out.append(ScriptedField(self.field_errors[(index, field_id)]))
                elif field_id == FI_RECOVERY_ACTION or (index, field_id) in self.fields:
                    raw = self.fields.get((index, field_id), 0)
                    out.append(ScriptedField(pynvml.NVML_SUCCESS, value=ScriptedNumber(ullVal=raw)))
                else:
                    out.append(ScriptedField(pynvml.NVML_ERROR_NOT_SUPPORTED))
            return out

        result: Sequence[FieldValue] = self._answer("nvmlDeviceGetFieldValues", handle, values, field_ids)
        return result

    def nvmlEventSetCreate(self) -> EventSet:
        result: EventSet = self._answer("nvmlEventSetCreate", None, object)
        return result

    def nvmlEventSetFree(self, event_set: EventSet) -> None:
        self._answer("nvmlEventSetFree", None, lambda: None, event_set)

    def nvmlEventSetWait(self, event_set: EventSet, timeout_ms: int) -> EventData:
        result: EventData = self._answer(
            "nvmlEventSetWait", None, lambda: self._raise(pynvml.NVML_ERROR_TIMEOUT), event_set, timeout_ms
        )
        return result

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        return int(self._answer("nvmlDeviceGetSupportedEventTypes", handle, lambda: 0))

    def nvmlDeviceRegisterEvents(self, handle: Handle, event_types: int, event_set: EventSet) -> None:
        self._answer("nvmlDeviceRegisterEvents", handle, lambda: None, event_types, event_set)

    def nvmlDeviceGetNvLinkCapability(self, handle: Handle, link: int, capability: int) -> int:
        return int(self._answer("nvmlDeviceGetNvLinkCapability", handle, self._absent, link, capability))

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Handle, link: int, counter: int) -> int:
        return int(self._answer("nvmlDeviceGetNvLinkErrorCounter", handle, self._absent, link, counter))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Handle, link: int) -> int:
        return int(self._answer("nvmlDeviceGetNvLinkRemoteDeviceType", handle, self._absent, link))

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        return int(self._answer("nvmlDeviceGetNvLinkState", handle, self._absent, link))

    def nvmlDeviceGetP2PStatus(self, handle: Handle, peer: Handle, p2p_index: int) -> int:
        return int(self._answer("nvmlDeviceGetP2PStatus", handle, self._absent, peer, p2p_index))

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Handle, info: object) -> None:
        self._answer("nvmlDeviceGetGpuFabricInfoV", handle, self._absent, info)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Handle) -> int:
        return int(self._answer("nvmlDeviceGetCurrPcieLinkWidth", handle, lambda: 16))

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Handle) -> int:
        return int(self._answer("nvmlDeviceGetMaxPcieLinkWidth", handle, lambda: 16))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Handle) -> int:
        return int(self._answer("nvmlDeviceGetCurrPcieLinkGeneration", handle, lambda: 5))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Handle) -> int:
        return int(self._answer("nvmlDeviceGetMaxPcieLinkGeneration", handle, lambda: 5))

    def nvmlDeviceGetPcieReplayCounter(self, handle: Handle) -> int:
        return int(self._answer("nvmlDeviceGetPcieReplayCounter", handle, lambda: 0))

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:
        return int(self._answer("nvmlDeviceGetMaxMigDeviceCount", handle, lambda: 0))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> Handle:
        result: Handle = self._answer("nvmlDeviceGetMigDeviceHandleByIndex", handle, self._absent, index)
        return result

    def nvmlDeviceGetGpuInstanceId(self, handle: Handle) -> int:
        return int(self._answer("nvmlDeviceGetGpuInstanceId", handle, self._absent))

    def nvmlDeviceGetComputeInstanceId(self, handle: Handle) -> int:
        return int(self._answer("nvmlDeviceGetComputeInstanceId", handle, self._absent))

    def nvmlDeviceValidateInforom(self, handle: Handle) -> None:
        self._answer("nvmlDeviceValidateInforom", handle, lambda: None)  # valid unless scripted to raise

    # ---- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _index(handle: Handle) -> int:
        assert isinstance(handle, ScriptedHandle), f"not a scripted handle: {handle!r}"
        return handle.index

    @staticmethod
    def _raise(code: int) -> Any:
        raise nvml_error(code)
