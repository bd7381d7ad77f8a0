"""Typed view of a GPUNodeHealth report: the agent's facts (spec) and the operator's record (status)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from gpuhealth.api import fabric
from gpuhealth.api.device_facts import DEVICE_FACTS, GpuFacts
from gpuhealth.api.device_facts import MIG_DISABLED as MIG_DISABLED
from gpuhealth.api.device_facts import MIG_ENABLED as MIG_ENABLED
from gpuhealth.api.device_facts import MODE_UNSUPPORTED as MODE_UNSUPPORTED
from gpuhealth.api.device_facts import MODES as MODES
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.report_fabric import (
    Clocks,
    Fabric,
    FieldError,
    NicPort,
    NvLink,
    Pcie,
    parse_clocks,
    parse_fabric,
    parse_nics,
    parse_nvlink,
    parse_pcie,
)
from gpuhealth.api.timeutil import parse_time
from gpuhealth.api.wire import read_fields, wire

# Closed vocabularies of the report (the agent writes them; the CRD's enums are generated from them).
SourceName = Literal["nvml", "dcgm", "simulated"]  # spec.agent.sources[], spec.xidEvents[].source
SOURCES: tuple[str, ...] = get_args(SourceName)
# migMode's and eccMode's (spec.devices[]) are declared with the device's facts (api/device_facts.py).


__all__ = [
    "Clocks",
    "Device",
    "EccCounts",
    "Fabric",
    "MigDevice",
    "NicPort",
    "NvLink",
    "Pcie",
    "PodHold",
    "PodResources",
    "RemappedRows",
    "Report",
    "ReportError",
    "RetiredPages",
    "Temperature",
    "XidEvent",
    "parse_report",
]


class ReportError(ValueError):
    """A report that cannot be trusted; it becomes an Event and a metric, never an action."""


@dataclass(frozen=True, order=True)
class PodHold:
    """One container that the kubelet allocated a GPU or MIG device to (``spec.devices[].pods[]``,
    ``spec.devices[].migDevices[].pods[]``), as the agent read it from the pod-resources API.
    ``resource`` is the extended resource it came through (``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``)."""

    namespace: str
    name: str
    container: str
    resource: str


@dataclass(frozen=True)
class PodResources:
    """``spec.podResources``: whether the agent could read the kubelet's pod-resources API this pass.
    Unavailable: no device's ``pods`` is known (empty is not "no pods")."""

    available: bool
    error: str = ""


@dataclass(frozen=True)
class MigDevice:
    """One MIG device of a GPU (``spec.devices[].migDevices[]``), as the agent read it from NVML.

    ``index`` is NVML's MIG device index under the parent GPU; ``gpu_instance`` and
    ``compute_instance`` are the IDs NVML attributes XIDs with (see :meth:`Report.mig_device`).
    """

    index: int
    uuid: str = ""
    gpu_instance: int | None = None
    compute_instance: int | None = None
    profile: str = ""
    pods: tuple[PodHold, ...] = ()  # the containers holding it (sorted); see Report.pod_resources


_COUNT: Final = {"type": "integer", "minimum": 0}
_CELSIUS: Final = {"type": "integer", "minimum": 0, "maximum": 250}


@dataclass(frozen=True)
class EccCounts:
    """``spec.devices[].ecc``: the GPU's ECC error counts (nvmlDeviceGetTotalEccErrors)."""

    volatile_uncorrected: int | None = wire("volatileUncorrected", _COUNT)
    volatile_corrected: int | None = wire("volatileCorrected", _COUNT, dropped="corrected errors are no fault")
    aggregate_uncorrected: int | None = wire("aggregateUncorrected", _COUNT)
    aggregate_corrected: int | None = wire("aggregateCorrected", _COUNT, dropped="corrected errors are no fault")


_PAGES_HISTORY: Final = "history; pending retirement is the fault"
_ROWS_HISTORY: Final = "history; a pending remap or a failure is the fault"


@dataclass(frozen=True)
class RetiredPages:
    """``spec.devices[].retiredPages``: pages retired for ECC errors, and whether a retirement is pending."""

    single_bit_ecc: int | None = wire("singleBitEcc", _COUNT, dropped=_PAGES_HISTORY)
    double_bit_ecc: int | None = wire("doubleBitEcc", _COUNT, dropped=_PAGES_HISTORY)
    pending: bool | None = wire("pending", {"type": "boolean"})


@dataclass(frozen=True)
class RemappedRows:
    """``spec.devices[].remappedRows``: rows remapped (nvmlDeviceGetRemappedRows), a pending remap, a failure."""

    corrected: int | None = wire("corrected", _COUNT, dropped=_ROWS_HISTORY)
    uncorrected: int | None = wire("uncorrected", _COUNT, dropped=_ROWS_HISTORY)
    pending: bool | None = wire("pending", {"type": "boolean"})
    failure: bool | None = wire("failure", {"type": "boolean"})


@dataclass(frozen=True)
class Temperature:
    """``spec.devices[].temperature``: now, and the GPU's slowdown and shutdown thresholds."""

    current_c: int | None = wire("currentC", {**_CELSIUS, "minimum": -50})
    slowdown_c: int | None = wire("slowdownC", _CELSIUS)
    shutdown_c: int | None = wire("shutdownC", _CELSIUS, dropped="the slowdown threshold is the one judged")


# The objects of a GPU whose read fields the operator keeps as Device's own attributes: each its key under
# spec.devices[], the agent's DeviceFacts attribute holding it, and its type.
DEVICE_OBJECTS: Final[tuple[tuple[str, str, type], ...]] = (
    ("ecc", "ecc", EccCounts),
    ("retiredPages", "retired_pages", RetiredPages),
    ("remappedRows", "remapped_rows", RemappedRows),
    ("temperature", "temperature", Temperature),
)


@dataclass(frozen=True, kw_only=True)
class GpuObjects:
    """A GPU's structured facts that are one type on both sides: the agent's ``DeviceFacts`` fills them, the
    operator's :class:`Device` parses them (both extend this class). None (or empty): not reported."""

    mig_devices: tuple[MigDevice, ...] = ()  # only while MIG mode is Enabled and NVML lists instances
    # The fabric between GPUs (api/report_fabric.py).
    nvlink: NvLink | None = None
    fabric: Fabric | None = None
    pcie: Pcie | None = None
    clocks: Clocks | None = None
    # The containers the kubelet allocated the whole GPU to (sorted); see Report.pod_resources.
    pods: tuple[PodHold, ...] = ()


@dataclass(frozen=True)
class Device(GpuFacts, GpuObjects):
    """One GPU as the operator reads it. Its scalar facts are declared in api/device_facts.py (the READ
    ones are attributes here, or of :class:`~gpuhealth.api.device_facts.GpuFacts`) and parsed by type; its
    structured ones are :class:`GpuObjects`'."""

    index: int
    uuid: str = ""
    model: str = ""
    lost: bool = False
    ecc_volatile_uncorrected: int = 0
    ecc_aggregate_uncorrected: int = 0
    retired_pending: bool = False
    remap_pending: bool = False
    remap_failure: bool = False
    temperature_c: int | None = None
    slowdown_c: int | None = None
    clock_event_reasons: int = 0
    clock_events_since: dt.datetime | None = None
    recovery_action: RecoveryAction | None = None  # None: not read, or newer than api/recovery.py
    mig_mode: str = ""  # MODES; "" not read

    @property
    def label(self) -> str:
        """How events name a GPU: index and UUID."""
        return f"GPU {self.index} ({self.uuid})" if self.uuid else f"GPU {self.index}"

    @property
    def clock_reasons(self) -> tuple[str, ...]:
        """The clock-event reasons, one name per bit (0x8 HwSlowdown is its own: its cause is not given)."""
        return fabric.clock_reasons(self.clock_event_reasons)


@dataclass(frozen=True)
class XidEvent:
    """``spec.xidEvents[]``: one XID as the agent saw it (the agent fills this type; the operator parses it).
    ``source`` and ``detail`` are for humans: the operator does not read them (None when parsed)."""

    xid: int
    time: dt.datetime
    source: SourceName | None = None
    gpu: int | None = None
    uuid: str = ""  # "" : not known
    detail: str | None = None
    # The MIG instance NVML attributed the XID to (nvmlEventData_t), None when it attributed none.
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True)
class NvmlHang:
    """``spec.nvml.unresponsive``: an NVML call the agent made has not returned; the facts beside it
    are the last ones read."""

    call: str
    since: dt.datetime
    last_sample: dt.datetime | None = None  # the newest sample that completed (None: none did)


@dataclass(frozen=True)
class Report:
    node: str
    heartbeat: dt.datetime | None
    observed: dt.datetime | None
    nvml_available: bool = True
    nvml_error: str = ""
    nvml_hang: NvmlHang | None = None  # the agent's NVML call that has not returned (agent/watchdog.py)
    devices: tuple[Device, ...] = ()
    xids: tuple[XidEvent, ...] = ()
    nics: tuple[NicPort, ...] = ()
    # Whether the devices' pods were read (None: the agent does not read the kubelet's pod-resources API).
    pod_resources: PodResources | None = None
    resource_version: str = ""
    status: Mapping[str, Any] = field(default_factory=dict)

    def device(self, index: int | None) -> Device | None:
        for d in self.devices:
            if d.index == index:
                return d
        return None

    def holders(self, index: int) -> tuple[PodHold, ...]:
        """The containers holding GPU ``index``: the whole GPU's and its MIG devices', each once, sorted.
        Empty for an unknown GPU, and whenever the pods were not read (see ``pod_resources``)."""
        device = self.device(index)
        if device is None:
            return ()
        return tuple(sorted({*device.pods, *(p for m in device.mig_devices for p in m.pods)}))

    def mig_device(self, gpu: int | None, gpu_instance: int | None, compute_instance: int | None) -> MigDevice | None:
        """The MIG device of GPU ``gpu`` that an XID attributed to these instance IDs hit, if one is known.

        With a compute instance, the device with both IDs. Without one (NVML attributed the XID to
        the GPU instance only), the GPU instance's device when it holds exactly one; several are
        ambiguous and give None, as do an unknown GPU or GPU instance.
        """
        device = self.device(gpu)
        if device is None or gpu_instance is None:
            return None
        in_gi = [m for m in device.mig_devices if m.gpu_instance == gpu_instance]
        if compute_instance is not None:
            return next((m for m in in_gi if m.compute_instance == compute_instance), None)
        return in_gi[0] if len(in_gi) == 1 else None


def _int(v: Any, where: str) -> int:
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int):
        raise ReportError(f"{where}: expected an integer, got {v!r}")
    return v


def _opt_id(v: Any, where: str, maximum: int | None = None) -> int | None:
    """An optional non-negative integer (an instance ID or index); None when absent."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (maximum is not None and v > maximum):
        bound = f"0..{maximum}" if maximum is not None else "a non-negative integer"
        raise ReportError(f"{where}: expected {bound}, got {v!r}")
    return v


def _mig_devices(v: Any, where: str) -> tuple[MigDevice, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise ReportError(f"{where}: must be a list")
    out: list[MigDevice] = []
    seen: set[int] = set()
    for i, m in enumerate(v):
        at = f"{where}[{i}]"
        if not isinstance(m, Mapping):
            raise ReportError(f"{at}: must be an object")
        index = _opt_id(m.get("index"), f"{at}.index", 15)
        if index is None:
            raise ReportError(f"{at}.index: missing")
        if index in seen:
            raise ReportError(f"{at}.index: duplicate MIG device index {index}")
        seen.add(index)
        out.append(
            MigDevice(
                index=index,
                uuid=_opt_str(m.get("uuid"), f"{at}.uuid") or "",
                gpu_instance=_opt_id(m.get("gpuInstanceId"), f"{at}.gpuInstanceId"),
                compute_instance=_opt_id(m.get("computeInstanceId"), f"{at}.computeInstanceId"),
                profile=_opt_str(m.get("profile"), f"{at}.profile") or "",
                pods=_pods(m.get("pods"), f"{at}.pods"),
            )
        )
    return tuple(sorted(out, key=lambda m: m.index))


_POD_KEYS = ("namespace", "name", "container", "resource")


def _pods(v: Any, where: str) -> tuple[PodHold, ...]:
    """The containers holding a GPU or MIG device: each once, sorted."""
    if v is None:
        return ()
    if not isinstance(v, list | tuple):
        raise ReportError(f"{where}: must be a list")
    out: set[PodHold] = set()
    for i, p in enumerate(v):
        at = f"{where}[{i}]"
        if not isinstance(p, Mapping):
            raise ReportError(f"{at}: must be an object")
        values = []
        for key in _POD_KEYS:
            value = p.get(key)
            if not isinstance(value, str) or not value:
                raise ReportError(f"{at}.{key}: expected a non-empty string, got {value!r}")
            values.append(value)
        out.add(PodHold(*values))
    return tuple(sorted(out))


def _pod_resources(v: Any, where: str) -> PodResources | None:
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise ReportError(f"{where}: must be an object")
    available = v.get("available")
    if not isinstance(available, bool):
        raise ReportError(f"{where}.available: expected a boolean, got {available!r}")
    return PodResources(available, _opt_str(v.get("error"), f"{where}.error") or "")


def _opt_str(v: Any, where: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise ReportError(f"{where}: expected a string, got {v!r}")
    return v


def _scalar_facts(d: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The device's READ scalar facts (api/device_facts.py) by attribute; one absent (or decoded to
    unknown, such as a recovery action newer than api/recovery.py) keeps :class:`Device`'s default."""
    out: dict[str, Any] = {}
    for f in _READ_FACTS:
        value = f.parse(d.get(f.key), f"{where}.{f.key}")
        if value is not None:
            out[f.attr] = value
    return out


_READ_FACTS = tuple(f for f in DEVICE_FACTS if f.read)


def parse_report(obj: Mapping[str, Any]) -> Report:
    """Report from a GPUNodeHealth object; raises ReportError if the agent's facts are unusable."""
    try:
        return _parse_report(obj)
    except FieldError as e:
        raise ReportError(str(e)) from e


def _parse_report(obj: Mapping[str, Any]) -> Report:
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ReportError("spec: must be an object")
    node = spec.get("nodeName", name)
    if node != name:
        raise ReportError(f"spec.nodeName: {node!r} does not match the report's name {name!r}")
    nvml = spec.get("nvml") or {}
    devices = []
    seen: set[int] = set()
    for i, d in enumerate(spec.get("devices") or []):
        where = f"spec.devices[{i}]"
        if not isinstance(d, Mapping):
            raise ReportError(f"{where}: must be an object")
        idx = _int(d.get("index"), f"{where}.index")
        if idx in seen:
            raise ReportError(f"{where}.index: duplicate GPU index {idx}")
        seen.add(idx)
        ecc = _object(EccCounts, d, "ecc", where)
        pages = _object(RetiredPages, d, "retiredPages", where)
        rows = _object(RemappedRows, d, "remappedRows", where)
        temp = _object(Temperature, d, "temperature", where)
        get = dict.get
        devices.append(
            Device(
                index=idx,
                **_scalar_facts(d, where),
                ecc_volatile_uncorrected=get(ecc, "volatile_uncorrected", 0),
                ecc_aggregate_uncorrected=get(ecc, "aggregate_uncorrected", 0),
                retired_pending=get(pages, "pending", False),
                remap_pending=get(rows, "pending", False),
                remap_failure=get(rows, "failure", False),
                temperature_c=get(temp, "current_c"),
                slowdown_c=get(temp, "slowdown_c"),
                mig_devices=_mig_devices(d.get("migDevices"), f"{where}.migDevices"),
                nvlink=parse_nvlink(d.get("nvlink"), f"{where}.nvlink"),
                fabric=parse_fabric(d.get("fabric"), f"{where}.fabric"),
                pcie=parse_pcie(d.get("pcie"), f"{where}.pcie"),
                clocks=parse_clocks(d.get("clocks"), f"{where}.clocks"),
                pods=_pods(d.get("pods"), f"{where}.pods"),
            )
        )
    xids = []
    for i, e in enumerate(spec.get("xidEvents") or []):
        where = f"spec.xidEvents[{i}]"
        t = parse_time(e.get("time")) if isinstance(e, Mapping) else None
        if t is None:
            raise ReportError(f"{where}.time: missing or not an RFC 3339 timestamp")
        code = _int(e.get("xid"), f"{where}.xid")
        if not 1 <= code <= 1023:
            raise ReportError(f"{where}.xid: {code} is outside 1..1023")
        gpu = e.get("gpu")
        if isinstance(gpu, int) and seen and gpu not in seen:
            # The agent lists every GPU it knows (lost ones too): an XID on another one is not a fact.
            raise ReportError(f"{where}.gpu: GPU {gpu} is not among the report's devices")
        xids.append(
            XidEvent(
                xid=code,
                time=t,
                gpu=gpu if isinstance(gpu, int) else None,
                uuid=str(e.get("uuid") or ""),
                gpu_instance=_opt_id(e.get("gpuInstanceId"), f"{where}.gpuInstanceId"),
                compute_instance=_opt_id(e.get("computeInstanceId"), f"{where}.computeInstanceId"),
            )
        )
    return Report(
        node=name,
        heartbeat=parse_time(spec.get("heartbeatTime")),
        observed=parse_time(spec.get("observedTime")),
        nvml_available=bool(nvml.get("available", True)) if nvml else bool(devices),
        nvml_error=str(nvml.get("error") or ""),
        nvml_hang=_hang(nvml.get("unresponsive")),
        devices=tuple(sorted(devices, key=lambda d: d.index)),
        xids=tuple(sorted(xids, key=lambda e: e.time)),
        nics=parse_nics(spec.get("nics"), "spec.nics"),
        pod_resources=_pod_resources(spec.get("podResources"), "spec.podResources"),
        resource_version=str(meta.get("resourceVersion", "")),
        status=obj.get("status") or {},
    )


def _object(cls: type, device: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    """The known fields of one of a GPU's objects (``ecc``, ...), by attribute, read by their declarations
    (api/wire.py); absent: none. Kept as Device's own attributes, so no object is made of them."""
    value = device.get(key)
    if value is None:
        return {}
    if type(value) is not dict and not isinstance(value, Mapping):  # the first test is the fast one
        raise ReportError(f"{where}.{key}: must be an object")
    return read_fields(cls, value, where, key)


def _hang(value: Any) -> NvmlHang | None:
    where = "spec.nvml.unresponsive"
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ReportError(f"{where}: must be an object")
    since = parse_time(value.get("since"))
    if since is None:
        raise ReportError(f"{where}.since: missing or not an RFC 3339 timestamp")
    return NvmlHang(str(value.get("call") or "unknown"), since, parse_time(value.get("lastSampleTime")))
