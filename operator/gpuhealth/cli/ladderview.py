"""Pure view of the repair ladder (``status.remediation``) for `describe` and `status`.

``ladder_view`` turns each GPU's :class:`~gpuhealth.api.remediation.LadderRecord` into a JSON-able
row, with the number of attempts its step allows under the governing policy (``None`` when the
policy is unknown); ``ladder_cell`` is the short form for the fleet table ("GPUReset 1/2").
``repairs_view`` lists each GPU's finished attempts by UUID (``status.repairs``): the history that
makes a repeat offender, kept after the ladder record is gone and across a reboot.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from gpuhealth.api.policy import Policy
from gpuhealth.api.remediation import StepKind, steps_for
from gpuhealth.api.remediation_status import LadderRecord, Phase, Repair
from gpuhealth.api.timeutil import format_time
from gpuhealth.api.validation import NodeValidation
from gpuhealth.catalog.xid import remedy_of

# Fleet totals: a ladder's standing, most urgent last (the order of the footer).
IN_FLIGHT = "inFlight"  # a reset Job being created, running, verified or validated
HANDED_OFF = "handedOff"  # NodeReboot: waiting for the node remediator
EXHAUSTED = "exhausted"  # Replace: a human must replace or RMA the GPU
AWAITING_APPROVAL = "awaitingApproval"  # approval: Manual/TwoPerson; a step waits for kubectl gpuhealth approve


def _t(t: dt.datetime | None) -> str | None:
    return format_time(t) if t else None


def _secs(a: dt.datetime | None, b: dt.datetime | None) -> float | None:
    return None if a is None or b is None else round(max(0.0, (b - a).total_seconds()), 1)


def standing(row: Mapping[str, Any]) -> str | None:
    """``inFlight``, ``handedOff``, ``exhausted`` or None (ready, succeeded, dry run)."""
    phase = row.get("phase")
    if phase in (Phase.PENDING, Phase.RUNNING, Phase.VERIFYING, Phase.VALIDATING):
        return IN_FLIGHT
    if phase == Phase.HANDED_OFF:
        return HANDED_OFF
    if phase == Phase.PENDING_APPROVAL:
        return AWAITING_APPROVAL
    if phase == Phase.AWAITING_REPAIR or (row.get("step") == StepKind.REPLACE and phase != Phase.DRY_RUN):
        return EXHAUSTED
    return None


def ladder_view(ladders: Mapping[int, LadderRecord], policy: Policy | None, now: dt.datetime) -> list[dict[str, Any]]:
    """One row per GPU with a ladder record (``StoredStatus.ladders``: unreadable ones are left out), by
    GPU index."""
    rows = []
    for rec in ladders.values():
        allowed = None
        if policy is not None:
            step = next(
                (
                    s
                    for s in steps_for(policy.remediation, rec.reason, remedy=remedy_of(rec.reason))
                    if s.kind == rec.step
                ),
                None,
            )
            allowed = step.attempts if step is not None else None
        row: dict[str, Any] = {
            "gpu": rec.index,
            "uuid": rec.uuid or None,
            "reason": rec.reason or None,
            "step": str(rec.step),
            "attempt": rec.attempt,
            "attempts": allowed,
            "phase": str(rec.phase),
            "since": _t(rec.since),
            "faultSince": _t(rec.fault_since),
            "startedAt": _t(rec.started),
            "finishedAt": _t(rec.finished),
            "stepAgeSeconds": _secs(rec.started, now),
            "job": rec.job or None,
            "message": rec.message or None,
            "validation": _validation(rec),
            "approved": rec.approved or None,
            # Who approved (the API server's user names) and when gpuhealth recorded it; and, while the
            # step waits, how many distinct approvers it needs under the policy (None: policy unknown).
            "approvers": [a.to_status() for a in rec.approvers] or None,
            "approvalsNeeded": (
                policy.remediation.approvals_needed(rec.approval_step)
                if policy is not None and rec.phase == Phase.PENDING_APPROVAL
                else None
            ),
            "plugin": _plugin(rec, now),
            "history": [
                {
                    "step": str(a.step),
                    "attempt": a.attempt,
                    "result": str(a.result),
                    "startedAt": _t(a.started),
                    "finishedAt": _t(a.finished),
                    "durationSeconds": _secs(a.started, a.finished),
                }
                for a in rec.history
            ],
        }
        row["standing"] = standing(row)
        rows.append(row)
    rows.sort(key=lambda r: int(r["gpu"]))
    return rows


def _validation(rec: LadderRecord) -> dict[str, Any] | None:
    """The attempt's validation (spec.validation): level, result, Job, when, findings."""
    v = rec.validation
    if v is None:
        return None
    return {
        "level": v.level,
        "result": str(v.outcome),
        "job": v.job or None,
        "startedAt": _t(v.started),
        "finishedAt": _t(v.finished),
        "durationSeconds": _secs(v.started, v.finished),
        "findings": v.findings or None,
    }


def _plugin(rec: LadderRecord, now: dt.datetime) -> dict[str, Any] | None:
    """The device plugin's restart for a repaired GPU it still withholds (phase RestartingPlugin)."""
    p = rec.plugin
    if p is None:
        return None
    return {
        "pod": p.pod or None,
        "deleted": p.deleted,
        "blocked": p.blocked or None,
        "timedOut": p.timed_out,
        "startedAt": _t(p.started),
        "ageSeconds": _secs(p.started, now),
    }


def node_validation_view(nv: NodeValidation | None, now: dt.datetime) -> dict[str, Any] | None:
    """``status.nodeValidation`` (a release's or a burn-in's validation of all the node's GPUs), or None."""
    if nv is None:
        return None
    v = nv.validation
    return {
        "trigger": str(nv.trigger),
        "episode": _t(nv.episode),
        "level": v.level,
        "result": str(v.outcome),
        "job": v.job or None,
        "startedAt": _t(v.started),
        "finishedAt": _t(v.finished),
        "durationSeconds": _secs(v.started, v.finished),
        "ageSeconds": None if v.finished is not None else _secs(v.started, now),
        "findings": v.findings or None,
        "held": nv.held,
        "dryRun": nv.dry_run,
    }


def node_validation_cell(view: Mapping[str, Any] | None) -> str:
    """The fleet table's short form: ``BurnIn Running`` (held), ``Release Failed``; empty when none."""
    if not view:
        return ""
    return f"{view['trigger']} {view['result']}" + (" (held)" if view.get("held") else "")


def step_text(row: Mapping[str, Any]) -> str:
    """``GPUReset 1/2`` (attempt of allowed), ``GPUReset 1`` when the policy is unknown, ``Replace`` (a human)."""
    if row.get("step") == StepKind.REPLACE:
        return str(row.get("step"))
    allowed = row.get("attempts")
    return f"{row.get('step')} {row.get('attempt')}" + (f"/{allowed}" if allowed else "")


_RANK = {EXHAUSTED: 0, AWAITING_APPROVAL: 1, HANDED_OFF: 2, IN_FLIGHT: 3, None: 4}


def ladder_cell(rows: Iterable[Mapping[str, Any]]) -> str:
    """The fleet table's LADDER cell: the most urgent GPU's step and attempt, ``+N`` more GPUs."""
    ladders = sorted(rows, key=lambda r: (_RANK[r.get("standing")], int(r.get("gpu") or 0)))
    if not ladders:
        return "-"
    first = ladders[0]
    text = f"{step_text(first)} {first.get('phase')} (GPU {first.get('gpu')})"
    return text + (f" +{len(ladders) - 1}" if len(ladders) > 1 else "")


def repairs_view(repairs: Mapping[str, tuple[Repair, ...]]) -> list[dict[str, Any]]:
    """One row per GPU UUID in ``status.repairs`` (``StoredStatus.repairs``: unreadable ones left out):
    its attempts, oldest first."""
    rows = []
    for uuid, items in repairs.items():
        if not items:
            continue
        rows.append(
            {
                "uuid": str(uuid),
                "gpu": next((r.index for r in reversed(items) if r.index is not None), None),
                "attempts": [
                    {
                        "step": str(r.attempt.step),
                        "attempt": r.attempt.attempt,
                        "result": str(r.attempt.result),
                        "reason": r.reason or None,
                        "gpu": r.index,
                        "startedAt": _t(r.attempt.started),
                        "finishedAt": _t(r.attempt.finished),
                    }
                    for r in items
                ],
            }
        )
    rows.sort(key=lambda r: (r["gpu"] is None, r["gpu"] or 0, r["uuid"]))
    return rows
