"""Plain data the agent observes: GPU facts, XID events and a whole sample.

Everything here is immutable so a snapshot can be handed from the sampler thread to the
publisher thread without copies or locks. ``None`` always means "not known" (the query was not
supported, failed, or the GPU is lost); it is never a stand-in for zero.

What the report carries as an object of its own is the report's own type, declared once in ``api/``
(``api/report.py``, ``api/report_fabric.py``): the agent fills it, the operator parses it. There a string
not known is "" (as the operator reads an absent one), never written.
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
from gpuhealth.api.report import EccCounts as EccCounts
from gpuhealth.api.report import GpuObjects, NvmlHang
from gpuhealth.api.report import PodHold as PodHold
from gpuhealth.api.report import PodResources as PodResources
from gpuhealth.api.report import RemappedRows as RemappedRows
from gpuhealth.api.report import RetiredPages as RetiredPages
from gpuhealth.api.report import SourceName as SourceName
from gpuhealth.api.report import Temperature as Temperature
from gpuhealth.api.report import XidEvent as XidEvent
from gpuhealth.api.report_fabric import NicPort


@dataclass(frozen=True)
class DeviceFacts(GpuFacts, GpuObjects):
    """What one GPU looked like at one sample. Its scalar facts are declared in api/device_facts.py
    (newer ones as fields of GpuFacts, which this class extends); agent/report.py writes them by type.
    Its MIG devices, fabric objects and pods are the report's own types (api/report.py GpuObjects, which
    this class extends as the operator's Device does): a MIG layout change is a fact change, the pods are
    () when none or not read (Snapshot.pod_resources says which)."""

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
    unsupported: tuple[str, ...] = ()

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
