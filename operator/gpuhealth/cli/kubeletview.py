"""Pure model and text of the kubelet's own view of each held-out GPU, for `kubectl gpuhealth describe`.

For each GPU gpuhealth holds out (``status.devices[]`` out of service), the pods that hold it: those
the agent's report names under it (``spec.devices[].pods`` and its MIG devices', the kubelet's
pod-resources API; for a GPU only some of whose MIG instances are out, those instances' pods) and,
for a DRA GPU with a MIG layout, the pods of its held-out instances (``miglayout.py``, from the
claims). The plugin reads each pod, and per container shows the kubelet's health of that GPU's
devices from ``allocatedResourcesStatus`` (:mod:`gpuhealth.api.kubelet_health`) beside gpuhealth's
verdict. A device matches by the GPU's UUID or one of its MIG UUIDs (a replica's ``::<n>`` off), or
by one of the DRA devices the GPU's record holds out.

A pod that is gone, or that the user may not read (403), is a row saying so, never a failure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuhealth.api.devices import DeviceRecord
from gpuhealth.api.kubelet_health import HEALTHY, allocated_resources_status, worst
from gpuhealth.api.report import Device, Report, ReportError, parse_report
from gpuhealth.api.status import StoredStatus
from gpuhealth.cli.render import table

NOT_REPORTED = "not reported by the kubelet"
GONE = "pod not found (gone)"


@dataclass(frozen=True)
class PodLookup:
    """What reading one pod gave: the pod, or nothing (``pod`` None: it does not exist), or ``error``
    (the API refused, e.g. 403 for a user without pods get in that namespace)."""

    pod: Mapping[str, Any] | None = None
    error: str = ""


def _report(report: Mapping[str, Any] | None) -> Report | None:
    if report is None:
        return None
    try:
        return parse_report(report)
    except ReportError:
        return None


def _ids(record: DeviceRecord, device: Device | None) -> list[str]:
    """The device IDs that name the held-out part of the GPU: its MIG instances held out on their own,
    else its UUID and every MIG UUID; and the DRA devices its record holds out."""
    if record.instances:
        ids = list(record.instances)
    else:
        ids = [u for u in (record.uuid or (device.uuid if device else ""),) if u]
        ids += [m.uuid for m in (device.mig_devices if device else ()) if m.uuid]
    return sorted({*ids, *record.devices})


def _holders(record: DeviceRecord, rep: Report | None, layout: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    device = rep.device(record.index) if rep else None
    if device is not None:
        if record.instances:
            holds = [p for m in device.mig_devices if m.uuid in record.instances for p in m.pods]
        else:
            holds = list(rep.holders(record.index)) if rep else []
        for p in holds:
            out.setdefault(
                (p.namespace, p.name, p.container),
                {"namespace": p.namespace, "name": p.name, "container": p.container, "resource": p.resource},
            )
    for g in layout:
        if g.get("gpu") != record.index:
            continue
        for inst in g.get("instances") or []:
            if not inst.get("heldOut"):
                continue
            for key in inst.get("pods") or []:
                ns, _, name = str(key).partition("/")
                if name and not any(k[:2] == (ns, name) for k in out):
                    out[(ns, name, "")] = {"namespace": ns, "name": name, "container": None, "resource": None}
    return [out[k] for k in sorted(out)]


def held_out_holders(
    report: Mapping[str, Any] | None, layout: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """Per GPU held out, by index: its verdict, the device IDs that name it and the pods known to hold
    it (``container`` None where only the pod is known)."""
    records = [r for r in StoredStatus.of(report).devices.values() if r.out_of_service]
    rep = _report(report)
    out = []
    for r in sorted(records, key=lambda r: r.index):
        device = rep.device(r.index) if rep else None
        out.append(
            {
                "gpu": r.index,
                "uuid": r.uuid or (device.uuid if device else "") or None,
                "state": str(r.state),
                "reason": r.reason or None,
                "instancesOnly": bool(r.instances),
                "deviceIds": _ids(r, device),
                "pods": _holders(r, rep, layout),
            }
        )
    return out


def pods_to_read(held: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Each pod to read once: (namespace, name), sorted."""
    return sorted({(str(p["namespace"]), str(p["name"])) for g in held for p in g.get("pods") or []})


def _kubelet(pod: Mapping[str, Any], container: str | None, ids: set[str]) -> dict[str, Any]:
    """The kubelet's health of the GPU's devices in ``container`` of ``pod`` (any container when None)."""
    reported = allocated_resources_status(pod, container)
    if reported is None:
        return {"health": None, "note": NOT_REPORTED}
    mine = [h for h in reported if h.device in ids or h.resource_id in ids]
    if not mine:
        return {"health": None, "note": f"{NOT_REPORTED} for this GPU (it reports other devices)"}
    return {
        "health": worst(h.health for h in mine),
        "containers": sorted({h.container for h in mine}),
        "resourceIds": sorted({h.resource_id for h in mine}),
        "messages": sorted({h.message for h in mine if h.message}),
        "note": None,
    }


def kubelet_view(
    held: Iterable[Mapping[str, Any]], lookups: Mapping[tuple[str, str], PodLookup]
) -> list[dict[str, Any]]:
    """One row per held-out GPU and pod holding it (container): gpuhealth's verdict, the kubelet's
    health of that GPU (``kubelet.health`` None with a ``note`` where it cannot be told); JSON-able."""
    rows = []
    for g in held:
        ids = set(g.get("deviceIds") or [])
        for p in g.get("pods") or []:
            found = lookups.get((str(p["namespace"]), str(p["name"])), PodLookup(error="not read"))
            if found.error:
                kubelet: dict[str, Any] = {"health": None, "note": f"cannot read the pod: {found.error}"}
            elif found.pod is None:
                kubelet = {"health": None, "note": GONE}
            else:
                kubelet = _kubelet(found.pod, p.get("container"), ids)
            rows.append(
                {
                    "gpu": g.get("gpu"),
                    "uuid": g.get("uuid"),
                    "gpuhealth": {"state": g.get("state"), "reason": g.get("reason")},
                    "namespace": p["namespace"],
                    "name": p["name"],
                    "container": p.get("container") or None,
                    "resource": p.get("resource") or None,
                    "kubelet": kubelet,
                }
            )
    return rows


def _verdict(v: Mapping[str, Any]) -> str:
    return f"{v.get('state') or '-'}" + (f" ({v['reason']})" if v.get("reason") else "")


def _health(k: Mapping[str, Any]) -> str:
    if k.get("health") is None:
        return str(k.get("note") or NOT_REPORTED)
    text = str(k["health"])
    if k.get("messages"):
        text += f": {'; '.join(k['messages'])}"
    return text


def kubelet_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The describe section; nothing when no pod is known to hold a held-out GPU."""
    if not rows:
        return []
    lines = [
        "",
        "Pods on held-out GPUs (the kubelet's health of the GPU, allocatedResourcesStatus, beside gpuhealth's):",
    ]
    body = [
        [
            str(r.get("gpu")),
            _verdict(r.get("gpuhealth") or {}),
            f"{r.get('namespace')}/{r.get('name')}",
            r.get("container") or ",".join((r.get("kubelet") or {}).get("containers") or []) or "-",
            _health(r.get("kubelet") or {}),
        ]
        for r in rows
    ]
    lines += table(["GPU", "GPUHEALTH", "POD", "CONTAINER", "KUBELET"], body, indent="  ")
    if any((r.get("kubelet") or {}).get("health") == HEALTHY for r in rows):
        lines.append(
            "  Healthy: the device plugin has not seen this fault (it cannot see ECC, row remapping, heat, NVLink, "
            "fabric or PCIe faults, and skips application XIDs); gpuhealth's verdict stands"
        )
    if any((r.get("kubelet") or {}).get("note") == NOT_REPORTED for r in rows):
        lines.append(
            f"  {NOT_REPORTED}: the container's status has no allocatedResourcesStatus (feature gate "
            "ResourceHealthStatus off, or a kubelet without it)"
        )
    return lines
