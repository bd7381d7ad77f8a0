"""Typed view of the fabric's part of a GPUNodeHealth report: a GPU's ``nvlink``, ``fabric``, ``pcie`` and
``clocks``, and the node's ``nics`` (``crds/gpunodehealths.yaml``; written by ``agent/report_fabric.py``).

Facts only, as the agent saw them; what they mean for scheduling is the operator's (evaluation/).
``api/report.py`` ``parse_report`` calls these and turns :class:`FieldError` into its ``ReportError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from gpuhealth.api import fabric


class FieldError(ValueError):
    """A fabric field of a report that cannot be trusted (``parse_report`` refuses the report)."""


# ---- the typed facts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NvLink:
    """``spec.devices[].nvlink``: links that exist and are active, the slowest active link's speed, the
    GPUs of the node it reaches over NVLink (None: not known), Blackwell's failed link recoveries."""

    links: int | None = None
    active: int | None = None
    speed_mbps: int | None = None
    peers: tuple[int, ...] | None = None
    recovery_failed: int | None = None

    @property
    def inactive(self) -> int | None:
        return None if self.links is None or self.active is None else max(0, self.links - self.active)


@dataclass(frozen=True)
class Fabric:
    """``spec.devices[].fabric``: the fabric probe and its health, the mask already decoded per sub-field
    (None: the sub-field is not supported)."""

    state: fabric.FabricState | None = None
    status: int | None = None
    cluster_uuid: str = ""
    clique_id: int | None = None
    health_summary: fabric.HealthSummary | None = None
    degraded_bandwidth: bool | None = None
    route_recovery: bool | None = None
    route_unhealthy: bool | None = None
    access_timeout_recovery: bool | None = None
    incorrect_configuration: fabric.IncorrectConfiguration | None = None

    @property
    def health(self) -> fabric.FabricHealth:
        return fabric.FabricHealth(
            degraded_bandwidth=self.degraded_bandwidth,
            route_recovery=self.route_recovery,
            route_unhealthy=self.route_unhealthy,
            access_timeout_recovery=self.access_timeout_recovery,
            incorrect_configuration=self.incorrect_configuration,
        )

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
    """``spec.devices[].pcie``; ``generation`` is the last one read while the GPU was busy."""

    width: int | None = None
    max_width: int | None = None
    generation: int | None = None
    max_generation: int | None = None

    @property
    def downtrained(self) -> bool:
        """Narrower or slower than the link can be (a fact, not a verdict)."""
        narrow = self.width is not None and self.max_width is not None and self.width < self.max_width
        slow = self.generation is not None and self.max_generation is not None and self.generation < self.max_generation
        return narrow or slow


@dataclass(frozen=True)
class Clocks:
    """``spec.devices[].clocks``: percent of the last ``window_s`` seconds throttled, per cause."""

    window_s: int | None = None
    sw_thermal_pct: int | None = None
    hw_thermal_pct: int | None = None
    hw_power_brake_pct: int | None = None


@dataclass(frozen=True)
class NicPort:
    """``spec.nics[]``: one InfiniBand / RoCE port. The four counters fatal on any increase hold the
    increase since the agent started watching; the ``*_per_min`` rates are over the agent's window;
    ``saturated`` names counters pinned at their maximum (their rate is unknown, not zero)."""

    device: str
    port: int
    state: str = ""
    phys_state: str = ""
    link_layer: str = ""
    oper_state: str = ""
    link_downed: int | None = None
    local_link_integrity_errors: int | None = None
    excessive_buffer_overrun_errors: int | None = None
    rnr_nak_retry_errors: int | None = None
    symbol_errors_per_min: float | None = None
    link_error_recovery_per_min: float | None = None
    port_rcv_errors_per_min: float | None = None
    saturated: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def down(self) -> bool:
        """The port is not ACTIVE, or its netdev (RoCE) is not up."""
        return (bool(self.state) and self.state != "ACTIVE") or (bool(self.oper_state) and self.oper_state != "up")


# ---- parsing ------------------------------------------------------------------------------------------


def _obj(v: Any, where: str) -> Mapping[str, Any] | None:
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise FieldError(f"{where}: must be an object")
    return v


def _int(v: Any, where: str, maximum: int | None = None) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (maximum is not None and v > maximum):
        bound = f"0..{maximum}" if maximum is not None else "a non-negative integer"
        raise FieldError(f"{where}: expected {bound}, got {v!r}")
    return v


def _num(v: Any, where: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise FieldError(f"{where}: expected a non-negative number, got {v!r}")
    return float(v)


def _bool(v: Any, where: str) -> bool | None:
    if v is None:
        return None
    if not isinstance(v, bool):
        raise FieldError(f"{where}: expected a boolean, got {v!r}")
    return v


def _str(v: Any, where: str) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise FieldError(f"{where}: expected a string, got {v!r}")
    return v


def _enum(v: Any, where: str, allowed: Any) -> Any:
    if v is None:
        return None
    if v not in set(allowed):
        raise FieldError(f"{where}: {v!r} is not one of {sorted(set(allowed))}")
    return v


def _ints(v: Any, where: str, maximum: int) -> tuple[int, ...] | None:
    if v is None:
        return None
    if not isinstance(v, (list, tuple)):  # a tuple: the operator's slim cache shares lists so
        raise FieldError(f"{where}: must be a list")
    return tuple(sorted({cast(int, _int(x, f"{where}[{i}]", maximum)) for i, x in enumerate(v)}))


def parse_nvlink(v: Any, where: str) -> NvLink | None:
    m = _obj(v, where)
    if m is None:
        return None
    return NvLink(
        links=_int(m.get("links"), f"{where}.links", fabric.NVLINK_MAX_LINKS),
        active=_int(m.get("active"), f"{where}.active", fabric.NVLINK_MAX_LINKS),
        speed_mbps=_int(m.get("speedMBps"), f"{where}.speedMBps"),
        peers=_ints(m.get("peers"), f"{where}.peers", 63),
        recovery_failed=_int(m.get("recoveryFailed"), f"{where}.recoveryFailed"),
    )


def parse_fabric(v: Any, where: str) -> Fabric | None:
    m = _obj(v, where)
    if m is None:
        return None
    return Fabric(
        state=_enum(m.get("state"), f"{where}.state", fabric.FABRIC_STATES.values()),
        status=_int(m.get("status"), f"{where}.status"),
        cluster_uuid=_str(m.get("clusterUuid"), f"{where}.clusterUuid"),
        clique_id=_int(m.get("cliqueId"), f"{where}.cliqueId"),
        health_summary=_enum(m.get("healthSummary"), f"{where}.healthSummary", fabric.HEALTH_SUMMARIES.values()),
        degraded_bandwidth=_bool(m.get("degradedBandwidth"), f"{where}.degradedBandwidth"),
        route_recovery=_bool(m.get("routeRecovery"), f"{where}.routeRecovery"),
        route_unhealthy=_bool(m.get("routeUnhealthy"), f"{where}.routeUnhealthy"),
        access_timeout_recovery=_bool(m.get("accessTimeoutRecovery"), f"{where}.accessTimeoutRecovery"),
        incorrect_configuration=_enum(
            m.get("incorrectConfiguration"),
            f"{where}.incorrectConfiguration",
            [*fabric.INCORRECT_CONFIGURATIONS.values(), fabric.UNKNOWN_CONFIGURATION],
        ),
    )


def parse_pcie(v: Any, where: str) -> Pcie | None:
    m = _obj(v, where)
    if m is None:
        return None
    return Pcie(
        width=_int(m.get("width"), f"{where}.width"),
        max_width=_int(m.get("maxWidth"), f"{where}.maxWidth"),
        generation=_int(m.get("generation"), f"{where}.generation"),
        max_generation=_int(m.get("maxGeneration"), f"{where}.maxGeneration"),
    )


def parse_clocks(v: Any, where: str) -> Clocks | None:
    m = _obj(v, where)
    if m is None:
        return None
    return Clocks(
        window_s=_int(m.get("throttleWindowS"), f"{where}.throttleWindowS"),
        sw_thermal_pct=_int(m.get("swThermalPercent"), f"{where}.swThermalPercent", 100),
        hw_thermal_pct=_int(m.get("hwThermalPercent"), f"{where}.hwThermalPercent", 100),
        hw_power_brake_pct=_int(m.get("hwPowerBrakePercent"), f"{where}.hwPowerBrakePercent", 100),
    )


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
        device = _str(m.get("device"), f"{at}.device")
        port = _int(m.get("port"), f"{at}.port", 255)
        if not device or port is None:
            raise FieldError(f"{at}: device and port are required")
        if (device, port) in seen:
            raise FieldError(f"{at}: duplicate port {device}/{port}")
        seen.add((device, port))
        saturated = m.get("saturated")
        if saturated is not None and (
            not isinstance(saturated, (list, tuple)) or not all(isinstance(s, str) for s in saturated)
        ):
            raise FieldError(f"{at}.saturated: must be a list of counter names")
        out.append(
            NicPort(
                device=device,
                port=port,
                state=_str(m.get("state"), f"{at}.state"),
                phys_state=_str(m.get("physState"), f"{at}.physState"),
                link_layer=_str(m.get("linkLayer"), f"{at}.linkLayer"),
                oper_state=_str(m.get("operState"), f"{at}.operState"),
                link_downed=_int(m.get("linkDowned"), f"{at}.linkDowned"),
                local_link_integrity_errors=_int(m.get("localLinkIntegrityErrors"), f"{at}.localLinkIntegrityErrors"),
                excessive_buffer_overrun_errors=_int(
                    m.get("excessiveBufferOverrunErrors"), f"{at}.excessiveBufferOverrunErrors"
                ),
                rnr_nak_retry_errors=_int(m.get("rnrNakRetryErrors"), f"{at}.rnrNakRetryErrors"),
                symbol_errors_per_min=_num(m.get("symbolErrorsPerMin"), f"{at}.symbolErrorsPerMin"),
                link_error_recovery_per_min=_num(m.get("linkErrorRecoveryPerMin"), f"{at}.linkErrorRecoveryPerMin"),
                port_rcv_errors_per_min=_num(m.get("portRcvErrorsPerMin"), f"{at}.portRcvErrorsPerMin"),
                saturated=tuple(sorted(saturated or ())),
            )
        )
    return tuple(sorted(out, key=lambda n: (n.device, n.port)))
