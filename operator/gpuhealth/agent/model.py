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

# The report's vocabularies, declared with the report's types (the CRD is generated from them).
from gpuhealth.api.device_facts import MIG_DISABLED as MIG_DISABLED
from gpuhealth.api.device_facts import MIG_ENABLED as MIG_ENABLED
from gpuhealth.api.device_facts import MODE_UNSUPPORTED as MODE_UNSUPPORTED
from gpuhealth.api.device_facts import GpuFacts
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.report import MigDevice, NvmlHang
from gpuhealth.api.report import PodHold as PodHold
from gpuhealth.api.report import PodResources as PodResources
from gpuhealth.api.report import SourceName as SourceName
from gpuhealth.api.report import XidEvent as XidEvent
from gpuhealth.api.report_fabric import Clocks, Fabric, NicPort, NvLink, Pcie


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
class DeviceFacts(GpuFacts):
    """What one GPU looked like at one sample. Its scalar facts are declared in api/device_facts.py
    (newer ones as fields of GpuFacts, which this class extends); agent/report.py writes them by type."""

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
    mig_devices: tuple[MigDevice, ...] = ()
    # The fabric between GPUs: the report's own types (api/report_fabric.py), filled as it carries them.
    nvlink: NvLink | None = None
    fabric: Fabric | None = None
    pcie: Pcie | None = None
    clocks: Clocks | None = None
    unsupported: tuple[str, ...] = ()
    # The containers the kubelet allocated the whole GPU to (pod_resources.py), sorted; () when none or
    # not read (Snapshot.pod_resources says which).
    pods: tuple[PodHold, ...] = ()

    def replace(self, **changes: object) -> DeviceFacts:
        """Copy with some fields changed (typed shorthand for dataclasses.replace)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class NvmlStatus:
    available: bool
    error: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    # Set while an NVML call hangs: the facts beside it are the last ones read, no longer refreshed.
    hang: NvmlHang | None = None


@dataclass(frozen=True)
class Snapshot:
    """One merged sample of every source, as the publisher sees it."""

    time: datetime
    nvml: NvmlStatus
    devices: tuple[DeviceFacts, ...] = ()
    sources: tuple[SourceName, ...] = ("nvml",)
    nics: tuple[NicPort, ...] = ()
    # Whether the devices' pods were read from the kubelet (pod_resources.py); None: not configured to.
    pod_resources: PodResources | None = None
