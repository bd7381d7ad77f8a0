"""Pure text of `kubectl gpuhealth describe`'s repair sections: each GPU's repair ladder
(``status.remediation``), the node's validation (``status.nodeValidation``) and the repairs kept by GPU
UUID (``status.repairs``), from the rows ``ladderview.py`` builds. Like render.py, it reads nothing from
the terminal.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from gpuhealth.cli.ladderview import step_text
from gpuhealth.cli.render import age_of, field, human_age, shown, table


def validation_result(v: Mapping[str, Any], now: dt.datetime) -> str:
    """A validation's level and result, with how long it took (or has run so far): a GPU's or a node's."""
    text = f"level {shown(v.get('level'))} {shown(v.get('result'))}"
    if v.get("durationSeconds") is not None:
        text += f" in {human_age(v['durationSeconds'])}"
    elif v.get("startedAt"):
        text += f" for {age_of(v['startedAt'], now)}"
    return text


def node_validation_lines(v: Mapping[str, Any], now: dt.datetime) -> list[str]:
    """A release's or a burn-in's validation of all the node's GPUs: result, Job, findings, the hold."""
    out = ["  " + field("Validation", f"{shown(v.get('trigger'))}: {validation_result(v, now)}", 12)]
    if v.get("job"):
        out.append("  " + field("Job", str(v["job"]), 12))
    if v.get("findings"):
        out.append("  " + field("Findings", str(v["findings"]), 12))
    if v.get("held"):
        out.append("  " + field("Held", "gpuhealth's NoSchedule taint gpuhealth.dev/burn-in until it passes", 12))
    if v.get("dryRun"):
        out.append("  " + field("DryRun", "would hold the node and run this validation; nothing runs", 12))
    return out


def repair_lines(rows: list[Mapping[str, Any]]) -> list[str]:
    """Each GPU's finished attempts by UUID, oldest first (the index it had then, which may change)."""
    table_rows = [
        [
            str(r.get("uuid")),
            shown(a.get("gpu")),
            f"{shown(a.get('step'))} {shown(a.get('attempt'))}",
            shown(a.get("result")),
            shown(a.get("reason")),
            shown(a.get("finishedAt")),
        ]
        for r in rows
        for a in r.get("attempts") or []
    ]
    return table(["GPU UUID", "GPU", "ATTEMPT", "RESULT", "FOR", "FINISHED"], table_rows, indent="  ")


def ladder_lines(rows: list[Mapping[str, Any]], now: dt.datetime) -> list[str]:
    """Each GPU's repair ladder: where it stands, its Job, then every attempt so far with its result."""
    out = []
    for r in rows:
        head = f"  GPU {shown(r.get('gpu'))}"
        if r.get("uuid"):
            head += f" ({r['uuid']})"
        head += f": {shown(r.get('reason'), 'fault ?')}, step {step_text(r)} {shown(r.get('phase'))}"
        if r.get("startedAt"):
            head += f" for {age_of(r['startedAt'], now)}"
        out.append(head)
        if r.get("job"):
            out.append("    " + field("Job", str(r["job"]), 10))
        if r.get("message"):
            out.append("    " + field("Message", str(r["message"]), 10))
        approvals = approvals_text(r)
        if approvals:
            out.append("    " + field("Approvals", approvals, 10))
        v = r.get("validation")
        if isinstance(v, Mapping):
            text = validation_result(v, now)
            if v.get("job"):
                text += f", Job {v['job']}"
            out.append("    " + field("Validated", text, 10))
            if v.get("findings"):
                out.append("    " + field("Findings", str(v["findings"]), 10))
        plugin = r.get("plugin")
        if isinstance(plugin, Mapping):
            out.append("    " + field("Plugin", plugin_text(plugin), 10))
        if r.get("faultSince"):
            out.append("    " + field("Out since", f"{r['faultSince']} ({age_of(r['faultSince'], now)} ago)", 10))
        history = r.get("history") or []
        if history:
            rows_ = [
                [
                    f"{shown(a.get('step'))} {shown(a.get('attempt'))}",
                    shown(a.get("result")),
                    shown(a.get("startedAt")),
                    shown(a.get("finishedAt")),
                    "-" if a.get("durationSeconds") is None else human_age(a["durationSeconds"]),
                ]
                for a in history
            ]
            out += table(["ATTEMPT", "RESULT", "STARTED", "FINISHED", "TOOK"], rows_, indent="    ")
        else:
            out.append("    (no attempt finished yet)")
    return out


def approvals_text(r: Mapping[str, Any]) -> str:
    """``1 of 2 approvals (alice at 2025-06-01T12:00:00Z)``: who approved the step, and while it waits how
    many it needs; "" when nobody approved it by name and nothing waits."""
    by = [a for a in r.get("approvers") or [] if isinstance(a, Mapping) and a.get("by")]
    names = ", ".join(f"{a['by']} at {a['at']}" if a.get("at") else str(a["by"]) for a in by)
    needed = r.get("approvalsNeeded")
    if r.get("phase") == "PendingApproval" and isinstance(needed, int) and needed > 0:
        return f"{len(by)} of {needed} approval{'s' if needed > 1 else ''}" + (f" ({names})" if names else "")
    return f"approved by {names}" if names else ""


def plugin_text(p: Mapping[str, Any]) -> str:
    """The device plugin's restart for a repaired GPU it still withholds, in one line."""
    if p.get("blocked"):
        return f"not restarted: {p['blocked']}; the GPU stays withheld until the device plugin restarts"
    pod = shown(p.get("pod"), "its pod")
    if not p.get("deleted"):
        return f"restarting {pod}"
    ago = f" {human_age(p['ageSeconds'])} ago" if p.get("ageSeconds") is not None else ""
    if p.get("timedOut"):
        return f"{pod} restarted{ago}, and allocatable still does not show the GPU (returnTimeout passed)"
    return f"{pod} restarted{ago}; the GPU returns once allocatable shows it"
