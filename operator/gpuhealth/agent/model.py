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
from gpuhealth.api.report import PodHold as PodHold
from gpuhealth.api.report import PodResources as PodResources
from gpuhealth.api.report import SourceName as SourceName


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
    # The containers the kubelet allocated it to (pod_resources.py), sorted; () when none or not read.
    pods: tuple[PodHold, ...] = ()


@dataclass(frozen=True)
class NvLinkFacts:
    """A GPU's NVLinks at one sample (nvml_fabric.py).

    ``links`` are the links that exist (NVML_NVLINK_CAP_VALID), ``inactive`` those of them that are
    down. ``peers`` are the GPUs of this node it reaches over NVLink (P2P status on the NVLink
    capability), None when NVML would not say. The error counters are sums over the links and
    telemetry only (they climb on healthy links; BER never decides anything): the report carries them
    but a change of them alone is not a new fact. ``recovery_failed`` (Blackwell, field 214) is.
    """

    links: int
    active: int
    inactive: tuple[int, ...] = ()
    speed_mbps: int | None = None  # the slowest active link
    version: int | None = None
    peers: tuple[int, ...] | None = None
    replay_errors: int | None = None
    recovery_errors: int | None = None
    crc_errors: int | None = None
    recovery_successful: int | None = None
    recovery_failed: int | None = None
    recovery_total: int | None = None


@dataclass(frozen=True)
class FabricFacts:
    """nvmlDeviceGetGpuFabricInfoV (v3) as NVML answered it; decoding is api/fabric.py's."""

    state: int
    status: int | None = None  # NVML's return code of the probe, read only at COMPLETED
    cluster_uuid: str | None = None
    clique_id: int | None = None
    health_mask: int | None = None
    health_summary: int | None = None


@dataclass(frozen=True)
class PcieFacts:
    """PCIe link of the GPU. ``generation`` is the last one read while the GPU was not idle (the link
    drops its generation when idle, which is no fault and must not rewrite the report); replays are
    telemetry."""

    width: int | None = None
    max_width: int | None = None
    generation: int | None = None
    max_generation: int | None = None
    replays: int | None = None


@dataclass(frozen=True)
class ThrottleFacts:
    """Share of the last ``window_s`` seconds the GPU spent throttled, per cause, in percent, from
    NVML's accumulated-nanoseconds fields (269-271): a duty cycle, not one sample of the reasons."""

    window_s: int
    sw_thermal_pct: int | None = None
    hw_thermal_pct: int | None = None
    hw_power_brake_pct: int | None = None


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
    mig_devices: tuple[MigDeviceFacts, ...] = ()
    nvlink: NvLinkFacts | None = None
    fabric: FabricFacts | None = None
    pcie: PcieFacts | None = None
    throttle: ThrottleFacts | None = None
    unsupported: tuple[str, ...] = ()
    # The containers the kubelet allocated the whole GPU to (pod_resources.py), sorted; () when none or
    # not read (Snapshot.pod_resources says which).
    pods: tuple[PodHold, ...] = ()

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
class NicPortFacts:
    """One InfiniBand / RoCE port as sysfs shows it (nic_source.py).

    The four counters NVIDIA's NIC monitor treats as fatal on any increase are reported as the
    increase the agent saw since it started watching the port (the raw counters carry history from
    before the boot's first job); the three judged by rate are errors per minute over the agent's
    window. A counter pinned at its maximum (the classic counters are 4-16 bits wide and stop there)
    has neither: it is named in ``saturated``.
    """

    device: str
    port: int
    state: str | None = None  # ACTIVE, DOWN, INIT, ARMED
    phys_state: str | None = None  # LinkUp, Disabled, Polling, ...
    link_layer: str | None = None  # InfiniBand, Ethernet
    netdev: str | None = None
    oper_state: str | None = None  # the netdev's operstate (RoCE; EFA hard-codes state ACTIVE)
    link_downed: int | None = None
    local_link_integrity_errors: int | None = None
    excessive_buffer_overrun_errors: int | None = None
    rnr_nak_retry_errors: int | None = None
    symbol_errors_per_min: float | None = None
    link_error_recovery_per_min: float | None = None
    port_rcv_errors_per_min: float | None = None
    saturated: tuple[str, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """One merged sample of every source, as the publisher sees it."""

    time: datetime
    nvml: NvmlStatus
    devices: tuple[DeviceFacts, ...] = ()
    sources: tuple[SourceName, ...] = ("nvml",)
    nics: tuple[NicPortFacts, ...] = ()
    # Whether the devices' pods were read from the kubelet (pod_resources.py); None: not configured to.
    pod_resources: PodResources | None = None
