"""Pure text for `kubectl gpuhealth describe`: one node in detail (the MIG layout is miglayout.py's,
the repair sections repair_text.py's).

Shares the table, age and colour helpers of render.py; like it, reads nothing from the terminal.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from typing import Any

from gpuhealth.api.device_facts import DEVICE_FACTS, Fact
from gpuhealth.api.devices import KEPT_OFF_WORDS
from gpuhealth.api.durations import format_duration
from gpuhealth.api.names import BURN_IN_TAINT_KEY, OUT_OF_SERVICE, QUARANTINE_ANNOTATION, TAINT_KEY, State
from gpuhealth.api.timeutil import parse_time
from gpuhealth.cli.fabricview import fabric_lines
from gpuhealth.cli.kubeletview import kubelet_lines
from gpuhealth.cli.miglayout import layout_lines
from gpuhealth.cli.render import (
    STATE_COLORS,
    WARNING_COLOR,
    age_of,
    field,
    human_age,
    paint,
    paint_state,
    shown,
    skew_text,
    table,
)
from gpuhealth.cli.repair_text import ladder_lines, node_validation_lines, repair_lines

# -- describe ----------------------------------------------------------------------------------------


def _rules(v: Mapping[str, Any]) -> str:
    """The GPU's DeviceTaintRule, or its first and how many more (a MIG or partitionable GPU); on a
    device-plugin node (no rule), how new work is kept off it."""
    if v.get("keptOffBy") in KEPT_OFF_WORDS:
        return f"- ({KEPT_OFF_WORDS[v['keptOffBy']]})"
    rules = [str(r) for r in v.get("taintRules") or ([v["taintRule"]] if v.get("taintRule") else [])]
    if not rules:
        return "-"
    return rules[0] + (f" (+{len(rules) - 1} more)" if len(rules) > 1 else "")


def _temp(d: Mapping[str, Any]) -> str:
    t = d.get("temperature") or {}
    cur, slow = t.get("currentC"), t.get("slowdownC")
    if cur is None:
        return "-"
    return f"{cur}C" + (f" (slowdown {slow}C)" if slow is not None else "")


def _ecc(d: Mapping[str, Any]) -> str:
    ecc = d.get("ecc")
    if not ecc:
        return "-"
    return f"{shown(ecc.get('volatileUncorrected'), '0')}/{shown(ecc.get('aggregateUncorrected'), '0')}"


def _remap(d: Mapping[str, Any]) -> str:
    rows = d.get("remappedRows")
    if not rows:
        return "-"
    text = f"{shown(rows.get('corrected'), '0')}/{shown(rows.get('uncorrected'), '0')}"
    flags = [f for f, on in (("pending", rows.get("pending")), ("FAILED", rows.get("failure"))) if on]
    pages = d.get("retiredPages") or {}
    if pages.get("pending"):
        flags.append("page-retire pending")
    return text + (f" {','.join(flags)}" if flags else "")


_FIXED = ("IDX", "UUID", "MODEL", "TEMP", "ECC-UNC(VOL/AGG)", "REMAP(C/U)")  # the Devices table's own columns
_COLUMNS = tuple(f for f in DEVICE_FACTS if f.label)


def _fact_cell(fact: Fact, value: Any) -> str:
    """A fact's cell in the Devices table: a boolean by its flag texts, a number with its unit."""
    if isinstance(value, bool) and fact.flag != ("", ""):
        return fact.flag[0] if value else fact.flag[1]
    text = shown(value)
    return text + fact.unit if fact.unit and text != "-" else text


def _words(key: str) -> str:
    """camelCase -> "Camel case"."""
    text = re.sub(r"(?<=[a-z0-9])([A-Z])", r" \1", key).lower()
    return text[:1].upper() + text[1:]


_DRAIN_LABELS = {
    "phase": "Phase",
    "total": "Pods total",
    "podsTotal": "Pods total",
    "waitingForCheckpoint": "Waiting for checkpoint",
    "evicted": "Evicted",
    "blockedByBudget": "Blocked by budget",
    "fatal": "Fatal fault",
    "startedAt": "Started at",
    "completedAt": "Completed at",
}


def _drain_value(value: Any) -> str:
    if isinstance(value, list):
        if all(isinstance(x, str) for x in value):
            return f"{len(value)}: {', '.join(value)}" if value else "0"
        return f"{len(value)}: {json.dumps(value, separators=(',', ':'))}"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), sort_keys=True) if value else "none"
    return shown(value)


def _per_item(value: Mapping[str, Any]) -> list[str]:
    """A map of records (e.g. ``pods``: uid -> {pod, evictedAt, ...}), one line each, named by ``pod``."""
    out = []
    for key, item in sorted(value.items(), key=lambda kv: str(kv[1].get("pod") or kv[0])):
        name = str(item.get("pod") or key)
        rest = ", ".join(f"{k}={_drain_value(v)}" for k, v in sorted(item.items()) if k != "pod")
        out.append(f"    {name}" + (f": {rest}" if rest else ""))
    return out


def drain_lines(drain: Mapping[str, Any]) -> list[str]:
    """Whatever keys ``status.drain`` has: the well-known ones first with friendly names, per-pod maps last."""
    maps = sorted(
        k for k, v in drain.items() if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values())
    )
    keys = [k for k in _DRAIN_LABELS if k in drain]
    keys += sorted(k for k in drain if k not in _DRAIN_LABELS and k not in maps)
    labels = [_DRAIN_LABELS.get(k, _words(k)) for k in [*keys, *maps]]
    width = max((len(x) for x in labels), default=0) + 2
    out = ["  " + field(_DRAIN_LABELS.get(k, _words(k)), _drain_value(drain[k]), width) for k in keys]
    for k in maps:
        out.append("  " + field(_words(k), f"{len(drain[k])}", width))
        out += _per_item(drain[k])
    return out


def _marks_lines(m: Mapping[str, Any] | None) -> list[str]:
    if m is None:
        return ["  (the Node does not exist)"]
    out = []
    t = m.get("taint")
    out.append(
        "  "
        + field("Taint", f"{TAINT_KEY}={t.get('value') or ''}:{t.get('effect')}" if t else "none (not gpuhealth's)")
    )
    own = m.get("ownership")
    if not m.get("cordoned"):
        cordon = "not cordoned"
        if t and own and own.get("taintOnly"):
            cordon += ": held by gpuhealth's taint alone (spec.actions.cordon: false)"
    elif m.get("cordonOwner") == "gpuhealth":
        cordon = "cordoned by gpuhealth (it lifts it on return to service)"
    else:
        cordon = "cordoned by someone else (gpuhealth never lifts it)"
    out.append("  " + field("Cordon", cordon))
    if own:
        owned = [w for w in ("taint", "cordon") if own.get(w)]
        text = f"{QUARANTINE_ANNOTATION}: owns {', '.join(owned) or 'nothing'}"
        if own.get("taintOnly"):
            text += " (taint only)"
        text += f", reason {shown(own.get('reason'))}"
        text += f", since {shown(own.get('since'))}"
        out.append("  " + field("Ownership", text))
        if own.get("liftedByOthers"):
            out.append(
                "  "
                + field(
                    "Lifted",
                    f"someone else removed gpuhealth's {', '.join(own['liftedByOthers'])} (LiftedByOthers); "
                    "not put back this episode",
                )
            )
    out.append("  " + field("State label", f"gpuhealth.dev/state={shown(m.get('stateLabel'), '(none)')}"))
    c = m.get("condition")
    if c:
        cond = f"GPUHealthy={c.get('status')} ({shown(c.get('reason'))})"
        if c.get("message"):
            cond += f": {c['message']}"
        out.append("  " + field("Condition", cond))
    else:
        out.append("  " + field("Condition", "GPUHealthy not set"))
    gpu_out = m.get("gpuOutTaint")
    if gpu_out:
        out.append(
            "  "
            + field(
                "GPU-out taint",
                f"{gpu_out.get('key')}={gpu_out.get('value') or ''}:{gpu_out.get('effect')} (gpuhealth's: a GPU is "
                "held out and the device plugin does not withhold it; no new pod lands on the node, the pods on "
                "its other GPUs keep running; lifted when no GPU of the node is held out)",
            )
        )
    if m.get("otherTaints"):
        out.append("  " + field("Other taints", ", ".join(m["otherTaints"])))
    if m.get("releaseRequested"):
        out.append("  " + field("Release", f"requested at {m['releaseRequested']}, not processed by the operator yet"))
    return out


def _history_lines(h: Mapping[str, Any], now: dt.datetime) -> list[str]:
    out = []
    qs = h.get("quarantines") or []
    flap = h.get("flapping")
    limit = (
        f" (at {flap['maxQuarantines']} within {format_duration(flap['windowSeconds'])} "
        "the node goes to AwaitingRepair)"
        if flap
        else ""
    )
    out.append("  " + field("Quarantines", f"{len(qs)} in the flapping window{limit}", 16))
    for q in qs:
        out.append(f"    {q} ({age_of(q, now)} ago)")
    if "probationSeconds" in h:
        text = format_duration(h["probationSeconds"])
        if h.get("healthySince"):
            text += f"; clean since {h['healthySince']}"
        if "probationLeftSeconds" in h:
            text += f"; {human_age(h['probationLeftSeconds'])} left"
        out.append("  " + field("Probation", text, 16))
    elif h.get("healthySince"):
        out.append("  " + field("Clean since", str(h["healthySince"]), 16))
    if h.get("clearedBefore"):
        out.append("  " + field("Released", f"evidence before {h['clearedBefore']} cleared by a human", 16))
    if h.get("heldByBreaker"):
        out.append("  " + field("Breaker", "a quarantine is due but the policy's breaker holds it back", 16))
    if h.get("drainAction"):
        out.append("  " + field("After drain", shown(h["drainAction"]), 16))
    return out


def render_describe(m: Mapping[str, Any], color: bool = False) -> str:
    now = parse_time(m.get("generatedAt")) or dt.datetime.now(dt.UTC)
    state = m.get("state") or ""
    lines = [field("Node", str(m["node"]) + ("" if m.get("nodeExists") else " (no such Node)"))]
    if not m.get("hasReport"):
        lines.append(field("State", "- (no GPUNodeHealth report for this node)"))
    else:
        state_text = paint_state(state or "-", state, color)
        if m.get("dryRun"):
            state_text += " (DryRun: computed, no Node changed)"
        nv = m.get("nodeValidation") or {}
        if nv.get("held") and not nv.get("dryRun") and state not in OUT_OF_SERVICE:
            state_text += f" (held by its burn-in: taint {BURN_IN_TAINT_KEY}, not in service)"
        since = f"   since {m['since']} ({human_age(m.get('ageSeconds'))} ago)" if m.get("since") else ""
        lines.append(field("State", state_text + since))
    lines.append(field("Reason", shown(m.get("reason"))))
    if m.get("message"):
        lines.append(field("Message", str(m["message"])))
    policy = shown(m.get("policy"))
    if m.get("policyMode"):
        policy += f" ({m['policyMode']})"
    if m.get("overriddenPolicies"):
        policy += f"; also matches {', '.join(m['overriddenPolicies'])} (lower priority)"
    lines.append(field("Policy", policy))
    g = m.get("gpus") or {}
    gpus = f"{shown(g.get('healthy'), '?')}/{shown(g.get('total'), '?')} healthy"
    if g.get("inService") is not None:
        gpus += f", {g['inService']} in service"
    lines.append(field("GPUs", gpus))
    lines.append(field("Last XID", shown(m.get("lastXid"))))
    t = m.get("topology") or {}
    if t.get("domain") or t.get("rack"):
        where = [
            f"NVLink domain {t['domain']}" if t.get("domain") else "",
            f"rack {t['rack']}" if t.get("rack") else "",
        ]
        lines.append(field("Topology", ", ".join(w for w in where if w)))
    a = m.get("agent") or {}
    if m.get("hasReport"):
        agent = f"{shown(a.get('version'))} ({', '.join(a.get('sources') or []) or 'no sources'})"
        agent += f", heartbeat {human_age(a.get('heartbeatAgeSeconds'))} ago"
        hang = a.get("nvmlUnresponsive") or {}
        if hang:
            agent += f", NVML UNRESPONSIVE: {shown(hang.get('call'))} since {shown(hang.get('since'))}"
            agent += f" (newest sample {shown(hang.get('lastSampleTime'), 'none since the agent started')})"
        elif a.get("nvmlAvailable") is False:
            agent += f", NVML UNAVAILABLE: {shown(a.get('nvmlError'))}"
        else:
            agent += f", driver {shown(a.get('driverVersion'))}"
        if a.get("sampleAgeSeconds") is not None:
            agent += f", newest sample {human_age(a.get('sampleAgeSeconds'))} ago"
        lines.append(field("Agent", agent))
    skew = m.get("clockSkew") or {}
    if isinstance(skew.get("offsetSeconds"), int):
        lines.append(
            field(
                "Clock skew",
                f"the agent's clock is {skew_text(skew['offsetSeconds'])} off the operator's since "
                f"{shown(skew.get('since'))} (verdicts unaffected; fix time sync on the node)",
            )
        )

    lines += ["", "Node marks:", *_marks_lines(m.get("marks"))]

    devices = m.get("devices") or []
    lines += ["", "Devices:"]
    if devices:
        rows = [
            [
                shown(d.get("index")),
                shown(d.get("uuid")),
                shown(d.get("model")),
                _temp(d),
                _ecc(d),
                _remap(d),
                *(_fact_cell(f, d.get(f.key)) for f in _COLUMNS),
                ",".join(d.get("unsupported") or []) or "-",
            ]
            for d in devices
        ]
        # The facts' columns (api/device_facts.py, those with a label) follow the fixed ones.
        alarms = {len(_FIXED) + i: f.flag[0] for i, f in enumerate(_COLUMNS) if f.flag[0]}

        def alarm(n: int, col: int, cell: str) -> str:
            on = color and col in alarms and cell.rstrip() == alarms[col]
            return paint(cell, STATE_COLORS[State.AWAITING_REPAIR], on)

        lines += table(
            [*_FIXED, *(f.label for f in _COLUMNS), "UNSUPPORTED"],
            rows,
            alarm,
            indent="  ",
        )
    else:
        lines.append("  (none reported)")
    lines += fabric_lines(m.get("fabric"))

    verdicts = [v for v in m.get("gpuVerdicts") or [] if v.get("state") != "InService" or v.get("heldByBreaker")]
    lines += ["", "GPU verdicts (each GPU's own state; all others InService):"]
    if verdicts:
        rows = [
            [
                shown(v.get("index")),
                shown(v.get("state")) + (" (held back by the GPU budget)" if v.get("heldByBreaker") else ""),
                shown(v.get("reason")),
                age_of(v.get("since"), now) if v.get("since") else "-",
                _rules(v),
                shown(v.get("uuid")),
            ]
            for v in verdicts
        ]
        lines += table(["GPU", "STATE", "REASON", "AGE", "DEVICETAINTRULE", "UUID"], rows, indent="  ")
        plugin = [str(v.get("index")) for v in verdicts if v.get("keptOffBy") and v.get("state") != "InService"]
        if plugin:
            lines.append(
                f"  GPU{'s' if len(plugin) > 1 else ''} {', '.join(plugin)} held out through the device plugin "
                "(no DRA ResourceSlice publishes them): only the pods holding them are drained, the node is not "
                "cordoned and its other GPUs keep their work"
            )
    else:
        lines.append("  (every GPU in service)")
    lines += kubelet_lines(m.get("kubeletHealth") or [])
    failures = m.get("gpuFailures") or []
    if failures:
        lines += ["", "GPU failures (time between failures):"]
        for f in failures:
            text = f"  GPU {shown(f.get('gpu'))}: last failure {human_age(f.get('lastFailureAgeSeconds'))} ago"
            interval = f.get("previousIntervalSeconds")
            text += f", previous interval {human_age(interval)}" if interval is not None else ", the first on record"
            lines.append(text)
    lines += layout_lines(m.get("migLayout") or [], m.get("migLayoutErrors") or [])
    for index, d in sorted((m.get("deviceDrains") or {}).items()):
        lines += ["", f"Drain of GPU {index} (only the pods that hold it):", *drain_lines(d)]

    xids = m.get("xids") or []
    lines += ["", "Recent XIDs (newest first):"]
    if xids:
        rows = []
        for x in xids:
            meaning = str(x.get("meaning") or "")
            if x.get("catalogAction"):
                meaning += f" [gpuhealth: {x['catalogAction']}]"
            if x.get("cleared"):
                meaning += " (cleared by release)"
            rows.append([age_of(x.get("time"), now), shown(x.get("gpu")), shown(x.get("xid")), meaning])
        lines += table(["AGE", "GPU", "XID", "MEANING"], rows, indent="  ")
    else:
        lines.append("  (none)")

    evidence = m.get("evidence") or []
    lines += ["", "Evidence:"]
    if evidence:
        rows = [
            [
                shown(e.get("reason")),
                shown(e.get("action")),
                shown(e.get("gpu")),
                age_of(e.get("since"), now) if e.get("since") else "-",
                shown(e.get("detail")),
            ]
            for e in evidence
        ]
        lines += table(["REASON", "ACTION", "GPU", "AGE", "DETAIL"], rows, indent="  ")
    else:
        lines.append("  (none)")

    lines += ["", "Quarantine history:", *_history_lines(m.get("history") or {}, now)]

    ladders = m.get("remediation") or []
    if ladders:
        lines += ["", "Repair ladder (status.remediation):", *ladder_lines(ladders, now)]

    nv = m.get("nodeValidation")
    if isinstance(nv, Mapping):
        lines += ["", "Node validation (status.nodeValidation):", *node_validation_lines(nv, now)]
    repairs = m.get("repairs") or []
    if repairs:
        lines += ["", "Repairs by GPU UUID (status.repairs, what makes a repeat offender):", *repair_lines(repairs)]

    drain = m.get("drain")
    if drain:
        lines += ["", "Drain:", *drain_lines(drain)]

    events = m.get("events") or []
    lines += ["", "Events (gpuhealth-operator, last 10):"]
    if events:
        rows = [
            [age_of(e.get("time"), now), shown(e.get("type")), shown(e.get("reason")), shown(e.get("message"))]
            for e in events
        ]
        lines += table(
            ["AGE", "TYPE", "REASON", "MESSAGE"],
            rows,
            lambda n, col, cell: paint(cell, WARNING_COLOR, color and col == 1 and cell.startswith("Warning")),
            indent="  ",
        )
    else:
        lines.append("  (none)")
    return "\n".join(lines) + "\n"
