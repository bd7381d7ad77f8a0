"""The fabric's part of a GPUNodeHealth report: a GPU's ``nvlink``, ``fabric``, ``pcie`` and ``clocks``, and
the node's ``nics`` (``crds/gpunodehealths.yaml``), one type each, which the agent fills and the operator
parses.

Facts only, as the agent saw them; what they mean for scheduling is the operator's (evaluation/). Each
field is declared once, with its report key, schema and whether the operator reads it (``api/wire.py``):
the agent's writer and its "significant change" filter (``agent/report_fabric.py``), the parsers here,
the field table (``api/report_fields.py``) and the CRD (``hack/gen_crds.py``) all take it from there.
``api/report.py`` ``parse_report`` calls the parsers and turns :class:`FieldError` into its ``ReportError``.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpuhealth.api import fabric
from gpuhealth.api.wire import FieldError as FieldError
from gpuhealth.api.wire import parse_fields, wire

_INT: Final = {"type": "integer", "minimum": 0}
_LINKS: Final = {**_INT, "maximum": fabric.NVLINK_MAX_LINKS}
_LAST_LINK: Final = fabric.NVLINK_MAX_LINKS - 1
_PERCENT: Final = {**_INT, "maximum": 100}
_RATE: Final = {"type": "number", "minimum": 0}
_LINK_TELEMETRY: Final = "telemetry: climbs on healthy links"

# Rates (errors per minute) are compared by bucket, so a rate wandering inside one does not rewrite the
# report; the edges hold NVIDIA's NIC monitor thresholds (120/h = 2/min, 5/min, 10/s = 600/min).
RATE_EDGES_PER_MIN: Final = (0.0, 0.1, 1.0, 2.0, 5.0, 10.0, 60.0, 600.0, 6000.0)
THROTTLE_STEP_PCT: Final = 10


def rate_bucket(value: float | None) -> int | None:
    return None if value is None else bisect_right(RATE_EDGES_PER_MIN, value)


def pct_bucket(value: int | None) -> int:
    """A duty cycle by tenths; not measured yet (the agent's first sample) counts as the lowest, so
    that the measurement arriving is no new fact unless it says the GPU is throttled."""
    return 0 if value is None else value // THROTTLE_STEP_PCT


# ---- the typed facts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NvLink:
    """``spec.devices[].nvlink``: links that exist and are active, the slowest active link's speed, the
    GPUs of the node it reaches over NVLink (None: not known), Blackwell's failed link recoveries. The
    error counters are sums over the links and telemetry (they climb on healthy links; BER never decides
    anything): written along, but a change of them alone is no new fact. ``recovery_failed`` is."""

    links: int | None = wire("links", _LINKS, "Links that exist (NVML_NVLINK_CAP_VALID).")
    active: int | None = wire("active", _LINKS)
    inactive_links: tuple[int, ...] = wire(
        "inactiveLinks",
        {
            "type": "array",
            "maxItems": fabric.NVLINK_MAX_LINKS,
            "items": {**_INT, "maximum": fabric.NVLINK_MAX_LINKS - 1},
        },
        dropped="for humans: links and active are what is judged",
        default=(),
    )
    speed_mbps: int | None = wire("speedMBps", _INT, "The slowest active link.")
    version: int | None = wire("version", _INT, "NVML's nvmlNvlinkVersion_t (6: NVLink 4.0).", dropped="for humans")
    peers: tuple[int, ...] | None = wire(
        "peers",
        {"type": "array", "maxItems": 64, "items": {**_INT, "maximum": 63}},
        "GPUs of this node reached over NVLink (the peers a DrainP2P involves).",
    )
    replay_errors: int | None = wire("replayErrors", _INT, dropped=_LINK_TELEMETRY, telemetry=True)
    recovery_errors: int | None = wire("recoveryErrors", _INT, dropped=_LINK_TELEMETRY, telemetry=True)
    crc_errors: int | None = wire("crcErrors", _INT, dropped=_LINK_TELEMETRY, telemetry=True)
    recovery_successful: int | None = wire(
        "recoverySuccessful", _INT, dropped="telemetry: a recovery that succeeded left the link up", telemetry=True
    )
    recovery_failed: int | None = wire("recoveryFailed", _INT)
    recovery_total: int | None = wire(
        "recoveryTotal", _INT, dropped="telemetry: recoveryFailed is the fault", telemetry=True
    )
    remote_device_types: tuple[str, ...] = wire(
        "remoteDeviceTypes",
        {
            "type": "array",
            "maxItems": 4,
            "items": {"type": "string", "enum": tuple(fabric.NVLINK_DEVICE_TYPES.values())},
        },
        "What the links reach (nvmlDeviceGetNvLinkRemoteDeviceType), each kind once: GPU (directly), Switch "
        "(an NVSwitch), IBMNPU, Unknown.",
        dropped="for humans: links and active are what is judged",
        default=(),
    )

    @property
    def inactive(self) -> int | None:
        return None if self.links is None or self.active is None else max(0, self.links - self.active)


_FABRIC_MASK = "decoded into its sub-fields, which are read"
# The health mask's sub-fields, each a field of Fabric of the same name.
_HEALTH: Final = tuple(f.name for f in dataclasses.fields(fabric.FabricHealth))


@dataclass(frozen=True)
class Fabric:
    """``spec.devices[].fabric``: the fabric probe and its health, the mask already decoded per sub-field
    (None: the sub-field is not supported). :meth:`decoded` makes it of what NVML answered."""

    state: fabric.FabricState | None = wire("state", {"type": "string", "enum": tuple(fabric.FABRIC_STATES.values())})
    status: int | None = wire("status", _INT, "The probe's NVML return code, only once Completed (0 success).")
    cluster_uuid: str = wire("clusterUuid", {"type": "string", "maxLength": 36}, default="")
    clique_id: int | None = wire("cliqueId", _INT)
    health_mask: int | None = wire(
        "healthMask", _INT, "The raw mask; a non-zero mask is no fault.", dropped=_FABRIC_MASK
    )
    health_summary: fabric.HealthSummary | None = wire(
        "healthSummary", {"type": "string", "enum": tuple(fabric.HEALTH_SUMMARIES.values())}
    )
    degraded_bandwidth: bool | None = wire(fabric.DEGRADED_BW.report, {"type": "boolean"})
    route_recovery: bool | None = wire(fabric.ROUTE_RECOVERY.report, {"type": "boolean"})
    route_unhealthy: bool | None = wire(fabric.ROUTE_UNHEALTHY.report, {"type": "boolean"})
    access_timeout_recovery: bool | None = wire(fabric.ACCESS_TIMEOUT_RECOVERY.report, {"type": "boolean"})
    incorrect_configuration: fabric.IncorrectConfiguration | None = wire(
        fabric.INCORRECT_CONFIGURATION.report, {"type": "string", "enum": fabric.INCORRECT_CONFIGURATION_VALUES}
    )
    partition_assigned: bool | None = wire(
        fabric.PARTITION_ASSIGNED.report, {"type": "boolean"}, dropped="informational: no fault either way"
    )

    @classmethod
    def decoded(
        cls,
        state: int,
        status: int | None = None,
        cluster_uuid: str | None = None,
        clique_id: int | None = None,
        health_mask: int | None = None,
        health_summary: int | None = None,
    ) -> Fabric:
        """The facts of what nvmlDeviceGetGpuFabricInfoV (or DCGM) answered: the state and summary by name
        (None: a value NVML does not define), the mask decoded per sub-field (api/fabric.py)."""
        health = fabric.FabricHealth() if health_mask is None else fabric.decode_health_mask(health_mask)
        return cls(
            state=fabric.fabric_state(state),
            status=status,
            cluster_uuid=cluster_uuid or "",
            clique_id=clique_id,
            health_mask=health_mask,
            health_summary=None if health_summary is None else fabric.health_summary(health_summary),
            **{name: getattr(health, name) for name in _HEALTH},
        )

    @property
    def health(self) -> fabric.FabricHealth:
        """The sub-fields as api/fabric.py decodes a mask (this type's fields of the same names)."""
        return fabric.FabricHealth(**{name: getattr(self, name) for name in _HEALTH})

    @property
    def faults(self) -> tuple[str, ...]:
        """Sub-fields that say something is wrong (``routeUnhealthy``, ...); empty: none does."""
        return self.health.faults

    @property
    def probe_failed(self) -> bool:
        """The probe completed with an error status."""
        return self.state == "Completed" and self.status not in (None, 0)

    @property
    def clique(self) -> str:
        """``<clusterUuid>.<cliqueId>``, as GPU Feature Discovery's ``nvidia.com/gpu.clique`` label; "" unknown."""
        return f"{self.cluster_uuid}.{self.clique_id}" if self.cluster_uuid and self.clique_id is not None else ""


@dataclass(frozen=True)
class Pcie:
    """``spec.devices[].pcie``; ``generation`` is the last one read while the GPU was busy (the link drops
    its generation when idle, which is no fault and must not rewrite the report); replays are telemetry."""

    width: int | None = wire("width", _INT)
    max_width: int | None = wire("maxWidth", _INT)
    generation: int | None = wire("generation", _INT)
    max_generation: int | None = wire("maxGeneration", _INT)
    replays: int | None = wire("replays", _INT, dropped="telemetry: climbs on healthy links", telemetry=True)

    @property
    def downtrained(self) -> bool:
        """Narrower or slower than the link can be (a fact, not a verdict)."""
        narrow = self.width is not None and self.max_width is not None and self.width < self.max_width
        slow = self.generation is not None and self.max_generation is not None and self.generation < self.max_generation
        return narrow or slow


@dataclass(frozen=True)
class Clocks:
    """``spec.devices[].clocks``: percent of the last ``window_s`` seconds throttled, per cause, from NVML's
    accumulated-nanoseconds fields (269-271): a duty cycle, not one sample of the reasons. Not measured yet
    (the agent's first sample): all None. A duty cycle counts as a new fact when it moves by a tenth."""

    window_s: int | None = wire("throttleWindowS", _INT, telemetry=True)
    sw_thermal_pct: int | None = wire("swThermalPercent", _PERCENT, bucket=pct_bucket)
    hw_thermal_pct: int | None = wire("hwThermalPercent", _PERCENT, bucket=pct_bucket)
    hw_power_brake_pct: int | None = wire("hwPowerBrakePercent", _PERCENT, bucket=pct_bucket)


# A GPU's fabric objects: each its key under spec.devices[] (and the attribute of the agent's DeviceFacts and
# the operator's Device holding it) and its type.
DEVICE_PARTS: Final[tuple[tuple[str, type], ...]] = (
    ("nvlink", NvLink),
    ("fabric", Fabric),
    ("pcie", Pcie),
    ("clocks", Clocks),
)

_NAME: Final = {"type": "string", "maxLength": 64}
_STATE: Final = {"type": "string", "maxLength": 32}


@dataclass(frozen=True)
class NicPort:
    """``spec.nics[]``: one InfiniBand / RoCE port as sysfs shows it. The four counters fatal on any
    increase hold the increase since the agent started watching (the raw counters carry history from
    before the boot's first job); the ``*_per_min`` rates are over the agent's window, compared by bucket;
    ``saturated`` names counters pinned at their maximum (their rate is unknown, not zero). Which sysfs
    counter fills which field: :data:`NIC_COUNTERS`."""

    device: str = wire("device", _NAME, required=True)
    port: int = wire("port", {**_INT, "maximum": 255}, required=True)
    state: str = wire("state", _STATE, default="")  # ACTIVE, DOWN, INIT, ARMED
    phys_state: str = wire("physState", _STATE, default="")  # LinkUp, Disabled, Polling, ...
    link_layer: str = wire("linkLayer", _STATE, default="")  # InfiniBand, Ethernet
    netdev: str = wire("netdev", _NAME, dropped="for humans; operState is the netdev's state", default="")
    oper_state: str = wire("operState", _STATE, default="")  # the netdev's (RoCE; EFA hard-codes ACTIVE)
    link_downed: int | None = wire("linkDowned", _INT)
    local_link_integrity_errors: int | None = wire("localLinkIntegrityErrors", _INT)
    excessive_buffer_overrun_errors: int | None = wire("excessiveBufferOverrunErrors", _INT)
    rnr_nak_retry_errors: int | None = wire("rnrNakRetryErrors", _INT)
    symbol_errors_per_min: float | None = wire("symbolErrorsPerMin", _RATE, bucket=rate_bucket, digits=2)
    link_error_recovery_per_min: float | None = wire("linkErrorRecoveryPerMin", _RATE, bucket=rate_bucket, digits=2)
    port_rcv_errors_per_min: float | None = wire("portRcvErrorsPerMin", _RATE, bucket=rate_bucket, digits=2)
    saturated: tuple[str, ...] = wire(
        "saturated", {"type": "array", "maxItems": 16, "items": {"type": "string", "maxLength": 64}}, default=()
    )

    @property
    def label(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def down(self) -> bool:
        """The port is not ACTIVE, or its netdev (RoCE) is not up."""
        return (bool(self.state) and self.state != "ACTIVE") or (bool(self.oper_state) and self.oper_state != "up")


@dataclass(frozen=True)
class NicCounter:
    """One sysfs counter of a port (``<port>/<directory>/<name>``) and the :class:`NicPort` field it fills."""

    name: str  # sysfs's name, also the agent's metric label and the operator's findings' word
    directory: str  # counters, hw_counters
    bits: int  # the InfiniBand PortCounters attribute's width: a counter pinned at its maximum is saturated
    attr: str  # the NicPort attribute: the increase since the agent started (fatal), else errors per minute
    fatal: bool  # any increase is fatal (NVIDIA's NIC monitor); otherwise judged by its rate


# The one table of the NIC counters: which the agent reads, how wide, and what the operator judges by.
NIC_COUNTERS: Final = (
    NicCounter("link_downed", "counters", 8, "link_downed", fatal=True),
    NicCounter("local_link_integrity_errors", "counters", 4, "local_link_integrity_errors", fatal=True),
    NicCounter("excessive_buffer_overrun_errors", "counters", 4, "excessive_buffer_overrun_errors", fatal=True),
    NicCounter("rnr_nak_retry_err", "hw_counters", 64, "rnr_nak_retry_errors", fatal=True),
    NicCounter("symbol_error", "counters", 16, "symbol_errors_per_min", fatal=False),
    NicCounter("link_error_recovery", "counters", 8, "link_error_recovery_per_min", fatal=False),
    NicCounter("port_rcv_errors", "counters", 16, "port_rcv_errors_per_min", fatal=False),
)
FATAL_NIC_COUNTERS: Final = tuple(c for c in NIC_COUNTERS if c.fatal)
RATE_NIC_COUNTERS: Final = tuple(c for c in NIC_COUNTERS if not c.fatal)


# ---- parsing ------------------------------------------------------------------------------------------


def _obj(v: Any, where: str) -> Mapping[str, Any] | None:
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise FieldError(f"{where}: must be an object")
    return v


def parse_nvlink(v: Any, where: str) -> NvLink | None:
    m = _obj(v, where)
    return None if m is None else parse_fields(NvLink, m, where)


def parse_fabric(v: Any, where: str) -> Fabric | None:
    m = _obj(v, where)
    return None if m is None else parse_fields(Fabric, m, where)


def parse_pcie(v: Any, where: str) -> Pcie | None:
    m = _obj(v, where)
    return None if m is None else parse_fields(Pcie, m, where)


def parse_clocks(v: Any, where: str) -> Clocks | None:
    m = _obj(v, where)
    return None if m is None else parse_fields(Clocks, m, where)


def parse_nics(v: Any, where: str) -> tuple[NicPort, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise FieldError(f"{where}: must be a list")
    out: list[NicPort] = []
    seen: set[tuple[str, int]] = set()
    for i, item in enumerate(v):
        at = f"{where}[{i}]"
        m = _obj(item, at)
        assert m is not None
        if not m.get("device") or m.get("port") is None:
            raise FieldError(f"{at}: device and port are required")
        port = parse_fields(NicPort, m, at)
        if (port.device, port.port) in seen:
            raise FieldError(f"{at}: duplicate port {port.label}")
        seen.add((port.device, port.port))
        out.append(port)
    return tuple(sorted(out, key=lambda n: (n.device, n.port)))
