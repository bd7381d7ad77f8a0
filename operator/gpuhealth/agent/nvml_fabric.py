"""The fabric between GPUs through pynvml: NVLinks and their peers, GPU fabric info, PCIe, throttle time.

Each reader returns the facts of one GPU, or raises: ``NVMLError_NotSupported`` /
``NVMLError_FunctionNotFound`` when the GPU or driver has none of them (the sampler records the
query as unsupported: absent, never a fault), ``NVMLError_GpuIsLost`` when the GPU fell off. A part
of a group that one driver lacks (the data-link error counters on Blackwell, the link-recovery fields
before it, one peer's P2P status) is left unknown, never guessed.

The decoding of what NVML answers lives in ``api/fabric.py`` (shared with the report's readers); this
module only asks.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pynvml

from gpuhealth.agent.nvml_calls import Device, field_ints
from gpuhealth.agent.nvml_port import Handle, Nvml
from gpuhealth.api import fabric
from gpuhealth.api.report_fabric import Clocks, Fabric, NvLink, Pcie

T = TypeVar("T")

ABSENT = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)
# The window of the throttle duty cycle: "throttled 40% of the last 5 minutes".
THROTTLE_WINDOW_S = 300.0


def _not_supported() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def maybe(fn: Callable[[], T]) -> T | None:
    """``fn()``, or None when NVML does not offer it."""
    try:
        return fn()
    except ABSENT:
        return None


def _links(nvml: Nvml, handle: Handle) -> tuple[int, ...]:
    """The NVLinks this GPU has (NVML_NVLINK_CAP_VALID); a link id past them answers "invalid argument"."""
    found = []
    for link in range(fabric.NVLINK_MAX_LINKS):
        try:
            valid = nvml.nvmlDeviceGetNvLinkCapability(handle, link, fabric.NVLINK_CAP_VALID)
        except (pynvml.NVMLError_InvalidArgument, pynvml.NVMLError_NotSupported):
            continue
        if valid:
            found.append(link)
    if not found:
        raise _not_supported()
    return tuple(found)


def _error_counters(nvml: Nvml, dev: Device, links: Sequence[int]) -> tuple[int | None, int | None, int | None]:
    """Replay, recovery and CRC (flit + data) errors summed over the links; None where the generation
    has no such counter (Blackwell has the link-recovery fields instead). A counter the first link
    refuses is not asked of the others, nor again on this handle."""
    kinds = (
        (fabric.NVLINK_ERROR_DL_REPLAY,),
        (fabric.NVLINK_ERROR_DL_RECOVERY,),
        (fabric.NVLINK_ERROR_DL_CRC_FLIT, fabric.NVLINK_ERROR_DL_CRC_DATA),
    )
    sums: list[int | None] = []
    for counters in kinds:
        total: int | None = None
        for counter in counters:
            key = f"nvlinkError{counter}"
            if key in dev.absent:
                continue
            for link in links:
                try:
                    value = int(nvml.nvmlDeviceGetNvLinkErrorCounter(dev.handle, link, counter))
                except ABSENT:
                    if link == links[0]:
                        dev.absent.add(key)
                        break
                    continue
                total = (total or 0) + value
        sums.append(total)
    return sums[0], sums[1], sums[2]


def _remote_device_types(nvml: Nvml, dev: Device, links: Sequence[int]) -> tuple[str, ...]:
    """What kinds of device the links reach, each once (api/fabric.py NVLINK_DEVICE_TYPES); () where the
    driver does not say. Asked of each link, as its state is; a refusal is not asked again on this handle."""
    if "nvlinkRemoteType" in dev.absent:
        return ()
    kinds: set[str] = set()
    for link in links:
        try:
            kind = int(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(dev.handle, link))
        except ABSENT:
            dev.absent.add("nvlinkRemoteType")
            return ()
        except pynvml.NVMLError:
            continue  # this link would not say: the others still do
        kinds.add(fabric.NVLINK_DEVICE_TYPES.get(kind, "Unknown"))
    return tuple(sorted(kinds))


def _sum(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


_PER_LINK = (
    fabric.FI_NVLINK_GET_SPEED,
    fabric.FI_NVLINK_GET_VERSION,
    fabric.FI_NVLINK_RECOVERY_SUCCESSFUL,
    fabric.FI_NVLINK_RECOVERY_FAILED,
    fabric.FI_NVLINK_RECOVERY_TOTAL,
)


def read_nvlink(nvml: Nvml, dev: Device, others: Sequence[tuple[int, Any]]) -> NvLink:
    """Per-link state, speed and counters of one GPU, and which of ``others`` (index, handle) it
    reaches over NVLink."""
    handle = dev.handle
    if dev.links is None:
        try:
            dev.links = _links(nvml, handle)
        except ABSENT:
            dev.links = ()  # no NVLink: not asked again on this handle
            raise
    links = dev.links
    if not links:
        raise _not_supported()
    inactive = tuple(
        link for link in links if int(nvml.nvmlDeviceGetNvLinkState(handle, link)) != pynvml.NVML_FEATURE_ENABLED
    )
    fields = [f for f in _PER_LINK if f"field{f}" not in dev.absent]
    values = field_ints(nvml, handle, [(f, link) for link in links for f in fields]) if fields else []
    by_field: dict[int, list[int | None]] = {f: values[i :: len(fields)] for i, f in enumerate(fields)}
    for f in fields:
        if all(v is None for v in by_field[f]):
            dev.absent.add(f"field{f}")  # this driver or GPU has no such field: not asked again
    none: list[int | None] = [None] * len(links)
    speed = by_field.get(fabric.FI_NVLINK_GET_SPEED, none)
    speeds = [v for link, v in zip(links, speed, strict=True) if link not in inactive and v]
    versions = [v for v in by_field.get(fabric.FI_NVLINK_GET_VERSION, none) if v]
    replay, recovery, crc = _error_counters(nvml, dev, links)
    return NvLink(
        links=len(links),
        active=len(links) - len(inactive),
        inactive_links=inactive,
        speed_mbps=min(speeds) if speeds else None,
        version=versions[0] if versions else None,
        peers=_peers(nvml, handle, others),
        replay_errors=replay,
        recovery_errors=recovery,
        crc_errors=crc,
        recovery_successful=_sum(by_field.get(fabric.FI_NVLINK_RECOVERY_SUCCESSFUL, none)),
        recovery_failed=_sum(by_field.get(fabric.FI_NVLINK_RECOVERY_FAILED, none)),
        recovery_total=_sum(by_field.get(fabric.FI_NVLINK_RECOVERY_TOTAL, none)),
        remote_device_types=_remote_device_types(nvml, dev, links),
    )


def _peers(nvml: Nvml, handle: Handle, others: Sequence[tuple[int, Any]]) -> tuple[int, ...] | None:
    """The GPUs this one has NVLink P2P with; None when the driver does not say. A peer that does not
    answer (lost, gone) is left out: its own sample reports it."""
    out = []
    for index, other in others:
        try:
            status = int(nvml.nvmlDeviceGetP2PStatus(handle, other, fabric.P2P_CAPS_INDEX_NVLINK))
        except ABSENT:
            return None
        except pynvml.NVMLError:
            continue
        if status == fabric.P2P_STATUS_OK:
            out.append(index)
    return tuple(out)


def read_fabric(nvml: Nvml, handle: Handle) -> Fabric:
    """GPU fabric info v3: the probe's state (its status only once COMPLETED), the clique, the health."""
    cls = getattr(pynvml, "c_nvmlGpuFabricInfo_v3_t", None)
    if cls is None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    info = cls()  # sets version = nvmlGpuFabricInfo_v3
    nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    state = int(info.state)
    if state == 0:
        return Fabric.decoded(state)
    raw = bytes(info.clusterUuid)
    return Fabric.decoded(
        state=state,
        status=int(info.status) if state == fabric.STATE_COMPLETED else None,
        cluster_uuid=fabric.cluster_uuid(raw) if any(raw) else None,
        clique_id=int(info.cliqueId),
        health_mask=int(info.healthMask),
        health_summary=int(info.healthSummary),
    )


def read_pcie(nvml: Nvml, dev: Device, clock_reasons: int | None) -> Pcie:
    """Current and maximum PCIe width and generation, and the replay counter. The generation is kept
    from the last sample the GPU was busy in (clock reason GpuIdle clear): an idle link drops it."""
    h = dev.handle
    width = maybe(lambda: int(nvml.nvmlDeviceGetCurrPcieLinkWidth(h)))
    max_width = maybe(lambda: int(nvml.nvmlDeviceGetMaxPcieLinkWidth(h)))
    generation = maybe(lambda: int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(h)))
    max_generation = maybe(lambda: int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(h)))
    replays = maybe(lambda: int(nvml.nvmlDeviceGetPcieReplayCounter(h)))
    if all(v is None for v in (width, max_width, generation, max_generation, replays)):
        raise _not_supported()
    idle = clock_reasons is not None and bool(clock_reasons & fabric.GPU_IDLE)
    if generation is not None and not idle:
        dev.pcie_generation = generation
    return Pcie(width, max_width, dev.pcie_generation, max_generation, replays)


_THROTTLE_FIELDS = (
    fabric.FI_THROTTLE_SW_THERMAL_NS,
    fabric.FI_THROTTLE_HW_THERMAL_NS,
    fabric.FI_THROTTLE_HW_POWER_BRAKE_NS,
)


def read_throttle(nvml: Nvml, dev: Device, now: float, window_s: float = THROTTLE_WINDOW_S) -> Clocks:
    """The share of the last ``window_s`` seconds spent throttled per cause, from the accumulated
    nanoseconds NVML keeps (fields 269-271); unknown (None) shares until two samples span some time."""
    values = tuple(field_ints(nvml, dev.handle, [(f, 0) for f in _THROTTLE_FIELDS]))
    if all(v is None for v in values):
        raise _not_supported()
    history = dev.throttle_history
    history.append((now, values))
    while len(history) > 2 and history[1][0] <= now - window_s:
        history.popleft()
    base_t, base = history[0]
    span = now - base_t
    if round(span) <= 0:
        return Clocks()  # not measured yet: nothing to write

    def pct(i: int) -> int | None:
        old, new = base[i], values[i]
        if old is None or new is None or new < old:
            return None  # unknown, or the counter restarted (driver reload)
        return max(0, min(100, round((new - old) / (span * 1e9) * 100)))

    return Clocks(window_s=round(span), sw_thermal_pct=pct(0), hw_thermal_pct=pct(1), hw_power_brake_pct=pct(2))
