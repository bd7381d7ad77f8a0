"""Pure model and text of a node's MIG layout for `kubectl gpuhealth describe`: per MIG-enabled or
partitioned GPU, its instances, their profile and IDs, which are held out and the pods on each.

Which DRA devices are one GPU is the operator's own mapping (``actions/gpudevices.py``), and which
pods hold a device is the one the device drain uses (``drain/claims.py``): the view shows exactly
what gpuhealth acts on. An instance row joins three sources:

- the node's ResourceSlices: the DRA device (``gpu-2-mig-3g40gb-9-0``), its profile and MIG UUID;
- the agent's report (``spec.devices[].migDevices``): GPU and compute instance IDs, matched to the
  device by MIG UUID; an instance the slices do not publish is still listed, without a device;
- the GPU's record (``status.devices[]``): the instance is held out when its device is among the
  record's ``devices`` while the GPU is out of service, by the rule of that device.

Pods come from ResourceClaims (``status.allocation.devices.results`` and ``status.reservedFor``) and
the node's pods. A partitionable GPU (DynamicMIG) publishes every possible placement; only the
allocated ones and its full device, when allocated, are rows, the others a count. A GPU whose MIG
devices are ``nvidia.com/mig-*`` extended resources (device plugin) has no per-device API: its
instances come from the report alone and its pods are listed for the GPU's node as a whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuhealth.actions.devicetaints import rule_name
from gpuhealth.actions.gpudevices import devices_of_gpu
from gpuhealth.actions.slices import SlimDevice, slim_slice
from gpuhealth.api.devices import DeviceRecord, DeviceRef, DeviceState
from gpuhealth.api.report import MIG_ENABLED, Device, MigDevice, ReportError, parse_report
from gpuhealth.api.status import StoredStatus
from gpuhealth.cli.render import table
from gpuhealth.drain.claims import claim_devices, pods_holding

PLUGIN_PREFIX = "nvidia.com/mig-"
PLUGIN_NOTE = "device plugin (nvidia.com/mig-* resources): no per-device API, so pods cannot be told apart per instance"


def _devices(report: Mapping[str, Any] | None) -> tuple[Device, ...]:
    """The report's GPUs, read through the report's typed parse; none when it cannot be read (the
    operator refuses such a report too, with an Event)."""
    if report is None:
        return ()
    try:
        return parse_report(report).devices
    except ReportError:
        return ()


def _mig_enabled(d: Device) -> bool:
    return d.mig_mode == MIG_ENABLED or bool(d.mig_devices)


def _partition(d: Mapping[str, Any]) -> bool:
    attrs = d.get("attributes") or {}
    kind = (attrs.get("type") or {}).get("string") if isinstance(attrs.get("type"), Mapping) else None
    return kind == "mig" or "parentUUID" in attrs


def wanted(report: Mapping[str, Any] | None, slices: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the node has a layout to show: a MIG-enabled GPU in the report or a partition device
    in its slices (then the claims and pods are worth listing)."""
    if any(_mig_enabled(d) for d in _devices(report)):
        return True
    return any(_partition(d) for s in slices for d in (s.get("spec") or {}).get("devices") or [])


def _plugin_pods(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """The node's pods that ask for a device-plugin MIG resource (``nvidia.com/mig-3g.40gb``)."""
    out = []
    for p in pods:
        containers = [
            *((p.get("spec") or {}).get("containers") or []),
            *((p.get("spec") or {}).get("initContainers") or []),
        ]
        asks = {
            k
            for c in containers
            for part in ("limits", "requests")
            for k in ((c.get("resources") or {}).get(part) or {})
            if k.startswith(PLUGIN_PREFIX)
        }
        if asks:
            m = p.get("metadata") or {}
            out.append(f"{m.get('namespace', '')}/{m.get('name', '')} ({', '.join(sorted(asks))})")
    return sorted(out)


def _ids(m: MigDevice | None) -> dict[str, Any]:
    if m is None:
        return {"gpuInstanceId": None, "computeInstanceId": None}
    return {"gpuInstanceId": m.gpu_instance, "computeInstanceId": m.compute_instance}


def _held(record: DeviceRecord | None, ref: DeviceRef) -> tuple[bool, str | None]:
    """Whether the GPU's record holds ``ref`` out, and the DeviceTaintRule that does."""
    if record is None or record.state == DeviceState.IN_SERVICE:
        return False, None
    if str(ref) not in record.devices:
        return False, None
    name = rule_name(ref)
    return True, name if name in record.taint_rules else None


def _gpu(
    node: str,
    d: Device,
    record: DeviceRecord | None,
    slim: list[Any],
    by_ref: Mapping[DeviceRef, SlimDevice],
    drivers: Sequence[str],
    reported: Sequence[str],
    claims: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    allocated: set[DeviceRef],
) -> dict[str, Any] | None:
    index, uuid, migs = d.index, d.uuid, d.mig_devices
    found = devices_of_gpu(slim, node, drivers, index, uuid, reported)
    gpu: dict[str, Any] = {"gpu": index, "uuid": uuid or None, "migMode": d.mig_mode or None, "instances": []}
    if not found.partitions and not _mig_enabled(d):
        return None
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    free = free_held = 0
    for ref in found.refs:
        dev = by_ref.get(ref)
        partition = ref in found.partitions
        placement = bool(dev and dev.counter_sets and not dev.uuid)
        if (placement or not partition) and ref not in allocated:
            if partition:
                free += 1
                free_held += _held(record, ref)[0]
            continue  # an unallocated placement, or the partitionable GPU's idle full device
        mig = next((m for m in migs if dev and dev.uuid and m.uuid == dev.uuid), None)
        if mig is not None:
            seen.add(mig.uuid)
        held, rule = _held(record, ref)
        rows.append(
            {
                "device": ref.device,
                "profile": (dev.profile if dev else "")
                or (mig.profile if mig else None)
                or ("whole GPU" if not partition else None),
                **_ids(mig),
                "migUuid": (dev.uuid if dev and partition else None) or None,
                "heldOut": held,
                "taintRule": rule,
                "pods": sorted(pods_holding([ref], claims, pods)),
            }
        )
    for m in migs:
        if m.uuid and m.uuid in seen:
            continue
        rows.append(
            {
                "device": None,
                "profile": m.profile or None,
                **_ids(m),
                "migUuid": m.uuid or None,
                "heldOut": bool(record and m.uuid in record.instances),
                "taintRule": None,
                "pods": [],
            }
        )
    gpu["instances"] = rows
    if found.refs or found.conflict:
        gpu["via"] = "dra"
        gpu["freePlacements"] = free
        gpu["freePlacementsHeldOut"] = free_held
        if found.conflict:
            gpu["note"] = found.reason
        elif not found.partitions:
            gpu["note"] = "the ResourceSlices publish no MIG device of this GPU (they may lag a new MIG layout)"
    else:
        gpu["via"] = "device-plugin"
        gpu["note"] = PLUGIN_NOTE
        gpu["pluginPods"] = _plugin_pods(pods)
    return gpu


def mig_layout(
    node: str,
    report: Mapping[str, Any] | None,
    slices: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    drivers: Sequence[str],
) -> list[dict[str, Any]]:
    """One entry per GPU with a layout (see the module docstring), by GPU index; JSON-able."""
    records = StoredStatus.of(report).devices
    slim = [slim_slice(s) for s in slices]
    by_ref = {DeviceRef(s.driver, s.pool, dv.name): dv for s in slim for dv in s.devices}
    claims, pods = list(claims), list(pods)
    allocated = {ref for c in claims for ref in claim_devices(c)}
    devices = _devices(report)  # by GPU index
    reported = [d.uuid for d in devices if d.uuid]
    out = []
    for d in devices:
        g = _gpu(node, d, records.get(d.index), slim, by_ref, drivers, reported, claims, pods, allocated)
        if g is not None:
            out.append(g)
    return out


# -- text ------------------------------------------------------------------------------------------


def _cell(v: Any) -> str:
    return "-" if v is None or v == "" else str(v)


def _held_cell(i: Mapping[str, Any]) -> str:
    if not i.get("heldOut"):
        return "no"
    return f"HELD OUT ({i['taintRule']})" if i.get("taintRule") else "HELD OUT"


def layout_lines(layout: Sequence[Mapping[str, Any]], errors: Sequence[str] = ()) -> list[str]:
    """The "MIG layout" section of describe; nothing when no GPU has one."""
    if not layout and not errors:
        return []
    lines = ["", "MIG layout (each instance, whether it is held out, the pods on it):"]
    lines += [f"  (incomplete: {e})" for e in errors]
    for g in layout:
        head = f"  GPU {_cell(g.get('gpu'))}" + (f" ({g['uuid']})" if g.get("uuid") else "")
        head += f": MIG {_cell(g.get('migMode'))}"
        head += ", DRA devices" if g.get("via") == "dra" else ""
        lines.append(head)
        if g.get("note"):
            lines.append(f"    {g['note']}")
        rows = [
            [
                _cell(i.get("device")),
                _cell(i.get("profile")),
                _cell(i.get("gpuInstanceId")),
                _cell(i.get("computeInstanceId")),
                _cell(i.get("migUuid")),
                _held_cell(i),
                ", ".join(i.get("pods") or []) or ("?" if g.get("via") == "device-plugin" else "-"),
            ]
            for i in g.get("instances") or []
        ]
        if rows:
            lines += table(["DEVICE", "PROFILE", "GI", "CI", "MIG UUID", "HELD", "PODS"], rows, indent="    ")
        else:
            lines.append("    (no instance allocated or reported)")
        if g.get("freePlacements"):
            held = g.get("freePlacementsHeldOut") or 0
            text = f"    {g['freePlacements']} more placements published, none allocated"
            lines.append(text + (f", {held} of them held out" if held else ""))
        if g.get("via") == "device-plugin":
            pods = g.get("pluginPods") or []
            lines.append(f"    pods of the node on nvidia.com/mig-*: {', '.join(pods) if pods else 'none'}")
    return lines
