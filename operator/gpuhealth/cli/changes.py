"""Pure planning of the writes `release`, `approve`, `reject`, `pause` and `resume` make, and of when they refuse.

Each planner takes the objects as read from the API and returns the merge patch to send (or None when
there is nothing to do) and what to tell the human. A refusal raises
:class:`~gpuhealth.cli.errors.Refused` (exit 2) with one line saying why and how to override.

Policy patches carry the resourceVersion they were planned from, so a concurrent edit makes the API
server answer 409 instead of the plugin overwriting it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.api.devices import DeviceState
from gpuhealth.api.durations import format_duration
from gpuhealth.api.names import (
    APPROVE_ANNOTATION,
    APPROVE_GPU_ANNOTATION,
    BURN_IN_LABEL,
    BURN_IN_REQUESTED,
    BURN_IN_TAINT_KEY,
    GPU_OUT_TAINT_KEY,
    GROUP,
    OUT_OF_SERVICE,
    REJECT_ANNOTATION,
    REJECT_GPU_ANNOTATION,
    RELEASE_ANNOTATION,
    RELEASE_GPU_ANNOTATION,
    Mode,
    State,
)
from gpuhealth.api.policy import PolicyError, parse_policy
from gpuhealth.api.remediation_status import Phase, approver_key
from gpuhealth.api.status import StoredStatus
from gpuhealth.api.timeutil import format_time
from gpuhealth.api.validation import NodeValidation
from gpuhealth.cli.errors import Refused

PAUSED_FROM_ANNOTATION = f"{GROUP}/paused-from"
"""On a Paused GPUHealthPolicy: the mode it had before `kubectl gpuhealth pause`, restored by `resume`."""

RESUMABLE = (str(Mode.ENFORCE), str(Mode.DRY_RUN))


@dataclass(frozen=True)
class Plan:
    """A merge patch (None: nothing to write) and the lines to print once it is written."""

    patch: dict[str, Any] | None
    lines: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())


def _mode(policy: Mapping[str, Any]) -> str:
    return str((policy.get("spec") or {}).get("mode") or Mode.ENFORCE)


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def plan_release(
    node: str,
    report: Mapping[str, Any] | None,
    policy: Mapping[str, Any] | None,
    now: dt.datetime,
    force: bool = False,
    node_annotations: Mapping[str, Any] | None = None,
) -> Plan:
    """Return an AwaitingRepair node to gpuhealth: annotate the Node with ``gpuhealth.dev/release=<now>``.

    The operator then clears the evidence recorded up to that moment, resets the flapping history,
    moves the node to Recovering and keeps it tainted and cordoned for the policy's probation; it
    removes the annotation once it has done so. Any other state is refused unless ``force``.
    """
    status = StoredStatus.of(report)
    state = str(status.state or "")
    reason = status.record.reason
    burn_in = status.node_validation
    # A burn-in that failed holds the node until a human releases it (docs/runbook.md BurnInFailed), as
    # AwaitingRepair does: the release is the step the runbook asks for, not an override.
    awaited = state == State.AWAITING_REPAIR or (burn_in is not None and burn_in.awaits_release)
    if not awaited and not force:
        if not state:
            raise Refused(
                f"node {node} has no gpuhealth verdict, so it is not AwaitingRepair: nothing to release "
                "(--force sets the release annotation anyway)"
            )
        why = f"{state} ({reason})" if reason else state
        if burn_in is not None and burn_in.holds:
            raise Refused(
                f"node {node} is {why} but held by its burn-in ({burn_in.validation.outcome}; taint "
                f"{BURN_IN_TAINT_KEY}), not in service: gpuhealth lifts the hold once the burn-in passes. Use "
                "--force to lift it now, without the burn-in"
            )
        hints: dict[str, str] = {
            State.HEALTHY: "it is in service",
            State.DEGRADED: "gpuhealth only observes it",
            State.RECOVERING: "it is already on probation and returns to service by itself",
            State.UNKNOWN: "its agent is silent: fix the agent first",
        }
        hint = hints.get(
            state,
            "gpuhealth returns it to service by itself once its facts clear and probation passes; evidence that "
            "does not clear by itself (an XID, a NIC counter's increase) holds it until a release once the "
            "fault is repaired",
        )
        raise Refused(
            f"node {node} is {why}, not AwaitingRepair: {hint}. Use --force to clear its evidence and "
            "flapping history anyway"
        )
    stamp = format_time(now)
    patch = {"metadata": {"annotations": {RELEASE_ANNOTATION: stamp}}}
    parsed = None
    if policy is not None:
        try:
            parsed = parse_policy(policy)
        except PolicyError:
            parsed = None
    probation = f" ({format_duration(parsed.probation_s)} under policy {parsed.name})" if parsed else ""
    lines = [f"node/{node} released at {stamp} ({RELEASE_ANNOTATION}={stamp})."]
    if burn_in is not None and burn_in.holds:
        lines.append(_burn_in_release(burn_in))
    held_out = state in OUT_OF_SERVICE
    if state == State.AWAITING_REPAIR:
        lines.append(
            "Next: gpuhealth clears the evidence recorded up to now and the flapping history, moves the node "
            f"to Recovering and keeps its taint and cordon for the probation{probation}."
        )
    elif burn_in is not None and burn_in.awaits_release and not held_out:
        lines.append(
            f"The node stays {state or 'without a verdict'}: gpuhealth clears the evidence recorded up to now and "
            "the flapping history; it serves once the taint is gone."
        )
    elif held_out:
        lines.append(
            f"Forced (state {state}): gpuhealth clears the evidence recorded up to now and the flapping "
            f"history; if nothing new is wrong the node goes through Recovering and the probation{probation}."
        )
    else:
        lines.append(
            f"Forced (state {state or 'none'}): gpuhealth clears the evidence recorded up to now and the flapping "
            "history; no verdict holds the node out, so its state stays what its facts say."
        )
    if held_out:
        lines.append(
            "If the agent's reports stay clean for the whole probation it returns to service (taint and "
            "gpuhealth's cordon lifted); a new fault sends it back to quarantine. The operator removes the "
            "annotation once done."
        )
    else:
        lines.append("The operator removes the annotation once done.")
    lines.append(f"Follow it with: kubectl gpuhealth describe {node}")
    warnings = []
    if parsed is not None and parsed.mode == Mode.PAUSED:
        warnings.append(
            f"policy {parsed.name} is Paused: nothing happens until it is resumed (kubectl gpuhealth resume "
            f"{parsed.name})"
        )
    elif parsed is not None and parsed.mode == Mode.DRY_RUN:
        warnings.append(f"policy {parsed.name} is in DryRun: gpuhealth changes no Node, so nothing is lifted")
    if policy is None and status.policy:
        warnings.append(f"policy {status.policy} no longer exists: no operator will act on the release")
    if node_annotations and node_annotations.get(RELEASE_ANNOTATION):
        warnings.append(
            f"a release was already requested at {node_annotations[RELEASE_ANNOTATION]} and not processed yet "
            "(is the operator running?)"
        )
    return Plan(patch, tuple(lines), tuple(warnings))


def _burn_in_release(nv: NodeValidation) -> str:
    """What a release does to a burn-in's hold (``spec.validation.newNodes``)."""
    v = nv.validation
    how = f"burn-in {v.outcome}" + (f": {v.findings}" if v.findings else "")
    if not nv.done:
        how += "; the run is stopped and recorded as failed (released by a human)"
    return (
        f"Next: gpuhealth lifts its burn-in taint {BURN_IN_TAINT_KEY} ({how}). To burn the node in again, "
        f"label it {BURN_IN_LABEL}={BURN_IN_REQUESTED}."
    )


def plan_pause(policy: Mapping[str, Any]) -> Plan:
    """Set ``spec.mode: Paused`` and remember the previous mode in ``gpuhealth.dev/paused-from``."""
    name = _name(policy)
    mode = _mode(policy)
    if mode == Mode.PAUSED:
        return Plan(None, (f"gpuhealthpolicy/{name} is already Paused.",))
    patch = {
        "metadata": {
            "annotations": {PAUSED_FROM_ANNOTATION: mode},
            "resourceVersion": (policy.get("metadata") or {}).get("resourceVersion"),
        },
        "spec": {"mode": str(Mode.PAUSED)},
    }
    lines = (
        f"gpuhealthpolicy/{name} paused (was {mode}).",
        "gpuhealth takes no new action on the nodes it governs: no new quarantine, no return to service, "
        "no release. Taints and cordons already placed stay where they are.",
        f"Resume with: kubectl gpuhealth resume {name}   (restores {mode})",
    )
    return Plan(patch, lines)


def plan_resume(policy: Mapping[str, Any], mode: str | None = None) -> Plan:
    """Set ``spec.mode`` back to ``mode``, else to the remembered mode, else Enforce."""
    name = _name(policy)
    current = _mode(policy)
    annotations = (policy.get("metadata") or {}).get("annotations") or {}
    remembered = annotations.get(PAUSED_FROM_ANNOTATION)
    if mode is not None and mode not in RESUMABLE:
        raise Refused(f"--mode must be one of {', '.join(RESUMABLE)}, got {mode!r}")
    if current != Mode.PAUSED:
        if mode is None or mode == current:
            return Plan(None, (f"gpuhealthpolicy/{name} is not paused (mode {current}): nothing to resume.",))
        raise Refused(
            f"gpuhealthpolicy/{name} is not paused (mode {current}); resume only ends a pause. To change the mode: "
            f'kubectl patch gpuhealthpolicy {name} --type merge -p \'{{"spec":{{"mode":"{mode}"}}}}\''
        )
    target = mode or (remembered if remembered in RESUMABLE else str(Mode.ENFORCE))
    patch = {
        "metadata": {
            "annotations": {PAUSED_FROM_ANNOTATION: None},
            "resourceVersion": (policy.get("metadata") or {}).get("resourceVersion"),
        },
        "spec": {"mode": target},
    }
    source = "as asked" if mode else ("as before the pause" if remembered in RESUMABLE else "the default")
    lines = [f"gpuhealthpolicy/{name} resumed: mode {target} ({source})."]
    if target == Mode.ENFORCE:
        lines.append("gpuhealth re-evaluates every node it governs now and acts on what it finds.")
    else:
        lines.append("gpuhealth re-evaluates every node it governs and writes Events; it changes no Node.")
    return Plan(patch, tuple(lines))


def plan_release_gpu(node: str, report: Mapping[str, Any] | None, gpu: int, force: bool = False) -> Plan:
    """Return one repaired GPU to gpuhealth: annotate the Node with ``gpuhealth.dev/release-gpu=<index>``.

    The operator clears that GPU's evidence and flapping history, moves it from AwaitingRepair to
    Recovering (its DeviceTaintRule stays for the probation) and removes the annotation once done.
    Only an AwaitingRepair GPU is released unless ``force``; the node itself is left as it is.
    """
    entry = StoredStatus.of(report).devices.get(gpu)
    state = str(entry.state) if entry is not None else ""
    if state != DeviceState.AWAITING_REPAIR and not force:
        if entry is None:
            raise Refused(f"GPU {gpu} of node {node} has no gpuhealth record: nothing to release")
        why = f"{state} ({entry.reason})" if entry.reason else state
        raise Refused(
            f"GPU {gpu} of node {node} is {why}, not AwaitingRepair: gpuhealth returns it by itself once its "
            "facts clear and probation passes. Use --force to clear its evidence and flapping history anyway"
        )
    patch = {"metadata": {"annotations": {RELEASE_GPU_ANNOTATION: str(gpu)}}}
    rules = list(entry.taint_rules) if entry is not None else []
    rule = rules[0] + (f" and its {len(rules) - 1} other rules" if len(rules) > 1 else "") if rules else ""
    lines = [f"node/{node} GPU {gpu} released ({RELEASE_GPU_ANNOTATION}={gpu})."]
    if state == DeviceState.AWAITING_REPAIR and entry is not None and entry.kept_off_by:
        lines.append(
            "The GPU goes on probation; once its facts stay clean it returns to service, and gpuhealth lifts "
            f"its node taint {GPU_OUT_TAINT_KEY} (if it placed one) when no GPU of the node is held out any more, "
            "and removes the annotation when it has acted on it."
        )
    elif state == DeviceState.AWAITING_REPAIR:
        lines.append(
            "The GPU goes on probation; gpuhealth deletes its DeviceTaintRule"
            + (f" {rule}" if rule else "")
            + " once its facts stay clean, and removes the annotation when it has acted on it."
        )
    return Plan(patch, tuple(lines))


def plan_approval(
    node: str,
    report: Mapping[str, Any] | None,
    gpu: int | None,
    now: dt.datetime,
    reject: bool = False,
    user: str | None = None,
) -> Plan:
    """Approve (or reject) the repair or validation steps waiting in PendingApproval on ``node``
    (``spec.remediation.approval: Manual`` or ``TwoPerson``), or GPU ``gpu``'s only: one annotation on
    the Node. An approval by ``user`` (the CLI's identity, from the API server) is
    ``gpuhealth.dev/approver[-gpu-N].<slot>=<user>`` (``api/remediation_status.py`` ``approver_key``);
    without one, and for a rejection, ``gpuhealth.dev/approve`` (``reject``) with the time, or
    ``approve-gpu`` (``reject-gpu``) with the index. The operator records what it approved before it
    acts and removes the annotation once done. Refused when nothing waits: an approval is for a step a
    human has seen."""
    ladders = StoredStatus.of(report).ladders
    waiting = sorted(i for i, r in ladders.items() if r.phase == Phase.PENDING_APPROVAL)
    verb = "reject" if reject else "approve"
    if gpu is not None and gpu not in waiting:
        rec = ladders.get(gpu)
        where = f"GPU {gpu} of node {node}"
        why = f"its ladder is at {rec.step} {rec.phase}" if rec is not None else "it has no repair ladder"
        raise Refused(f"{where} has no step waiting for approval ({why}): nothing to {verb}")
    if not waiting:
        raise Refused(f"node {node} has no repair or validation step waiting for approval: nothing to {verb}")
    targets = [gpu] if gpu is not None else waiting
    if not reject and user and all(user in {a.by for a in ladders[i].approvers} for i in targets):
        which = f"GPU {gpu}'s waiting step" if gpu is not None else f"every step waiting on node {node}"
        raise Refused(
            f"{user} already approved {which}: the same person counts once, a second approval must come "
            "from someone else"
        )
    if not reject and user:
        key, value = approver_key(user, gpu), user
    elif gpu is not None:
        key = REJECT_GPU_ANNOTATION if reject else APPROVE_GPU_ANNOTATION
        value = str(gpu)
    else:
        key = REJECT_ANNOTATION if reject else APPROVE_ANNOTATION
        value = format_time(now)
    what = []
    for i in targets:
        rec = ladders[i]
        step = f"level-{rec.validation.level} validation" if rec.validation is not None else str(rec.step)
        by = f"; approved so far by {', '.join(a.by for a in rec.approvers)}" if rec.approvers else ""
        what.append(f"GPU {i}: {step} (attempt {rec.attempt}, for {rec.reason or 'its fault'}{by})")
    lines = [f"node/{node} annotated {key}={value}.", *what]
    if reject:
        lines.append("Those GPUs go to AwaitingRepair (replace or repair them, then release them).")
    else:
        lines.append(
            "gpuhealth records the approval, runs each step once it has its approvals (approval: TwoPerson - "
            "two different people for a step of twoPersonSteps) and its preconditions hold, and removes the annotation."
        )
    return Plan({"metadata": {"annotations": {key: value}}}, tuple(lines))
