"""The fabric between GPUs for `kubectl gpuhealth describe`: per GPU its NVLinks (active against what the
operator holds them to), NVLink peers, fabric state and decoded health, PCIe, throttle reasons split
and duty cycle; per node its NICs. A JSON-able model (``fabric_view``) and its text (``fabric_lines``).

What is judged is read as the operator reads it, through ``parse_report``: the NVLinks each GPU is held
to (``api/nvlink_expectation.py``, the one expectation ``NVLinkDegraded`` judges by), the fabric health
sub-fields that say something is wrong and the clock-event reasons. Beside them the model keeps the
agent's objects as written, with what the typed report drops as for humans only (which links are
down, PCIe replays, a NIC's netdev). A report the operator cannot parse shows those objects alone.
Whether the facts take capacity out is the operator's verdict, shown elsewhere in ``describe``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuhealth.api import fabric
from gpuhealth.api.nvlink_expectation import LinkExpectation, expected_nvlinks
from gpuhealth.api.report import Device, Report
from gpuhealth.cli.render import table


def _fabric_faults(d: Device | None) -> list[str]:
    """The health sub-fields that say something is wrong; the configuration's with what is wrong."""
    f = d.fabric if d is not None else None
    if f is None:
        return []
    config = fabric.INCORRECT_CONFIGURATION.report
    out = [k for k in f.faults if k != config]
    if f.incorrect_configuration not in (None, "None"):
        out.append(f"{config}={f.incorrect_configuration}")
    return out


def device_fabric(
    written: Mapping[str, Any], device: Device | None, expected: Mapping[int, LinkExpectation]
) -> dict[str, Any]:
    """One GPU's fabric facts, for ``describe -o json``: ``written`` the agent's device object, ``device``
    the same GPU parsed (None: the report could not be)."""
    nvlink = dict(written.get("nvlink") or {})
    held_to = expected.get(device.index) if device is not None else None
    return {
        "index": written.get("index"),
        "nvlink": nvlink or None,
        "nvlinkExpected": held_to.links if nvlink and held_to is not None else None,
        "fabric": dict(written.get("fabric") or {}) or None,
        "fabricFaults": _fabric_faults(device),
        "pcie": dict(written.get("pcie") or {}) or None,
        "clockReasons": list(device.clock_reasons) if device is not None else [],
        "clocks": dict(written.get("clocks") or {}) or None,
    }


def fabric_view(report: Report | None, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The fabric part of ``describe``: ``report`` parsed (None: it could not be), ``spec`` as written."""
    written = sorted(spec.get("devices") or [], key=lambda d: d.get("index") or 0)
    expected = expected_nvlinks(report) if report is not None else {}
    return {
        "devices": [
            device_fabric(d, report.device(d.get("index")) if report is not None else None, expected) for d in written
        ],
        "nics": [dict(n) for n in spec.get("nics") or []],
    }


# ---- text --------------------------------------------------------------------------------------------


def _nvlink_text(g: Mapping[str, Any]) -> str:
    n = g.get("nvlink")
    if not n:
        return "-"
    expected = g.get("nvlinkExpected")
    text = f"{n.get('active', '?')}/{expected if expected is not None else n.get('links', '?')} active"
    if n.get("inactiveLinks"):
        text += f" (down: {','.join(str(i) for i in n['inactiveLinks'])})"
    if n.get("speedMBps"):
        text += f" {n['speedMBps']}MB/s"
    if n.get("recoveryFailed"):
        text += f" {n['recoveryFailed']} failed recoveries"
    return text


def _peers_text(g: Mapping[str, Any]) -> str:
    n = g.get("nvlink") or {}
    peers = n.get("peers")
    return "?" if peers is None and n else ",".join(str(p) for p in peers or []) or "-"


def _fabric_text(g: Mapping[str, Any]) -> str:
    f = g.get("fabric")
    if not f:
        return "-"
    text = str(f.get("state") or "?")
    if f.get("status"):
        text += f" (probe error {f['status']})"
    if f.get("cliqueId") is not None and f.get("clusterUuid"):
        text += f" clique {f['clusterUuid']}.{f['cliqueId']}"
    if f.get("healthSummary"):
        text += f" {f['healthSummary']}"
    faults = g.get("fabricFaults") or []
    return text + (f" [{', '.join(faults)}]" if faults else "")


def _pcie_text(g: Mapping[str, Any]) -> str:
    p = g.get("pcie")
    if not p:
        return "-"
    width = f"x{p.get('width', '?')}/x{p.get('maxWidth', '?')}"
    gen = f"gen{p.get('generation', '?')}/{p.get('maxGeneration', '?')}"
    text = f"{width} {gen}"
    if p.get("replays"):
        text += f" {p['replays']} replays"
    return text


def _throttle_text(g: Mapping[str, Any]) -> str:
    shown = [r for r in g.get("clockReasons") or [] if r != "GpuIdle"]
    c = g.get("clocks") or {}
    duty = [
        f"{name} {c[key]}%"
        for name, key in (
            ("SW thermal", "swThermalPercent"),
            ("HW thermal", "hwThermalPercent"),
            ("power brake", "hwPowerBrakePercent"),
        )
        if c.get(key)
    ]
    text = ",".join(shown) or "-"
    if duty:
        text += f" ({', '.join(duty)} of {c.get('throttleWindowS', '?')}s)"
    return text


def _rate(v: Any) -> str:
    return "-" if v is None else f"{v:g}"


def fabric_lines(view: Mapping[str, Any] | None) -> list[str]:
    """The "Fabric" and "NICs" sections of ``describe``; nothing when the agent reported neither."""
    if not view:
        return []
    gpus = [g for g in view.get("devices") or [] if any(g.get(k) for k in ("nvlink", "fabric", "pcie", "clocks"))]
    lines: list[str] = []
    if gpus:
        rows = [
            [
                str(g.get("index")),
                _nvlink_text(g),
                _peers_text(g),
                _fabric_text(g),
                _pcie_text(g),
                _throttle_text(g),
            ]
            for g in gpus
        ]
        lines += ["", "Fabric (NVLink active/expected, peers over NVLink, fabric, PCIe now/max, throttling):"]
        lines += table(["GPU", "NVLINK", "PEERS", "FABRIC", "PCIE", "THROTTLE"], rows, indent="  ")
    nics = view.get("nics") or []
    if nics:
        rows = [
            [
                f"{n.get('device')}/{n.get('port')}",
                str(n.get("state") or "-") + (f" ({n['physState']})" if n.get("physState") else ""),
                str(n.get("linkLayer") or "-"),
                f"{n['netdev']} {n.get('operState') or '?'}" if n.get("netdev") else "-",
                "/".join(
                    str(n.get(k, "-"))
                    for k in (
                        "linkDowned",
                        "localLinkIntegrityErrors",
                        "excessiveBufferOverrunErrors",
                        "rnrNakRetryErrors",
                    )
                ),
                "/".join(
                    _rate(n.get(k)) for k in ("symbolErrorsPerMin", "linkErrorRecoveryPerMin", "portRcvErrorsPerMin")
                ),
                ",".join(n.get("saturated") or []) or "-",
            ]
            for n in nics
        ]
        lines += ["", "NICs (increases since the agent started; rates per minute):"]
        lines += table(
            ["PORT", "STATE", "LINK", "NETDEV", "DOWNED/INTEGRITY/OVERRUN/RNR", "SYMBOL/RECOVERY/RCV", "SATURATED"],
            rows,
            indent="  ",
        )
    return lines
