"""The fabric between GPUs for `kubectl gpuhealth describe`: per GPU its NVLinks (active against what its
peers of the same model have), NVLink peers, fabric state and decoded health, PCIe, throttle reasons split
and duty cycle; per node its NICs. A JSON-able model (``fabric_view``) and its text (``fabric_lines``).

Facts as the agent reported them; whether they take capacity out is the operator's verdict, shown
elsewhere in ``describe``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuhealth.api import fabric
from gpuhealth.cli.render import table

_BOOLEAN_FAULTS = tuple(f.report for f in fabric.BOOLEAN_FIELDS)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def expected_links(devices: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Per GPU model, the NVLinks each GPU of that model is held to: the operator's own expectation
    (``api/fabric.py``, ``nvlink_expectation``), so describe's "active/expected" is what the verdict
    judged."""
    gpus = (
        (str(d.get("model") or ""), _int(n.get("links")), _int(n.get("active")))
        for d in devices
        if isinstance(n := d.get("nvlink"), Mapping)
    )
    return {model: links for model, (links, _) in fabric.nvlink_expectation(gpus).items()}


def _fabric_faults(f: Mapping[str, Any]) -> list[str]:
    out = [k for k in _BOOLEAN_FAULTS if f.get(k) is True]
    config = f.get("incorrectConfiguration")
    if config not in (None, "None"):
        out.append(f"incorrectConfiguration={config}")
    return out


def device_fabric(d: Mapping[str, Any], expected: Mapping[str, int]) -> dict[str, Any]:
    """One GPU's fabric facts, for ``describe -o json``."""
    nvlink = dict(d.get("nvlink") or {})
    fab = dict(d.get("fabric") or {})
    reasons = d.get("clockEventReasons")
    return {
        "index": d.get("index"),
        "nvlink": nvlink or None,
        "nvlinkExpected": expected.get(str(d.get("model") or "")) if nvlink else None,
        "fabric": fab or None,
        "fabricFaults": _fabric_faults(fab),
        "pcie": dict(d.get("pcie") or {}) or None,
        "clockReasons": list(fabric.clock_reasons(reasons)) if isinstance(reasons, int) else [],
        "clocks": dict(d.get("clocks") or {}) or None,
    }


def fabric_view(spec: Mapping[str, Any]) -> dict[str, Any]:
    devices = sorted(spec.get("devices") or [], key=lambda d: d.get("index") or 0)
    expected = expected_links(devices)
    return {
        "devices": [device_fabric(d, expected) for d in devices],
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
