"""The fabric's part of the GPUNodeHealth ``spec``: a GPU's ``nvlink``, ``fabric``, ``pcie`` and ``clocks``,
and the node's ``nics``; and which of their changes are new facts.

Counters that tick on healthy hardware (NVLink replay/CRC errors, link recoveries that succeeded, PCIe
replays) are telemetry: written along when the report is written anyway, never a reason to write it.
What counts: a link going down, a peer lost, the fabric's state or health, a PCIe link that trained
narrower or slower, a throttle duty cycle moving by a tenth of the window, a NIC port's state, any
increase of a counter that is fatal on increase, a rate crossing into another bucket. That keeps a
thousand agents from writing every sample.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from gpuhealth.agent.model import DeviceFacts, FabricFacts, NicPortFacts, NvLinkFacts, PcieFacts, ThrottleFacts
from gpuhealth.api import fabric

_MAX_NICS = 32
_MAX_NAME = 64
# Rates (errors per minute) are compared by bucket, so a rate wandering inside one does not rewrite the
# report; the edges hold NVIDIA's NIC monitor thresholds (120/h = 2/min, 5/min, 10/s = 600/min).
RATE_EDGES_PER_MIN = (0.0, 0.1, 1.0, 2.0, 5.0, 10.0, 60.0, 600.0, 6000.0)
THROTTLE_STEP_PCT = 10


def _compact(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None and v != []}


def nvlink_spec(n: NvLinkFacts) -> dict[str, Any]:
    return _compact(
        {
            "links": n.links,
            "active": n.active,
            "inactiveLinks": list(n.inactive),
            "speedMBps": n.speed_mbps,
            "version": n.version,
            "peers": None if n.peers is None else list(n.peers),
            "replayErrors": n.replay_errors,
            "recoveryErrors": n.recovery_errors,
            "crcErrors": n.crc_errors,
            "recoverySuccessful": n.recovery_successful,
            "recoveryFailed": n.recovery_failed,
            "recoveryTotal": n.recovery_total,
        }
    )


def fabric_spec(f: FabricFacts) -> dict[str, Any]:
    out = _compact(
        {
            "state": fabric.fabric_state(f.state),
            "status": f.status,
            "clusterUuid": f.cluster_uuid,
            "cliqueId": f.clique_id,
            "healthMask": f.health_mask,
            "healthSummary": None if f.health_summary is None else fabric.health_summary(f.health_summary),
        }
    )
    if f.health_mask is not None:
        out.update(fabric.health_fields(fabric.decode_health_mask(f.health_mask)))
    return out


def pcie_spec(p: PcieFacts) -> dict[str, Any]:
    return _compact(
        {
            "width": p.width,
            "maxWidth": p.max_width,
            "generation": p.generation,
            "maxGeneration": p.max_generation,
            "replays": p.replays,
        }
    )


def clocks_spec(t: ThrottleFacts) -> dict[str, Any]:
    return _compact(
        {
            "throttleWindowS": t.window_s,
            "swThermalPercent": t.sw_thermal_pct,
            "hwThermalPercent": t.hw_thermal_pct,
            "hwPowerBrakePercent": t.hw_power_brake_pct,
        }
    )


def device_fabric_spec(device: DeviceFacts) -> dict[str, Any]:
    """The fabric objects of one ``spec.devices[]`` entry (those the GPU answered)."""
    out: dict[str, Any] = {}
    if device.nvlink is not None:
        out["nvlink"] = nvlink_spec(device.nvlink)
    if device.fabric is not None:
        out["fabric"] = fabric_spec(device.fabric)
    if device.pcie is not None and (pcie := pcie_spec(device.pcie)):
        out["pcie"] = pcie
    if device.throttle is not None and device.throttle.window_s > 0 and (clocks := clocks_spec(device.throttle)):
        out["clocks"] = clocks
    return out


def _rate(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def nic_spec(n: NicPortFacts) -> dict[str, Any]:
    return _compact(
        {
            "device": n.device[:_MAX_NAME],
            "port": n.port,
            "state": n.state,
            "physState": n.phys_state,
            "linkLayer": n.link_layer,
            "netdev": None if n.netdev is None else n.netdev[:_MAX_NAME],
            "operState": n.oper_state,
            "linkDowned": n.link_downed,
            "localLinkIntegrityErrors": n.local_link_integrity_errors,
            "excessiveBufferOverrunErrors": n.excessive_buffer_overrun_errors,
            "rnrNakRetryErrors": n.rnr_nak_retry_errors,
            "symbolErrorsPerMin": _rate(n.symbol_errors_per_min),
            "linkErrorRecoveryPerMin": _rate(n.link_error_recovery_per_min),
            "portRcvErrorsPerMin": _rate(n.port_rcv_errors_per_min),
            "saturated": sorted(n.saturated),
        }
    )


def nics_spec(nics: tuple[NicPortFacts, ...]) -> list[dict[str, Any]]:
    return [nic_spec(n) for n in sorted(nics, key=lambda n: (n.device, n.port))[:_MAX_NICS]]


# ---- what counts as a change -------------------------------------------------------------------------


def rate_bucket(value: float | None) -> int | None:
    return None if value is None else bisect_right(RATE_EDGES_PER_MIN, value)


def _pct_bucket(value: int | None) -> int:
    """A duty cycle by tenths; not measured yet (the agent's first sample) counts as the lowest, so
    that the measurement arriving is no new fact unless it says the GPU is throttled."""
    return 0 if value is None else value // THROTTLE_STEP_PCT


def significant_fabric(device: DeviceFacts) -> DeviceFacts:
    """``device`` with the fabric's telemetry neutralised, for comparing two samples."""
    n, p, t = device.nvlink, device.pcie, device.throttle
    return device.replace(
        nvlink=None
        if n is None
        else NvLinkFacts(
            links=n.links,
            active=n.active,
            inactive=n.inactive,
            speed_mbps=n.speed_mbps,
            version=n.version,
            peers=n.peers,
            recovery_failed=n.recovery_failed,
        ),
        pcie=None if p is None else PcieFacts(p.width, p.max_width, p.generation, p.max_generation, None),
        throttle=None
        if t is None
        else ThrottleFacts(
            window_s=0,
            sw_thermal_pct=_pct_bucket(t.sw_thermal_pct),
            hw_thermal_pct=_pct_bucket(t.hw_thermal_pct),
            hw_power_brake_pct=_pct_bucket(t.hw_power_brake_pct),
        ),
    )


def significant_nic(n: NicPortFacts) -> tuple[Any, ...]:
    return (
        n.device,
        n.port,
        n.state,
        n.phys_state,
        n.link_layer,
        n.netdev,
        n.oper_state,
        n.link_downed,
        n.local_link_integrity_errors,
        n.excessive_buffer_overrun_errors,
        n.rnr_nak_retry_errors,
        rate_bucket(n.symbol_errors_per_min),
        rate_bucket(n.link_error_recovery_per_min),
        rate_bucket(n.port_rcv_errors_per_min),
        tuple(sorted(n.saturated)),
    )


def nics_changed(prev: tuple[NicPortFacts, ...], cur: tuple[NicPortFacts, ...]) -> bool:
    return {(n.device, n.port): significant_nic(n) for n in prev} != {
        (n.device, n.port): significant_nic(n) for n in cur
    }
