"""Pure model of one node for `kubectl gpuhealth describe`: everything on-call needs, as a JSON-able dict.

Built from the Node, its GPUNodeHealth report, the governing GPUHealthPolicy and gpuhealth's Events;
``describe -o json`` prints it as is, and :mod:`gpuhealth.cli.render` turns it into text.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from gpuhealth.api.device_facts import DEVICE_FACTS
from gpuhealth.api.devices import DeviceRecord
from gpuhealth.api.names import (
    CONDITION_TYPE,
    GPU_OUT_TAINT_KEY,
    LEASE_SAMPLED_AT_ANNOTATION,
    QUARANTINE_ANNOTATION,
    RELEASE_ANNOTATION,
    STATE_LABEL,
    TAINT_KEY,
    State,
)
from gpuhealth.api.nodes import node_gpus
from gpuhealth.api.ownership import Ownership
from gpuhealth.api.policy import Policy, PolicyError, parse_policy
from gpuhealth.api.report import Report, ReportError, parse_report
from gpuhealth.api.slow_policy import Topology
from gpuhealth.api.status import StoredStatus
from gpuhealth.api.timeutil import format_time, parse_time
from gpuhealth.catalog import xid as catalog
from gpuhealth.cli.fabricview import fabric_view
from gpuhealth.cli.ladderview import ladder_view, node_validation_view, repairs_view

MAX_XIDS = 20
MAX_EVENTS = 10


def _age(t: dt.datetime | None, now: dt.datetime) -> float | None:
    return None if t is None else round(max(0.0, (now - t).total_seconds()), 1)


def _device(d: Mapping[str, Any]) -> dict[str, Any]:
    """One GPU: the scalar facts describe shows (api/device_facts.py), then the structured ones."""
    temp = d.get("temperature") or {}
    return {
        "index": d.get("index"),
        **{f.key: d.get(f.key, f.default) for f in DEVICE_FACTS if f.shown},
        "temperature": {"currentC": temp.get("currentC"), "slowdownC": temp.get("slowdownC")},
        "ecc": dict(d.get("ecc") or {}) or None,
        "remappedRows": dict(d.get("remappedRows") or {}) or None,
        "retiredPages": dict(d.get("retiredPages") or {}) or None,
        "unsupported": list(d.get("unsupported") or []),
    }


def xid_meaning(code: Any) -> dict[str, Any]:
    """Catalog line for an XID as reported (tolerates codes outside the catalog's range)."""
    try:
        entry = catalog.lookup(int(code))
    except (TypeError, ValueError):
        return {"meaning": f"XID {code!r} (not a valid code)", "catalogAction": None, "application": False}
    return {
        "meaning": catalog.describe(entry.code),
        "catalogAction": entry.default_action,
        "application": entry.application_error,
    }


def _xids(events: Iterable[Mapping[str, Any]], cleared: dt.datetime | None, now: dt.datetime) -> list[dict[str, Any]]:
    """The newest XIDs first, each with its catalog meaning and whether a release cleared it."""
    rows = []
    for e in events:
        t = parse_time(e.get("time"))
        rows.append(
            {
                "xid": e.get("xid"),
                "gpu": e.get("gpu"),
                "uuid": e.get("uuid"),
                "time": e.get("time"),
                "ageSeconds": _age(t, now),
                "source": e.get("source"),
                "detail": e.get("detail"),
                **xid_meaning(e.get("xid")),
                "cleared": bool(cleared is not None and t is not None and t <= cleared),
            }
        )
    epoch = "0000"
    rows.sort(key=lambda r: str(r["time"] or epoch), reverse=True)
    return rows[:MAX_XIDS]


def _failures(records: Iterable[DeviceRecord], now: dt.datetime) -> list[dict[str, Any]]:
    """Per GPU with a failure on record (``lastFailures``): the last one and the interval before it."""
    out = []
    for r in records:
        times = r.last_failures[-2:]
        if not times:
            continue
        out.append(
            {
                "gpu": r.index,
                "lastFailure": format_time(times[-1]),
                "lastFailureAgeSeconds": _age(times[-1], now),
                "previousIntervalSeconds": _age(times[0], times[1]) if len(times) == 2 else None,
            }
        )
    return out


def _verdict(r: DeviceRecord) -> dict[str, Any]:
    """One GPU's verdict as written (``status.devices[]``), absent facts as None."""
    return {
        "index": r.index,
        "uuid": r.uuid or None,
        "state": str(r.state),
        "reason": r.reason or None,
        "since": _t(r.since),
        "rule": r.rule or None,
        "taintRule": r.taint_rule or None,
        "heldByBreaker": r.held_by_breaker or None,
        # held out on a device-plugin node: how new work is kept off it (no DeviceTaintRule)
        "keptOffBy": r.kept_off_by or None,
        # every rule of a MIG or partitionable GPU (the previous version wrote only taintRule)
        "taintRules": list(r.taint_rules),
    }


def _t(t: dt.datetime | None) -> str | None:
    return None if t is None else format_time(t)


def _marks(node: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if node is None:
        return None
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    annotations = meta.get("annotations") or {}
    taints = list(spec.get("taints") or [])
    ours = next((t for t in taints if t.get("key") == TAINT_KEY), None)
    owned = Ownership.parse(annotations.get(QUARANTINE_ANNOTATION))
    cordoned = bool(spec.get("unschedulable"))
    if not cordoned:
        cordon_owner = None
    elif owned is not None and owned.cordon:
        cordon_owner = "gpuhealth"
    else:
        cordon_owner = "someone else"
    cond = next(
        (c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == CONDITION_TYPE), None
    )
    return {
        "taint": dict(ours) if ours else None,
        # gpuhealth's gpu-out taint: a GPU held out on a device-plugin node the plugin does not withhold
        "gpuOutTaint": next((dict(t) for t in taints if t.get("key") == GPU_OUT_TAINT_KEY), None),
        "otherTaints": [
            f"{t.get('key')}={t.get('value') or ''}:{t.get('effect')}"
            for t in taints
            if t is not ours and t.get("key") != GPU_OUT_TAINT_KEY
        ],
        "cordoned": cordoned,
        "cordonOwner": cordon_owner,
        "ownership": None
        if owned is None
        else {
            "reason": owned.reason,
            "taint": owned.taint,
            "cordon": owned.cordon,
            "since": owned.since or None,
            "liftedByOthers": list(owned.lifted_by_others),
            "taintOnly": owned.taint_only,  # held under spec.actions.cordon: false
        },
        "stateLabel": (meta.get("labels") or {}).get(STATE_LABEL),
        "condition": None
        if cond is None
        else {k: cond.get(k) for k in ("status", "reason", "message", "lastTransitionTime")},
        "releaseRequested": annotations.get(RELEASE_ANNOTATION),
    }


def _events(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The last ``MAX_EVENTS`` of gpuhealth's Events, oldest first."""
    epoch = dt.datetime.min.replace(tzinfo=dt.UTC)
    keyed = []
    for e in events:
        precise = str(e.get("eventTime") or "")
        created = (e.get("metadata") or {}).get("creationTimestamp")
        when = str(e.get("lastTimestamp") or precise or e.get("firstTimestamp") or created or "")
        row = {
            "time": when or None,
            "type": e.get("type"),
            "reason": e.get("reason"),
            "message": e.get("message"),
            "count": e.get("count") or 1,
        }
        # lastTimestamp has second precision; eventTime (microseconds) orders events within a second.
        keyed.append(((parse_time(when) or epoch, parse_time(precise) or epoch), row))
    keyed.sort(key=lambda kv: kv[0])
    return [row for _, row in keyed[-MAX_EVENTS:]]


def _report(obj: Mapping[str, Any] | None) -> Report | None:
    """The report as the operator reads it (``parse_report``); None when there is none or the operator
    would refuse it."""
    if obj is None:
        return None
    try:
        return parse_report(obj)
    except ReportError:
        return None


def _policy(obj: Mapping[str, Any] | None) -> Policy | None:
    if obj is None:
        return None
    try:
        return parse_policy(obj)
    except PolicyError:
        return None


def describe_node(
    name: str,
    node: Mapping[str, Any] | None,
    report: Mapping[str, Any] | None,
    policy: Mapping[str, Any] | None,
    events: Iterable[Mapping[str, Any]],
    now: dt.datetime,
    lease: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``describe`` model; ``policy`` is the GPUHealthPolicy named in the report's status, if any;
    ``lease`` the agent's heartbeat Lease (its renewal is the heartbeat; the report is written only on
    change)."""
    spec: Mapping[str, Any] = (report or {}).get("spec") or {}
    status = StoredStatus.of(report)
    rec = status.record
    renewed = parse_time(((lease or {}).get("spec") or {}).get("renewTime"))
    sampled = parse_time(
        (((lease or {}).get("metadata") or {}).get("annotations") or {}).get(LEASE_SAMPLED_AT_ANNOTATION)
    )
    heartbeat = max((t for t in (parse_time(spec.get("heartbeatTime")), renewed) if t is not None), default=None)
    parsed = _policy(policy)
    agent = spec.get("agent") or {}
    nvml = spec.get("nvml") or {}
    total = status.total_gpus
    if not total:
        total = node_gpus(node)
    history: dict[str, Any] = {
        "quarantines": [format_time(t) for t in rec.quarantines],
        "healthySince": _t(rec.healthy_since),
        "clearedBefore": _t(rec.cleared_before),
        "heldByBreaker": rec.held_by_breaker,
        "drainAction": rec.drain_action or None,
    }
    if parsed is not None:
        history["flapping"] = {"maxQuarantines": parsed.flapping_max, "windowSeconds": parsed.flapping_window_s}
        history["probationSeconds"] = parsed.probation_s
        if rec.healthy_since is not None and status.state == State.RECOVERING:
            left = parsed.probation_s - (now - rec.healthy_since).total_seconds()
            history["probationLeftSeconds"] = round(max(0.0, left), 1)
    return {
        "node": name,
        "generatedAt": format_time(now),
        "nodeExists": node is not None,
        "hasReport": report is not None,
        "state": None if status.state is None else str(status.state),
        "reason": rec.reason or None,
        "message": rec.message or None,
        "since": _t(rec.since),
        "ageSeconds": _age(rec.since, now),
        "policy": status.policy,
        "policyMode": None if policy is None else ((policy.get("spec") or {}).get("mode") or "Enforce"),
        "overriddenPolicies": list(status.overridden_policies),
        "dryRun": status.dry_run,
        "gpus": {"healthy": status.healthy_gpus, "total": total, "inService": status.in_service_gpus},
        "gpuVerdicts": [_verdict(r) for r in status.devices.values()],
        "gpuFailures": _failures(status.devices.values(), now),
        "deviceDrains": {str(i): dict(d) for i, d in status.device_drains.items()} or None,
        "lastXid": status.last_xid,
        "clockSkew": dict(status.clock_skew) if status.clock_skew else None,
        "agent": {
            "version": agent.get("version"),
            "sources": list(agent.get("sources") or []),
            "bootTime": agent.get("bootTime"),
            "heartbeatTime": spec.get("heartbeatTime"),
            "leaseRenewTime": None if renewed is None else format_time(renewed),
            "heartbeatAgeSeconds": _age(heartbeat, now),
            "observedTime": spec.get("observedTime"),
            "nvmlAvailable": nvml.get("available"),
            "nvmlError": nvml.get("error"),
            "nvmlUnresponsive": dict(nvml["unresponsive"]) if isinstance(nvml.get("unresponsive"), Mapping) else None,
            "sampleAgeSeconds": _age(sampled, now),
            "driverVersion": nvml.get("driverVersion"),
            "cudaVersion": nvml.get("cudaVersion"),
        },
        "devices": [_device(d) for d in sorted(spec.get("devices") or [], key=lambda d: d.get("index") or 0)],
        "xids": _xids(spec.get("xidEvents") or [], rec.cleared_before, now),
        "fabric": fabric_view(_report(report), spec),
        "evidence": [e.to_status() for e in status.evidence],
        "marks": _marks(node),
        "history": history,
        "drain": dict(status.drain) or None,
        "remediation": ladder_view(status.ladders, parsed, now),
        "nodeValidation": node_validation_view(status.node_validation, now),
        "repairs": repairs_view(status.repairs),
        "topology": _topology(node, parsed),
        "events": _events(events),
    }


def _topology(node: Mapping[str, Any] | None, policy: Policy | None) -> dict[str, Any]:
    """The node's NVLink domain and rack, by the labels its policy names (spec.topology)."""
    topo = policy.topology if policy is not None else Topology()
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    return {
        "domainLabel": topo.domain_label,
        "domain": labels.get(topo.domain_label),
        "rackLabel": topo.rack_label,
        "rack": labels.get(topo.rack_label),
    }
