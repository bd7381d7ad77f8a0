"""GPU facts and XID events from NVML, through the ``pynvml`` bindings (nvidia-ml-py).

Rules that matter to the operator downstream:

* NVML that cannot be loaded or initialised yields ``available=False`` with the error and no
  devices; it is retried every sample, so a driver that comes up late is picked up.
* ``NotSupported`` is not a fault: the query's name goes into the device's ``unsupported``.
* ``GpuIsLost`` (or a handle that stops answering) marks the GPU ``lost`` and keeps it listed
  with its last known facts, so a GPU that fell off the bus cannot quietly vanish.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import pynvml

from gpuhealth.agent.model import (
    MIG_DISABLED,
    MIG_ENABLED,
    MODE_UNSUPPORTED,
    DeviceFacts,
    EccCounts,
    NvmlStatus,
    RemappedRows,
    RetiredPages,
    Temperature,
)
from gpuhealth.agent.nvml_calls import (
    GPU_FACT_READS,
    Device,
    Lost,
    load_nvml_library,
    nvml_text,
    recovery_action,
)
from gpuhealth.agent.nvml_events import NvmlEvents
from gpuhealth.agent.nvml_fabric import read_fabric, read_nvlink, read_pcie, read_throttle
from gpuhealth.agent.nvml_mig import read_mig_devices
from gpuhealth.agent.nvml_port import PYNVML, Handle, Nvml
from gpuhealth.agent.source import DeviceSample
from gpuhealth.api.device_facts import GpuFacts

__all__ = ["ENV_LIBRARY", "NvmlSource", "load_nvml_library"]

log = logging.getLogger(__name__)

ENV_LIBRARY = "GPUHEALTH_NVML_LIBRARY"

# Query names as they appear in spec.devices[].unsupported (the report's field names).
Q_ECC = "ecc"
Q_RETIRED = "retiredPages"
Q_REMAP = "remappedRows"
Q_TEMP = "temperature"
Q_THRESHOLDS = "temperatureThresholds"
Q_CLOCK = "clockEventReasons"
Q_POWER = "powerW"
Q_RECOVERY = "recoveryAction"
Q_MIG_DEVICES = "migDevices"
Q_EVENTS = "xidEvents"
Q_NVLINK = "nvlink"
Q_FABRIC = "fabric"
Q_PCIE = "pcie"
Q_THROTTLE = "throttle"

T = TypeVar("T")


class NvmlSource(NvmlEvents):
    """:class:`~gpuhealth.agent.source.DeviceSource` backed by NVML through ``nvml`` (the real pynvml
    unless a unit test scripts one, see nvml_port.py)."""

    def __init__(
        self,
        library: str | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        nvml: Nvml = PYNVML,
    ) -> None:
        self._nvml = nvml
        self._monotonic = monotonic
        self._library = library if library is not None else (os.environ.get(ENV_LIBRARY) or None)
        self._lock = threading.RLock()
        self._initialized = False
        self._status = NvmlStatus(available=False, error="NVML not initialised yet")
        self._devices: list[Device] = []
        self._generation = 0
        self._clock_fn: Callable[[Handle], int] | None = None
        # Event-thread state (only the thread calling wait_events touches these).
        self._event_set: Any = None
        self._event_generation = -1
        self._event_devices: dict[int, Device] = {}
        self._events_unsupported: set[int] = set()

    # ---- lifecycle -----------------------------------------------------------------------

    @property
    def status(self) -> NvmlStatus:
        return self._status

    def open(self) -> NvmlStatus:
        """Initialise NVML and discover GPUs now (``sample`` would do it lazily)."""
        with self._lock:
            if not self._initialized:
                self._init_locked()
            return self._status

    def close(self) -> None:
        with self._lock:
            if self._event_set is not None:
                try:
                    self._nvml.nvmlEventSetFree(self._event_set)
                except pynvml.NVMLError as exc:
                    log.debug("nvmlEventSetFree: %s", exc)
                self._event_set = None
            if self._initialized:
                try:
                    self._nvml.nvmlShutdown()
                except pynvml.NVMLError as exc:
                    log.debug("nvmlShutdown: %s", exc)
            self._initialized = False
            self._event_generation = -1

    def _init_locked(self) -> None:
        if self._library:
            try:
                load_nvml_library(self._library)
            except OSError as exc:
                self._fail(f"cannot load NVML library {self._library}: {exc}")
                return
        try:
            self._nvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self._fail(f"nvmlInit failed: {exc}")
            return
        self._initialized = True
        driver = self._optional(self._nvml.nvmlSystemGetDriverVersion)
        cuda_raw: int | None = None
        for name in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
            cuda_raw = self._optional(getattr(self._nvml, name))
            if cuda_raw is not None:
                break
        cuda = f"{cuda_raw // 1000}.{(cuda_raw % 1000) // 10}" if cuda_raw else None
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            self._nvml.nvmlShutdown()
            self._initialized = False
            self._fail(f"nvmlDeviceGetCount failed: {exc}")
            return
        self._devices = [self._discover(i) for i in range(count)]
        self._generation += 1
        self._status = NvmlStatus(
            available=True,
            driver_version=nvml_text(driver) if driver is not None else None,
            cuda_version=cuda,
        )
        log.info("NVML initialised: driver %s, CUDA %s, %d GPU(s)", driver, cuda, count)

    def _fail(self, message: str) -> None:
        if self._status.error != message:
            log.warning("NVML unavailable: %s", message)
        self._status = NvmlStatus(available=False, error=message)
        self._devices = []

    @staticmethod
    def _optional(fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except pynvml.NVMLError as exc:
            log.debug("%s: %s", getattr(fn, "__name__", fn), exc)
            return None

    # ---- discovery -------------------------------------------------------------------------

    def _discover(self, index: int) -> Device:
        dev = Device(index=index, facts=DeviceFacts(index=index))
        self._acquire_handle(dev)
        return dev

    def _acquire_handle(self, dev: Device) -> bool:
        """Get the device's handle and identity; False (and ``lost``) when NVML cannot."""
        try:
            handle = self._nvml.nvmlDeviceGetHandleByIndex(dev.index)
            uuid = nvml_text(self._nvml.nvmlDeviceGetUUID(handle))
            pci = nvml_text(self._nvml.nvmlDeviceGetPciInfo(handle).busId)
            name = nvml_text(self._nvml.nvmlDeviceGetName(handle))
        except pynvml.NVMLError as exc:
            self._warn_once(dev, "handle", f"GPU {dev.index}: cannot get handle/identity: {exc}")
            dev.handle = None
            dev.facts = dev.facts.replace(lost=True)
            return False
        dev.handle = handle
        dev.facts = dev.facts.replace(uuid=uuid or dev.facts.uuid, pci_bus_id=pci or None, model=name or None)
        dev.static_unsupported = set()
        dev.links = None  # found again on the new handle
        dev.fact_reads = {}
        dev.absent = set()
        shutdown = self._threshold(dev, getattr(pynvml, "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", 0))
        slowdown = self._threshold(dev, getattr(pynvml, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1))
        dev.thresholds = (slowdown, shutdown)
        return True

    def _threshold(self, dev: Device, which: int) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetTemperatureThreshold(dev.handle, which))
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            dev.static_unsupported.add(Q_THRESHOLDS)
        except pynvml.NVMLError as exc:
            self._warn_once(dev, Q_THRESHOLDS, f"GPU {dev.index}: temperature threshold: {exc}")
        return None

    @staticmethod
    def _warn_once(dev: Device, key: str, message: str) -> None:
        if key in dev.warned:
            log.debug("%s", message)
        else:
            dev.warned.add(key)
            log.warning("%s", message)

    # ---- sampling --------------------------------------------------------------------------

    def sample(self) -> DeviceSample:
        """Read every GPU's counters now (initialising NVML first if it is not yet up)."""
        with self._lock:
            if not self._initialized:
                self._init_locked()
            if not self._initialized:
                return DeviceSample(self._status, ())
            for dev in self._devices:
                dev.facts = self._sample_device(dev)
            return DeviceSample(self._status, tuple(d.facts for d in self._devices))

    def _sample_device(self, dev: Device) -> DeviceFacts:
        if dev.handle is None:
            if not self._acquire_handle(dev):
                return dev.facts.replace(lost=True)
            self._generation += 1  # the event thread re-registers the returning GPU
        unsupported: set[str] = set(dev.static_unsupported)
        if dev.index in self._events_unsupported:
            unsupported.add(Q_EVENTS)
        try:
            facts = self._read(dev, unsupported)
        except Lost:
            self._warn_once(dev, "lost", f"GPU {dev.index} ({dev.facts.uuid}) is lost")
            return dev.facts.replace(lost=True)
        if dev.unavailable:
            # Counters that still answer are facts, but NVML said the GPU cannot serve work.
            return facts.replace(lost=True, unsupported=tuple(sorted(unsupported)))
        dev.warned.discard("lost")
        return facts.replace(unsupported=tuple(sorted(unsupported)))

    def _query(self, dev: Device, name: str, unsupported: set[str], fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except pynvml.NVMLError_GpuIsLost as exc:
            raise Lost from exc
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            unsupported.add(name)
        except pynvml.NVMLError as exc:
            self._warn_once(dev, name, f"GPU {dev.index}: {name} query failed: {exc}")
        return None

    def _read(self, dev: Device, unsupported: set[str]) -> DeviceFacts:
        h = dev.handle
        nvml = self._nvml
        mig = self._mode(dev, lambda: nvml.nvmlDeviceGetMigMode(h)[0])
        ecc_mode = self._mode(dev, lambda: nvml.nvmlDeviceGetEccMode(h)[0])

        def ecc_count(error_type: int, counter: int) -> Callable[[], int]:
            return lambda: int(nvml.nvmlDeviceGetTotalEccErrors(h, error_type, counter))

        counters = [
            self._query(dev, Q_ECC, unsupported, ecc_count(error_type, counter))
            for error_type in (
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            )
            for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC)
        ]
        vol_unc, agg_unc, vol_cor, agg_cor = counters
        ecc = None if all(c is None for c in counters) else EccCounts(vol_unc, vol_cor, agg_unc, agg_cor)

        sbe = self._query(
            dev,
            Q_RETIRED,
            unsupported,
            lambda: len(
                nvml.nvmlDeviceGetRetiredPages(h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
            ),
        )
        retired = None
        if sbe is not None:
            dbe = self._query(
                dev,
                Q_RETIRED,
                unsupported,
                lambda: len(nvml.nvmlDeviceGetRetiredPages(h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)),
            )
            pending = self._query(
                dev, Q_RETIRED, unsupported, lambda: bool(nvml.nvmlDeviceGetRetiredPagesPendingStatus(h))
            )
            retired = RetiredPages(sbe, dbe, pending)

        rows = self._query(dev, Q_REMAP, unsupported, lambda: nvml.nvmlDeviceGetRemappedRows(h))
        remapped = None if rows is None else RemappedRows(int(rows[0]), int(rows[1]), bool(rows[2]), bool(rows[3]))

        current = self._query(
            dev,
            Q_TEMP,
            unsupported,
            lambda: int(nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
        )
        slowdown, shutdown = dev.thresholds
        temperature = (
            None
            if current is None and slowdown is None and shutdown is None
            else Temperature(current, slowdown, shutdown)
        )

        clock = self._query(dev, Q_CLOCK, unsupported, lambda: self._clock_reasons(h))
        power_mw = self._query(dev, Q_POWER, unsupported, lambda: int(nvml.nvmlDeviceGetPowerUsage(h)))
        recovery = self._query(dev, Q_RECOVERY, unsupported, lambda: recovery_action(nvml, h))
        migs = (
            self._query(dev, Q_MIG_DEVICES, unsupported, lambda: read_mig_devices(nvml, h, dev.index))
            if mig == MIG_ENABLED
            else ()
        )
        others = [(o.index, o.handle) for o in self._devices if o is not dev and o.handle is not None]
        nvlink = self._query(dev, Q_NVLINK, unsupported, lambda: read_nvlink(nvml, dev, others))
        fabric = self._query(dev, Q_FABRIC, unsupported, lambda: read_fabric(nvml, h))
        pcie = self._query(dev, Q_PCIE, unsupported, lambda: read_pcie(nvml, dev, clock))
        throttle = self._query(dev, Q_THROTTLE, unsupported, lambda: read_throttle(nvml, dev, self._monotonic()))
        declared = {
            f.name: self._fact(dev, f.name, f.metadata["fact"].key, unsupported) for f in dataclasses.fields(GpuFacts)
        }
        return dev.facts.replace(
            **declared,
            lost=False,
            nvlink=nvlink,
            fabric=fabric,
            pcie=pcie,
            clocks=throttle,
            mig_mode=mig,
            ecc_mode=ecc_mode,
            ecc=ecc,
            retired_pages=retired,
            remapped_rows=remapped,
            temperature=temperature,
            clock_event_reasons=clock,
            power_w=None if power_mw is None else power_mw / 1000.0,
            recovery_action=recovery,
            mig_devices=migs or (),
        )

    def _fact(self, dev: Device, name: str, key: str, unsupported: set[str]) -> object:
        """A GpuFacts field (api/device_facts.py) by its read (nvml_calls.GPU_FACT_READS): asked again once
        its period has passed, the last answer standing in between (a failed read is asked next sample)."""
        how = GPU_FACT_READS[name]
        now = self._monotonic()
        last = dev.fact_reads.get(name)
        if last is not None and now - last[0] < how.every_s:
            if last[2]:
                unsupported.add(key)
            return last[1]
        refused_before = key in unsupported
        value = self._query(dev, key, unsupported, partial(how.read, self._nvml, dev.handle))
        refused = key in unsupported and not refused_before
        if value is not None or refused:
            dev.fact_reads[name] = (now, value, refused)
        return value

    def _mode(self, dev: Device, fn: Callable[[], int]) -> str | None:
        try:
            value = fn()
        except pynvml.NVMLError_GpuIsLost as exc:
            raise Lost from exc
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            return MODE_UNSUPPORTED
        except pynvml.NVMLError as exc:
            self._warn_once(dev, "mode", f"GPU {dev.index}: mode query failed: {exc}")
            return None
        return MIG_ENABLED if int(value) == 1 else MIG_DISABLED

    def _clock_reasons(self, handle: Handle) -> int:
        """Current clock-event reasons, via the newer name when the driver has it."""
        if self._clock_fn is not None:
            return int(self._clock_fn(handle))
        candidates = [
            self._nvml.nvmlDeviceGetCurrentClocksEventReasons,
            self._nvml.nvmlDeviceGetCurrentClocksThrottleReasons,
        ]
        last: Exception = pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        for fn in candidates:
            try:
                value = int(fn(handle))
            except pynvml.NVMLError_FunctionNotFound as exc:
                last = exc
                continue
            self._clock_fn = fn
            return value
        raise last
