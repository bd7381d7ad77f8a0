"""The per-node state machine, as a pure function of the persisted record and an assessment.

States: Healthy, Degraded, Quarantined, Draining, AwaitingRepair, Recovering, Unknown. The record
lives in GPUNodeHealth status, so a restarted operator resumes exactly where it was.

Rules that the property tests hold it to:
- a node enters quarantine from service only if the breaker admits it;
- Unknown (stale or missing facts) never leads to Healthy or advances probation;
- AwaitingRepair is left only through a human release;
- a node returns to service only after ``probation`` of fresh, clean facts;
- a node whose validation has not passed (``node_validation.py``) does not return; one whose
  validation failed goes to AwaitingRepair;
- a node out for its NVLink domain returns only with the other members out for it (``domains.py``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace

from gpuhealth.api.names import SLOW_SIGNALS, Action, Signal, State
from gpuhealth.api.policy import Policy
from gpuhealth.api.status import Record
from gpuhealth.evaluation.assess import Assessment, Finding

MAX_HISTORY = 20

__all__ = ["Decision", "Inputs", "Record", "decide", "wants_quarantine"]


@dataclass(frozen=True)
class Inputs:
    """Facts about the world, beyond the assessment, that a transition may depend on."""

    breaker_allows: bool = True
    drain_complete: bool = False
    released: bool = False
    validating: bool = False  # the node's validation (node_validation.py) has not passed: no return yet
    validation_failed: str = ""  # the node's validation failed: these findings send it to AwaitingRepair
    # Out for its NVLink domain: the other members that left for it and cannot return yet
    # (evaluation/domains.py domain_return): the domain returns together, so this one waits for them.
    domain_waits: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    record: Record
    new_quarantine: bool = False
    events: tuple[tuple[str, str, str], ...] = field(default=())  # (type, reason, message)


def _fault_state(level: Action) -> State:
    return State.QUARANTINED if level == Action.CORDON else State.DRAINING


def _next_step(level: Action, cordon: bool = True) -> str:
    """What happens to a node entering quarantine; ``cordon`` False: the policy's taint-only mode
    (``spec.actions.cordon: false``), the node held by gpuhealth's taint alone."""
    held = "tainted and cordoned" if cordon else "held by gpuhealth's taint alone (not cordoned)"
    if level == Action.CORDON:
        return f"{held}; running workloads continue; it returns to service after probation once the facts clear"
    if level == Action.DRAIN:
        return f"{held} and being drained (checkpoint first, then evict)"
    return f"{held} and being drained; it then waits for a human repair (kubectl gpuhealth release)"


def _summary(findings: tuple[Finding, ...]) -> str:
    return "; ".join(f.describe() for f in findings)


def _effective(a: Assessment, policy: Policy) -> tuple[Action, Finding | None, tuple[Finding, ...]]:
    """The level that counts, its top finding and the quarantine-level findings; silence counts as a
    cordon-level finding when the policy says so."""
    level, top = a.level, a.top
    quarantine_findings = tuple(f for f in a.findings if f.action.quarantines)
    if a.unknown and policy.silence_action == Action.CORDON and not level.quarantines:
        top = Finding(a.unknown_signal, Action.CORDON, a.unknown_reason)
        return Action.CORDON, top, (top,)
    return level, top, quarantine_findings


def wants_quarantine(prior: Record, a: Assessment, policy: Policy) -> bool:
    """Whether ``decide`` would take this in-service node out of service: ask the breaker first, once.

    A release only moves an out-of-service node, so it does not change the answer.
    """
    return not prior.out_of_service and _effective(a, policy)[0].quarantines


def _released_during(rec: Record) -> bool:
    """A release arrived after the current quarantine episode began (while it was draining)."""
    return rec.cleared_before is not None and rec.since is not None and rec.cleared_before >= rec.since


def decide(prior: Record, a: Assessment, policy: Policy, now: dt.datetime, inputs: Inputs = Inputs()) -> Decision:
    """The next record for a node, and what changed."""
    rec = prior
    events: list[tuple[str, str, str]] = []
    if inputs.released:
        rec = replace(rec, cleared_before=now, quarantines=())
        if rec.state == State.AWAITING_REPAIR:
            rec = replace(
                rec,
                state=State.RECOVERING,
                since=now,
                healthy_since=None,
                message=f"released by a human after {rec.reason or 'repair'}; on probation",
            )
            events.append(("Normal", "Released", "Released by a human after repair; the node is on probation"))
    window = dt.timedelta(seconds=policy.flapping_window_s)
    recent = tuple(t for t in rec.quarantines if now - t <= window)
    rec = replace(rec, quarantines=recent)

    level, top, quarantine_findings = _effective(a, policy)

    if rec.state == State.AWAITING_REPAIR:
        return Decision(rec, events=tuple(events))

    if rec.state == State.RECOVERING and inputs.validation_failed:
        rec = replace(
            rec,
            state=State.AWAITING_REPAIR,
            since=now,
            healthy_since=None,
            drain_action=str(Action.REPAIR),
            message=inputs.validation_failed,
        )
        events.append(("Warning", "AwaitingRepair", f"{inputs.validation_failed}. The node waits for a human repair"))
        return Decision(rec, events=tuple(events))

    if rec.state == State.DRAINING and inputs.drain_complete:
        nxt = State.AWAITING_REPAIR if rec.drain_action == Action.REPAIR else State.QUARANTINED
        if nxt == State.AWAITING_REPAIR and _released_during(rec):
            # A human released the node while its repair drain was still running (a remediator that
            # rebooted it early, say): the release was acknowledged then, so it counts now, instead of
            # parking the node in AwaitingRepair with nothing left to repair.
            rec = replace(rec, state=State.RECOVERING, since=now, healthy_since=None, drained=True)
            rec = replace(
                rec, message=f"Drain complete; released by a human during it after {rec.reason}: on probation"
            )
            events.append(("Normal", "Released", "Released by a human during the drain; the node is on probation"))
            return Decision(rec, events=tuple(events))
        rec = replace(rec, state=nxt, since=now, drained=True)
        msg = (
            "Drain complete; the node waits for a human repair (kubectl gpuhealth release)"
            if nxt == State.AWAITING_REPAIR
            else "Drain complete; the node stays quarantined until the facts clear"
        )
        events.append(("Normal", "DrainComplete", msg))
        return Decision(rec, events=tuple(events))

    if level.quarantines:
        assert top is not None
        detail = _summary(quarantine_findings)
        if not rec.out_of_service:
            if not inputs.breaker_allows:
                held = replace(
                    rec,
                    state=State.DEGRADED,
                    reason=top.reason,
                    message=f"quarantine held back: the circuit breaker is open ({detail})",
                    held_by_breaker=True,
                    since=rec.since if rec.held_by_breaker else now,
                )
                if not rec.held_by_breaker:
                    events.append(
                        (
                            "Warning",
                            "QuarantineHeldBack",
                            f"{detail}. The policy {policy.name!r} breaker is open "
                            f"({_budget(quarantine_findings, policy)}): not quarantining; "
                            "it will once the fleet is back under the limit",
                        )
                    )
                return Decision(held, events=tuple(events))
            return _enter_quarantine(rec, top, level, detail, now, policy, events)
        if rec.state == State.RECOVERING:
            return _enter_quarantine(rec, top, level, detail, now, policy, events, relapse=True)
        if rec.state == State.QUARANTINED and level == Action.REPAIR and rec.drained:
            # Already drained for this quarantine: a repair-level fault now just needs the human.
            rec = replace(
                rec,
                state=State.AWAITING_REPAIR,
                since=now,
                reason=top.reason,
                message=detail,
                drain_action=str(Action.REPAIR),
            )
            events.append(("Warning", "AwaitingRepair", f"{detail}. The node waits for a human repair"))
            return Decision(rec, events=tuple(events))
        if rec.state == State.QUARANTINED and level.severity >= Action.DRAIN.severity and not rec.drained:
            rec = replace(
                rec,
                state=State.DRAINING,
                reason=top.reason,
                since=now,
                drain_action=str(level),
                message=detail,
            )
            events.append(("Warning", "Draining", f"{detail}. Escalating to a drain (checkpoint first, then evict)"))
            return Decision(rec, events=tuple(events))
        if rec.state == State.DRAINING and level == Action.REPAIR and rec.drain_action != Action.REPAIR:
            rec = replace(rec, drain_action=str(Action.REPAIR), reason=top.reason)
            events.append(("Warning", "Escalated", f"{detail}. After the drain the node waits for a human repair"))
            return Decision(replace(rec, message=detail), events=tuple(events))
        return Decision(replace(rec, message=detail), events=tuple(events))

    # No quarantine-level finding.
    if rec.out_of_service:
        if rec.state == State.DRAINING and rec.drain_action == Action.REPAIR:
            return Decision(rec, events=tuple(events))  # suspect hardware: finish the drain, then a human decides
        if a.unknown:
            # Stale facts: never count them towards probation.
            return Decision(replace(rec, healthy_since=None), events=tuple(events))
        if rec.state != State.RECOVERING:
            rec = replace(
                rec,
                state=State.RECOVERING,
                since=now,
                healthy_since=now,
                reason=rec.reason,
                message=f"facts are clean; on probation for {int(policy.probation_s)}s",
            )
            events.append(
                (
                    "Normal",
                    "Recovering",
                    f"The faults that quarantined the node have cleared; it returns to service after "
                    f"{int(policy.probation_s)}s of clean reports",
                )
            )
            return Decision(rec, events=tuple(events))
        healthy_since = rec.healthy_since or now
        rec = replace(rec, healthy_since=healthy_since)
        done = (now - healthy_since).total_seconds() >= policy.probation_s and not inputs.validating
        if done and inputs.domain_waits:
            shown = ", ".join(inputs.domain_waits[:5]) + (
                f" and {len(inputs.domain_waits) - 5} more" if len(inputs.domain_waits) > 5 else ""
            )
            msg = f"probation over; waits for its NVLink domain to return as one ({shown} not yet back)"
            return Decision(replace(rec, message=msg), events=tuple(events))
        if done:
            rec = replace(
                rec,
                state=State.HEALTHY,
                since=now,
                reason="",
                message="",
                healthy_since=None,
                drain_action="",
                drained=False,
            )
            events.append(
                (
                    "Normal",
                    "ReturnedToService",
                    f"Healthy for the whole probation ({int(policy.probation_s)}s): lifting gpuhealth's taint"
                    + (" and cordon" if policy.cordon else " (taint-only: no cordon of gpuhealth's)"),
                )
            )
            return Decision(rec, events=tuple(events))
        return Decision(rec, events=tuple(events))

    if a.unknown:
        if rec.state != State.UNKNOWN or rec.reason != a.unknown_signal:
            rec = replace(
                rec,
                state=State.UNKNOWN,
                since=now,
                reason=str(a.unknown_signal),
                message=a.unknown_reason,
                held_by_breaker=False,
            )
            events.append(
                (
                    "Warning",
                    str(a.unknown_signal),
                    f"{a.unknown_reason}. GPU health is Unknown; nothing is assumed healthy",
                )
            )
        return Decision(rec, events=tuple(events))

    observed = tuple(f for f in a.findings if f.action == Action.OBSERVE)
    if observed:
        first = observed[0]
        detail = _summary(observed)
        if rec.state != State.DEGRADED or rec.reason != first.reason or rec.held_by_breaker:
            rec = replace(
                rec,
                state=State.DEGRADED,
                since=now,
                reason=first.reason,
                message=detail,
                held_by_breaker=False,
            )
            if first.signal == Signal.DEVICE_QUARANTINED:
                events.append(("Warning", "Degraded", f"{detail}: no node taint, no cordon"))
            else:
                events.append(
                    ("Warning", "Degraded", f"{detail}. Observing only: no taint or cordon under this policy")
                )
        elif rec.message != detail:
            rec = replace(rec, message=detail)  # e.g. a held-out GPU moved on from Draining: say so, quietly
        return Decision(rec, events=tuple(events))

    if rec.state != State.HEALTHY:
        rec = replace(rec, state=State.HEALTHY, since=now, reason="", message="", held_by_breaker=False)
        events.append(("Normal", "Healthy", "Fresh report with no faults: GPUs are healthy"))
    return Decision(rec, events=tuple(events))


def _enter_quarantine(
    rec: Record,
    top: Finding,
    level: Action,
    detail: str,
    now: dt.datetime,
    policy: Policy,
    events: list[tuple[str, str, str]],
    relapse: bool = False,
) -> Decision:
    quarantines = (*rec.quarantines, now)[-MAX_HISTORY:]
    if len(quarantines) >= policy.flapping_max:
        nrec = replace(
            rec,
            state=State.AWAITING_REPAIR,
            since=now,
            reason=str(Signal.FLAPPING),
            quarantines=quarantines,
            message=f"quarantined {len(quarantines)} times within the flapping window; last: {detail}",
            held_by_breaker=False,
            healthy_since=None,
            drain_action=str(Action.REPAIR),
        )
        events.append(
            (
                "Warning",
                "Flapping",
                f"{detail}. Quarantined {len(quarantines)} times within "
                f"{int(policy.flapping_window_s)}s: the node "
                "stays out of service until a human releases it (kubectl gpuhealth release)",
            )
        )
        return Decision(nrec, new_quarantine=True, events=tuple(events))
    state = _fault_state(level)
    nrec = replace(
        rec,
        state=state,
        since=now,
        reason=top.reason,
        message=detail,
        quarantines=quarantines,
        held_by_breaker=False,
        healthy_since=None,
        drain_action=str(level) if state == State.DRAINING else "",
        drained=False,
    )
    verb = "Relapsed during probation" if relapse else "Quarantined"
    events.append(("Warning", "Quarantined", f"{verb}: {detail}. The node is {_next_step(level, policy.cordon)}"))
    return Decision(nrec, new_quarantine=True, events=tuple(events))


def _budget(findings: tuple[Finding, ...], policy: Policy) -> str:
    """The budget that held a quarantine back: maxSlow when all that takes the node is slow, not broken."""
    if findings and all(f.signal in SLOW_SIGNALS for f in findings):
        return f"maxSlow {policy.max_slow}"
    return f"maxUnhealthy {policy.max_unhealthy}"
