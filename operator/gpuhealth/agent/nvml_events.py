"""NVML events: the event set and the wait, for :class:`NvmlSource`.

XIDs (handed on as events), ECC errors (a resample), and where the driver offers them (NVML 13)
a change of a GPU's recovery action (field 230 is re-read for that GPU at once) and a GPU that
became unavailable (marked lost at once): each then triggers a resample, so the report carries
the change at event latency rather than at the next sampling interval.

A mixin, because events share the sampler's NVML session: its lock, its devices and the
generation that says when ``nvmlInit`` ran again (the event set is then rebuilt).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any

import pynvml

from gpuhealth.agent.model import UTC, XidEvent
from gpuhealth.agent.nvml_calls import (
    EVENT_DBE,
    EVENT_RECOVERY,
    EVENT_SBE,
    EVENT_UNAVAILABLE,
    EVENT_XID,
    Device,
    handle_address,
    recovery_action,
)
from gpuhealth.agent.nvml_port import Nvml
from gpuhealth.agent.source import SourceEvents

log = logging.getLogger("gpuhealth.agent.nvml_source")


# nvmlEventData_t's gpuInstanceId/computeInstanceId when NVML attributes the event to no instance.
_NO_INSTANCE = 0xFFFFFFFF


def _instance(value: object) -> int | None:
    if not isinstance(value, int) or value == _NO_INSTANCE or value < 0:
        return None
    return value


class NvmlEvents:
    """Set up by :class:`NvmlSource`'s constructor and ``open``."""

    _nvml: Nvml
    _lock: threading.RLock
    _initialized: bool
    _devices: list[Device]
    _generation: int
    _event_set: Any
    _event_generation: int
    _event_devices: dict[int, Device]
    _events_unsupported: set[int]

    def wait_events(self, timeout_s: float) -> SourceEvents:
        """Wait up to ``timeout_s`` for one NVML event; call from one thread only."""
        with self._lock:
            if not self._initialized:
                ready = False
            else:
                ready = True
                if self._event_generation != self._generation:
                    self._setup_events_locked()
            event_set = self._event_set
            devices = dict(self._event_devices)
        if not ready or event_set is None:
            time.sleep(max(0.0, timeout_s))
            return SourceEvents()
        try:
            data = self._nvml.nvmlEventSetWait(event_set, max(0, int(timeout_s * 1000)))
        except pynvml.NVMLError_Timeout:
            return SourceEvents()
        except pynvml.NVMLError_GpuIsLost:
            # NVML reports a lost GPU through the wait itself; let the sampler record it.
            time.sleep(min(timeout_s, 1.0))
            return SourceEvents(resample=True)
        except pynvml.NVMLError as exc:
            log.warning("nvmlEventSetWait failed (%s); recreating the event set", exc)
            with self._lock:
                self._event_generation = -1
            time.sleep(max(0.0, timeout_s))
            return SourceEvents()
        event_type = int(data.eventType)
        address = handle_address(data.device)
        dev = devices.get(address) if address is not None else None
        if not event_type & EVENT_XID:
            if event_type & EVENT_UNAVAILABLE:
                self._mark_unavailable(dev)
                return SourceEvents(resample=True)
            if event_type & EVENT_RECOVERY:
                self._reread_recovery_action(dev)
                return SourceEvents(resample=True)
            return SourceEvents(resample=bool(event_type & (EVENT_SBE | EVENT_DBE)))
        xid = XidEvent(
            xid=int(data.eventData),
            time=datetime.now(UTC),
            source="nvml",
            gpu=dev.index if dev is not None else None,
            uuid=(dev.facts.uuid if dev is not None else None) or "",
            gpu_instance=_instance(getattr(data, "gpuInstanceId", None)),
            compute_instance=_instance(getattr(data, "computeInstanceId", None)),
        )
        where = "" if xid.gpu_instance is None else f" GI {xid.gpu_instance} CI {xid.compute_instance}"
        log.warning("XID %d on GPU %s (%s)%s", xid.xid, xid.gpu, xid.uuid, where)
        # The counters that go with an XID (ECC, remapping) are worth reading right away.
        return SourceEvents(xids=(xid,), resample=True)

    def _mark_unavailable(self, dev: Device | None) -> None:
        if dev is None:
            log.warning("NVML: a GPU became unavailable, but the event names no known GPU")
            return
        with self._lock:
            dev.unavailable = True
            dev.facts = dev.facts.replace(lost=True)
        log.warning("GPU %d (%s) became unavailable (NVML event); reporting it lost", dev.index, dev.facts.uuid)

    def _reread_recovery_action(self, dev: Device | None) -> None:
        if dev is None:
            return
        with self._lock:
            if dev.handle is None:
                return
            try:
                action = recovery_action(self._nvml, dev.handle)
            except pynvml.NVMLError as exc:
                log.warning("GPU %d: recovery action changed but cannot be read: %s", dev.index, exc)
                return
            dev.facts = dev.facts.replace(recovery_action=action)
        log.warning("GPU %d (%s): recovery action now %s (NVML event)", dev.index, dev.facts.uuid, action)

    def _setup_events_locked(self) -> None:
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except pynvml.NVMLError as exc:
                log.debug("nvmlEventSetFree: %s", exc)
            self._event_set = None
        self._event_generation = self._generation
        self._event_devices = {}
        unsupported = self._events_unsupported
        unsupported.clear()
        try:
            event_set = self._nvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning("XID events unavailable: nvmlEventSetCreate failed: %s", exc)
            unsupported.update(d.index for d in self._devices)
            return
        basic = EVENT_XID | EVENT_SBE | EVENT_DBE
        wanted = basic | EVENT_RECOVERY | EVENT_UNAVAILABLE
        for dev in self._devices:
            if dev.handle is None:
                continue
            try:
                supported = int(self._nvml.nvmlDeviceGetSupportedEventTypes(dev.handle))
            except pynvml.NVMLError as exc:
                log.debug("GPU %d: nvmlDeviceGetSupportedEventTypes: %s", dev.index, exc)
                supported = EVENT_XID
            mask = wanted & supported
            if not mask & EVENT_XID:
                unsupported.add(dev.index)
            if not mask:
                continue
            if not self._register(dev, mask, event_set) and not (
                mask & ~basic and self._register(dev, mask & basic, event_set)
            ):
                # The newer types must never cost the XIDs: retried above without them.
                unsupported.add(dev.index)
                continue
            address = handle_address(dev.handle)
            if address is not None:
                self._event_devices[address] = dev
        self._event_set = event_set

    def _register(self, dev: Device, mask: int, event_set: Any) -> bool:
        try:
            self._nvml.nvmlDeviceRegisterEvents(dev.handle, mask, event_set)
        except pynvml.NVMLError as exc:
            log.warning("GPU %d: cannot register for NVML events 0x%x: %s", dev.index, mask, exc)
            return False
        return True
