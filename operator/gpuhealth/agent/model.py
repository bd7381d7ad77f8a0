"""Plain data the agent observes: GPU facts, XID events and a whole sample.

Everything here is immutable so a snapshot can be handed from the sampler thread to the
publisher thread without copies or locks. ``None`` always means "not known" (the query was not
supported, failed, or the GPU is lost); it is never a stand-in for zero.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC as UTC  # re-exported: the agent's modules take the zone from here
from datetime import datetime

from gpuhealth.api.recovery import RecoveryAction

# The report's vocabularies, declared with the report's types (the CRD is generated from them).
from gpuhealth.api.report import MIG_DISABLED as MIG_DISABLED
from gpuhealth.api.report import MIG_ENABLED as MIG_ENABLED
from gpuhealth.api.report import MODE_UNSUPPORTED as MODE_UNSUPPORTED
from gpuhealth.api.report import SourceName as SourceName

# Clock-event bits that mean the hardware is protecting itself (HW slowdown, SW thermal,
# HW thermal, HW power brake). Idle, power cap, sync boost and app clocks flip with every
# workload change, so only these bits count as a change of facts.
SIGNIFICANT_CLOCK_EVENT_REASONS = 0x08 | 0x20 | 0x40 | 0x80


@dataclass(frozen=True)
class EccCounts:
    volatile_uncorrected: int | None = None
    volatile_corrected: int | None = None
    aggregate_uncorrected: int | None = None
    aggregate_corrected: int | None = None


@dataclass(frozen=True)
class RetiredPages:
    single_bit_ecc: int | None = None
    double_bit_ecc: int | None = None
    pending: bool | None = None


@dataclass(frozen=True)
class RemappedRows:
    corrected: int | None = None
    uncorrected: int | None = None
    pending: bool | None = None
    failure: bool | None = None


@dataclass(frozen=True)
class Temperature:
    current_c: int | None = None
    slowdown_c: int | None = None
    shutdown_c: int | None = None


@dataclass(frozen=True)
class MigDeviceFacts:
    """One MIG device (a compute instance inside a GPU instance) as NVML lists it under its GPU.

    ``index`` is NVML's MIG device index under the parent (nvmlDeviceGetMigDeviceHandleByIndex);
    the instance IDs are what NVML attributes XIDs with, so the operator can name the slice hit.
    """

    index: int
    uuid: str | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None
    profile: str | None = None


@dataclass(frozen=True)
class DeviceFacts:
    """What one GPU looked like at one sample."""

    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    model: str | None = None
    mig_mode: str | None = None
    ecc_mode: str | None = None
    lost: bool = False
    ecc: EccCounts | None = None
    retired_pages: RetiredPages | None = None
    remapped_rows: RemappedRows | None = None
    temperature: Temperature | None = None
    clock_event_reasons: int | None = None
    power_w: float | None = None
    recovery_action: RecoveryAction | None = None  # api/recovery.py; None: unsupported or newer than it
    # Only while MIG mode is Enabled and NVML lists instances; a layout change is a fact change.
    mig_devices: tuple[MigDeviceFacts, ...] = ()
    unsupported: tuple[str, ...] = ()

    def replace(self, **changes: object) -> DeviceFacts:
        """Copy with some fields changed (typed shorthand for dataclasses.replace)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class NvmlHang:
    """An NVML call that has not returned for longer than the agent's bound (``watchdog.py``)."""

    call: str  # the NVML function, e.g. nvmlDeviceGetTotalEccErrors ("unknown" when it cannot be told)
    since: datetime  # when that call (or the sample that made it) started, by the node's clock
    last_sample: datetime | None = None  # the newest sample that completed, None if none did


@dataclass(frozen=True)
class NvmlStatus:
    available: bool
    error: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    # Set while an NVML call hangs: the facts beside it are the last ones read, no longer refreshed.
    hang: NvmlHang | None = None


@dataclass(frozen=True)
class XidEvent:
    xid: int
    time: datetime
    source: SourceName
    gpu: int | None = None
    uuid: str | None = None
    detail: str | None = None
    # The MIG instance NVML attributed the XID to (nvmlEventData_t), None when it attributed none.
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True)
class Snapshot:
    """One merged sample of every source, as the publisher sees it."""

    time: datetime
    nvml: NvmlStatus
    devices: tuple[DeviceFacts, ...] = ()
    sources: tuple[SourceName, ...] = ("nvml",)
