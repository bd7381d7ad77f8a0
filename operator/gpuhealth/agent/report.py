"""Pure translation of observed facts into the GPUNodeHealth ``spec`` and its change rules.

Nothing here does I/O or reads clocks: the publisher passes times in. That keeps the rules
that decide *when* the agent writes (which is what keeps 1,000 agents from flooding the API
server) testable in isolation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuhealth.agent.model import (
    UTC,
    DeviceFacts,
    PodHold,
    Snapshot,
    SourceName,
    Temperature,
    XidEvent,
)
from gpuhealth.agent.report_fabric import device_fabric_spec, nics_changed, nics_spec, significant_fabric
from gpuhealth.agent.xid_history import DEFAULT_DCGM_DEDUPE_S, DEFAULT_MAX_XID_EVENTS, XidHistory
from gpuhealth.api.device_facts import DEVICE_FACTS
from gpuhealth.api.fabric import SIGNIFICANT_CLOCK_EVENT_REASONS
from gpuhealth.api.report import DEVICE_OBJECTS, MigDevice
from gpuhealth.api.timeutil import parse_time
from gpuhealth.api.wire import dump

__all__ = [
    "DEFAULT_DCGM_DEDUPE_S",
    "DEFAULT_MAX_XID_EVENTS",
    "DEFAULT_TEMPERATURE_BAND_C",
    "AgentInfo",
    "ReportBuilder",
    "XidHistory",
    "device_key",
    "device_spec",
    "facts_changed",
    "now_utc",
    "pods_spec",
    "rfc3339",
    "temperature_changed",
    "xid_spec",
]

log = logging.getLogger(__name__)

DEFAULT_TEMPERATURE_BAND_C = 5
_SAMPLED = tuple(f for f in DEVICE_FACTS if f.sampled)
_MAX_DEVICES = 64
_MAX_MIG_DEVICES = 16
_MAX_UNSUPPORTED = 32
_MAX_PODS = 64


def rfc3339(dt: datetime) -> str:
    """UTC RFC 3339 with a 'Z' suffix, microseconds only when present (both forms are valid)."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    dt = dt.astimezone(UTC)
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ" if dt.microsecond else "%Y-%m-%dT%H:%M:%SZ"
    return dt.strftime(fmt)


def _truncate(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[: limit - 1] + "…"


def _compact(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def device_key(device: DeviceFacts) -> str:
    """Stable identity of a GPU across samples and restarts: its UUID, else its index."""
    return device.uuid or f"index-{device.index}"


def device_spec(device: DeviceFacts, clock_events_since: datetime | None) -> dict[str, Any]:
    """One ``spec.devices[]`` entry; unknown values are omitted, never reported as zero. The scalar
    facts are api/device_facts.py's, each written by its type (Fact.dump)."""
    out: dict[str, Any] = {"index": device.index}
    for f in _SAMPLED:
        value = f.dump(getattr(device, f.attr))
        if value is not None:
            out[f.key] = value
    if device.clock_event_reasons is not None and clock_events_since is not None:
        out["clockEventsSince"] = rfc3339(clock_events_since)
    for key, attr, _ in DEVICE_OBJECTS:  # ecc, retiredPages, ...: by their fields' declarations (api/wire.py)
        value = getattr(device, attr)
        if value is not None and (written := dump(value)):
            out[key] = written
    out.update(device_fabric_spec(device))
    if device.mig_devices:
        out["migDevices"] = [mig_spec(m) for m in sorted(device.mig_devices, key=lambda m: m.index)][:_MAX_MIG_DEVICES]
    if device.pods:
        out["pods"] = pods_spec(device.pods)
    if device.unsupported:
        out["unsupported"] = [_truncate(n, 64) for n in sorted(set(device.unsupported))][:_MAX_UNSUPPORTED]
    return out


def pods_spec(pods: Iterable[PodHold]) -> list[dict[str, str]]:
    """``spec.devices[].pods[]`` (and a MIG device's): the containers holding it, each once, sorted."""
    return [
        {"namespace": p.namespace, "name": p.name, "container": p.container, "resource": p.resource}
        for p in sorted(set(pods))[:_MAX_PODS]
    ]


def mig_spec(mig: MigDevice) -> dict[str, Any]:
    """One ``spec.devices[].migDevices[]`` entry: the MIG device index under its GPU, and what is known."""
    out: dict[str, Any] = {"index": mig.index}
    if mig.uuid:
        out["uuid"] = _truncate(mig.uuid, 128)
    if mig.gpu_instance is not None:
        out["gpuInstanceId"] = mig.gpu_instance
    if mig.compute_instance is not None:
        out["computeInstanceId"] = mig.compute_instance
    if mig.profile:
        out["profile"] = mig.profile
    if mig.pods:
        out["pods"] = pods_spec(mig.pods)
    return out


def xid_spec(event: XidEvent) -> dict[str, Any]:
    out: dict[str, Any] = {"xid": event.xid, "time": rfc3339(event.time), "source": event.source}
    if event.gpu is not None:
        out["gpu"] = event.gpu
    if event.gpu_instance is not None:
        out["gpuInstanceId"] = event.gpu_instance
    if event.compute_instance is not None:
        out["computeInstanceId"] = event.compute_instance
    if event.uuid:
        out["uuid"] = _truncate(event.uuid, 128)
    if event.detail:
        out["detail"] = _truncate(event.detail, 256)
    return out


def temperature_changed(prev: int | None, cur: int | None, band: int, thresholds: Iterable[int | None]) -> bool:
    """True when a temperature moved by at least ``band`` or crossed a threshold.

    Temperatures wander by a degree or two every sample; writing each wobble would turn every
    agent into a steady stream of API writes, so only moves that matter count as new facts.
    """
    if prev is None or cur is None:
        return prev != cur
    if abs(cur - prev) >= band:
        return True
    return any(t is not None and (prev >= t) != (cur >= t) for t in thresholds)


def _significant(device: DeviceFacts) -> tuple[DeviceFacts, tuple[Any, ...]]:
    """The device with the noisy fields neutralised, and what of its fabric objects is a fact, for
    equality comparison."""
    clock = device.clock_event_reasons
    temp = device.temperature
    rest = device.replace(
        power_w=None,
        clock_event_reasons=None if clock is None else clock & SIGNIFICANT_CLOCK_EVENT_REASONS,
        temperature=None if temp is None else Temperature(None, temp.slowdown_c, temp.shutdown_c),
        unsupported=tuple(sorted(set(device.unsupported))),
        nvlink=None,
        fabric=None,
        pcie=None,
        clocks=None,
    )
    return rest, significant_fabric(device)


def facts_changed(prev: Snapshot | None, cur: Snapshot, temperature_band_c: int = DEFAULT_TEMPERATURE_BAND_C) -> bool:
    """Whether ``cur`` carries facts the last written report (``prev``) does not.

    Power is excluded (it follows the workload; /metrics carries it live), temperature uses a
    dead-band plus threshold crossings, clock-event reasons only count the bits that say
    the hardware is protecting itself, and the fabric's telemetry is left out or bucketed
    (report_fabric.py).
    """
    if prev is None:
        return True
    if prev.nvml != cur.nvml or prev.sources != cur.sources:
        return True
    # Whether the pods were read (its error's wording alone is no new fact); which pods hold each GPU
    # is a device fact (below): a pod that starts on a GPU or leaves it is written at once.
    if _pods_read(prev) != _pods_read(cur):
        return True
    if nics_changed(prev.nics, cur.nics):
        return True
    if [d.index for d in prev.devices] != [d.index for d in cur.devices]:
        return True
    for old, new in zip(prev.devices, cur.devices, strict=True):
        if _significant(old) != _significant(new):
            return True
        old_t = old.temperature.current_c if old.temperature else None
        new_t = new.temperature.current_c if new.temperature else None
        thresholds = (new.temperature.slowdown_c, new.temperature.shutdown_c) if new.temperature else ()
        if temperature_changed(old_t, new_t, temperature_band_c, thresholds):
            return True
    return False


def _pods_read(snapshot: Snapshot) -> bool | None:
    return None if snapshot.pod_resources is None else snapshot.pod_resources.available


@dataclass(frozen=True)
class AgentInfo:
    version: str
    sources: tuple[SourceName, ...]
    boot_time: datetime | None


class ReportBuilder:
    """Owns what the agent last wrote and decides what to write next.

    Single-threaded by design: only the publisher thread (or ``--once``) touches it.
    """

    def __init__(
        self,
        node_name: str,
        agent: AgentInfo,
        *,
        max_xid_events: int = DEFAULT_MAX_XID_EVENTS,
        temperature_band_c: int = DEFAULT_TEMPERATURE_BAND_C,
        dcgm_dedupe_s: float = DEFAULT_DCGM_DEDUPE_S,
    ) -> None:
        self.node_name = node_name
        self.agent = agent
        self.history = XidHistory(max_xid_events, dcgm_dedupe_s)
        self._band = temperature_band_c
        self._published: Snapshot | None = None
        self._observed_time: datetime | None = None
        self._clock_since: dict[str, tuple[int, datetime]] = {}
        self._xids_dirty = False
        self._newest_xid: datetime | None = None
        self.last_spec: dict[str, Any] | None = None

    def restore(self, existing_spec: Mapping[str, Any] | None) -> int:
        """Adopt the spec found on the server at start; returns how many XIDs were kept."""
        if existing_spec is None:
            self.last_spec = None
            return 0
        self.last_spec = dict(existing_spec)
        kept = self.history.restore(existing_spec.get("xidEvents"), self.agent.boot_time)
        devices = existing_spec.get("devices")
        for item in devices if isinstance(devices, list) else []:
            if not isinstance(item, Mapping):
                continue
            reasons = item.get("clockEventReasons")
            since = parse_time(item.get("clockEventsSince"))
            uuid = item.get("uuid")
            key = uuid if isinstance(uuid, str) and uuid else f"index-{item.get('index')}"
            if isinstance(reasons, int) and since is not None:
                self._clock_since[key] = (reasons & SIGNIFICANT_CLOCK_EVENT_REASONS, since)
        return kept

    def add_xid(self, event: XidEvent, *, baseline: bool = False) -> bool:
        if not self.history.add(event, baseline=baseline):
            return False
        self._xids_dirty = True
        self._newest_xid = event.time if self._newest_xid is None else max(self._newest_xid, event.time)
        return True

    def needs_write(self, snapshot: Snapshot) -> bool:
        """True when the report on the server is missing facts that ``snapshot`` has."""
        return self._xids_dirty or facts_changed(self._published, snapshot, self._band)

    def render(self, snapshot: Snapshot, now: datetime) -> dict[str, Any]:
        """The full spec for ``snapshot``; does not change state until :meth:`commit`."""
        observed = self._observed_time
        if observed is None or facts_changed(self._published, snapshot, self._band):
            observed = snapshot.time
        if self._xids_dirty and self._newest_xid is not None:
            observed = max(observed, self._newest_xid)
        devices = [
            device_spec(d, self._clock_since_for(d, snapshot.time)[1])
            for d in sorted(snapshot.devices, key=lambda d: d.index)[:_MAX_DEVICES]
        ]
        nvml: dict[str, Any] = {"available": snapshot.nvml.available}
        if snapshot.nvml.error:
            nvml["error"] = _truncate(snapshot.nvml.error, 1024)
        if snapshot.nvml.driver_version:
            nvml["driverVersion"] = _truncate(snapshot.nvml.driver_version, 64)
        if snapshot.nvml.cuda_version:
            nvml["cudaVersion"] = _truncate(snapshot.nvml.cuda_version, 64)
        hang = snapshot.nvml.hang
        if hang is not None:
            # The facts beside it are the last ones read: say which call hangs, since when, and how old
            # the newest sample is (agent/watchdog.py).
            nvml["unresponsive"] = {
                "call": _truncate(hang.call, 128),
                "since": rfc3339(hang.since),
                **({"lastSampleTime": rfc3339(hang.last_sample)} if hang.last_sample else {}),
            }
        agent: dict[str, Any] = {
            "version": _truncate(self.agent.version, 64),
            "sources": list(self.agent.sources),
        }
        if self.agent.boot_time is not None:
            agent["bootTime"] = rfc3339(self.agent.boot_time)
        spec: dict[str, Any] = {
            "nodeName": self.node_name,
            "agent": agent,
            "heartbeatTime": rfc3339(now),
            "observedTime": rfc3339(observed),
            "nvml": nvml,
            "devices": devices,
            "xidEvents": [xid_spec(e) for e in self.history.events],
        }
        if snapshot.nics:
            spec["nics"] = nics_spec(snapshot.nics)
        if snapshot.pod_resources is not None:
            pods: dict[str, Any] = {"available": snapshot.pod_resources.available}
            if snapshot.pod_resources.error:
                pods["error"] = _truncate(snapshot.pod_resources.error, 1024)
            spec["podResources"] = pods
        return spec

    def commit(self, snapshot: Snapshot, spec: dict[str, Any]) -> None:
        """Record that ``spec`` (rendered from ``snapshot``) is now on the server."""
        if self._observed_time is None or facts_changed(self._published, snapshot, self._band):
            self._observed_time = snapshot.time
        if self._xids_dirty and self._newest_xid is not None:
            self._observed_time = max(self._observed_time, self._newest_xid)
        for device in snapshot.devices:
            masked, since = self._clock_since_for(device, snapshot.time)
            if masked is not None and since is not None:
                self._clock_since[device_key(device)] = (masked, since)
        self._published = snapshot
        self._xids_dirty = False
        self.last_spec = spec

    def heartbeat_patch(self, now: datetime) -> dict[str, Any]:
        return {"heartbeatTime": rfc3339(now)}

    def commit_heartbeat(self, patch: Mapping[str, Any]) -> None:
        if self.last_spec is not None:
            self.last_spec.update(patch)

    def _clock_since_for(self, device: DeviceFacts, when: datetime) -> tuple[int | None, datetime | None]:
        if device.clock_event_reasons is None:
            return None, None
        masked = device.clock_event_reasons & SIGNIFICANT_CLOCK_EVENT_REASONS
        known = self._clock_since.get(device_key(device))
        if known is not None and known[0] == masked:
            return masked, known[1]
        return masked, when


def now_utc() -> datetime:
    return datetime.now(UTC)
