"""The per-GPU state machine: device-scoped findings x prior per-GPU records x policy x time.

Pure. It mirrors the node state machine (transitions.py) one GPU at a time:

- InService -> Quarantined (a ``cordon`` finding) or Draining (``drain`` / ``repair``), only if the
  breaker's GPU budget admits it; otherwise the GPU stays InService with ``heldByBreaker``;
- Quarantined -> Draining on a drain-level finding not yet drained; Draining -> Quarantined or
  AwaitingRepair when its drain completes;
- out of service, facts clean -> Recovering; Recovering for ``probation`` of fresh, clean facts ->
  InService (its DeviceTaintRule is deleted); any fault during probation is a relapse;
- the ``flapping.maxQuarantines``-th quarantine within ``flapping.window`` -> AwaitingRepair (reason
  ``Flapping``), and with ``devices.onFlapping: Node`` the node is escalated as well;
- AwaitingRepair is left only through a human release -> Recovering;
- proof before return (``spec.validation``): a GPU whose repair must still be validated stays
  Recovering past its probation until the validation passes; one whose validation failed goes back
  to Quarantined (reason ``ValidationFailed``) for the ladder's next step.

A GPU whose findings are all confined to MIG instances (``Finding.instance``, placed on their MIG
devices) is held out by those instances alone (``DeviceRecord.instances``). While it is out that set
only grows: another instance's finding adds it, and a finding on the whole GPU widens the record to
the whole GPU until it is back in service (protection never narrows during a quarantine).

It also says whether the node must be quarantined instead: more GPUs out than
``devices.maxBadGPUsPerNode``, or a flapping GPU under ``onFlapping: Node``.

P2P-aware repair (``evaluation/peers.py``): a faulted GPU and the NVLink peers it holds out with it
(``DeviceInputs.groups``) leave service as one breaker decision, all of the group or none of it; the
peers (reason ``NVLinkPeer``) are not bad GPUs, so they do not count against ``maxBadGPUsPerNode``,
and once their hold ends they return at once, without probation.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpuhealth.api.devices import MAX_DEVICE_HISTORY, DeviceRecord, DeviceState
from gpuhealth.api.names import SLOW_SIGNALS, Action, Scope, Signal
from gpuhealth.api.policy import Policy
from gpuhealth.evaluation.assess import Finding
from gpuhealth.evaluation.scope import rule_of

_EVIDENCE_SIGNALS = frozenset({Signal.XID, Signal.APP_XID_REPEATED})  # events a release acknowledges


@dataclass(frozen=True)
class DeviceInputs:
    """Facts beyond the findings: freshness, the breaker's remaining GPU budget, drains, releases."""

    fresh: bool = True
    gpu_budget: int = 1_000_000
    # GPUs whose every finding is slow, not broken (api/names.py SLOW_SIGNALS) leave under the slow
    # budget (safety.maxSlow in GPUs), never the one meant for dead GPUs (maxUnhealthyGPUs).
    slow_budget: int = 1_000_000
    drained: frozenset[int] = frozenset()
    released: frozenset[int] = frozenset()
    uuids: Mapping[int, str] = field(default_factory=dict)  # the GPUs the report lists
    # The repair ladder (evaluation/ladder.py): GPUs whose ladder reached Replace wait for a human;
    # a step that worked acknowledges the GPU's XID evidence up to when it ended.
    replace: frozenset[int] = frozenset()
    acknowledged: Mapping[int, dt.datetime] = field(default_factory=dict)
    # spec.validation (evaluation/ladder.py ``holds``): GPUs that may not return on probation alone
    # (also a repaired GPU the device plugin still withholds, ``awaits_plugin``), and those whose
    # validation failed (back to Quarantined for the next step), with the findings.
    validating: frozenset[int] = frozenset()
    validation_failed: Mapping[int, str] = field(default_factory=dict)
    # P2P-aware repair (evaluation/peers.py): a faulted GPU with its NVLink peers, admitted as one.
    groups: tuple[frozenset[int], ...] = ()


@dataclass(frozen=True)
class DeviceEvent:
    type: str
    reason: str
    message: str
    index: int


@dataclass(frozen=True)
class DeviceVerdict:
    records: tuple[DeviceRecord, ...]
    escalate: bool = False
    escalate_reason: str = ""
    new_quarantines: tuple[int, ...] = ()
    # (GPU index, seconds since its previous quarantine) for GPUs taken out again after they had
    # returned to service: gpuhealth_gpu_time_between_failures_seconds
    intervals: tuple[tuple[int, float], ...] = ()
    lifted: tuple[int, ...] = ()
    events: tuple[DeviceEvent, ...] = ()

    @property
    def out_of_service(self) -> tuple[DeviceRecord, ...]:
        return tuple(r for r in self.records if r.out_of_service)

    def record(self, index: int) -> DeviceRecord | None:
        return next((r for r in self.records if r.index == index), None)


def _where(rec: DeviceRecord) -> str:
    return f"GPU {rec.index}" + (f" ({rec.uuid})" if rec.uuid else "")


def _level(findings: Iterable[Finding]) -> Action:
    return max((f.action for f in findings), key=lambda a: a.severity, default=Action.IGNORE)


def _top(findings: list[Finding]) -> Finding:
    epoch = dt.datetime.min.replace(tzinfo=dt.UTC)
    return min(findings, key=lambda f: (-f.action.severity, f.since or epoch, f.key))


def held_instances(rec: DeviceRecord, mine: Iterable[Finding]) -> tuple[str, ...]:
    """The MIG UUIDs a quarantine of ``rec`` holds out on their own; () is the whole GPU. Pure.

    Only when every finding is confined to an instance with a known MIG UUID; a GPU already out
    as a whole stays whole, and the instances of a GPU out keep being held out."""
    uuids = {f.instance.uuid if f.instance is not None else "" for f in mine}
    if "" in uuids or (rec.out_of_service and not rec.instances):
        return ()
    return tuple(sorted(uuids | (set(rec.instances) if rec.out_of_service else set())))


def slow_gpu(findings: Iterable[Finding]) -> bool:
    """Whether everything that takes a GPU out is slow, not broken: it leaves under the slow budget."""
    taking = [f for f in findings if f.action.quarantines]
    return bool(taking) and all(f.signal in SLOW_SIGNALS for f in taking)


def _budget_words(policy: Policy, slow: bool) -> str:
    if slow:
        return f"slow GPU budget is spent (maxSlow {policy.max_slow}, in GPUs)"
    return (
        f"GPU budget is spent (maxUnhealthyGPUs {policy.max_unhealthy_gpus or 'unset: the maxUnhealthy nodes in GPUs'})"
    )


def _index_of(f: Finding, uuids: Mapping[int, str]) -> int | None:
    if f.gpu is not None:
        return f.gpu
    return next((i for i, u in uuids.items() if f.uuid and u == f.uuid), None)


def decide_devices(
    prior: Mapping[int, DeviceRecord],
    findings: Iterable[Finding],
    policy: Policy,
    now: dt.datetime,
    inputs: DeviceInputs = DeviceInputs(),
) -> DeviceVerdict:
    """Each GPU's next record, and whether the node must be quarantined instead.

    ``findings`` may be the whole assessment's: only quarantine-level, device-scoped ones count.
    A device finding whose GPU cannot be told (no index, unknown UUID) escalates to the node.
    """
    by_gpu: dict[int, list[Finding]] = {}
    unplaced: list[Finding] = []
    for f in findings:
        if f.scope != Scope.DEVICE or not f.action.quarantines:
            continue
        index = _index_of(f, inputs.uuids)
        if index is None:
            unplaced.append(f)
        else:
            by_gpu.setdefault(index, []).append(f)
    indices = sorted(set(inputs.uuids) | set(by_gpu) | {i for i, r in prior.items() if r.out_of_service})
    budget = max(0, inputs.gpu_budget)
    slow_budget = max(0, inputs.slow_budget)
    # A group leaves service whole or not at all: one breaker decision for the GPUs of it that want out.
    grouped: dict[int, bool] = {}
    for group in inputs.groups:
        wanting = {i for i in group if by_gpu.get(i) and not (prior.get(i) and prior[i].out_of_service)} - set(grouped)
        admit = len(wanting) <= budget
        budget -= len(wanting) if admit else 0
        grouped.update(dict.fromkeys(wanting, admit))
    records: list[DeviceRecord] = []
    events: list[DeviceEvent] = []
    new: list[int] = []
    intervals: list[tuple[int, float]] = []
    lifted: list[int] = []
    for index in indices:
        rec = prior.get(index) or DeviceRecord(index=index)
        was_in_service = rec.state == DeviceState.IN_SERVICE
        uuid = inputs.uuids.get(index) or rec.uuid
        rec = replace(rec, uuid=uuid)
        ack = inputs.acknowledged.get(index)
        if ack is not None and (rec.cleared_before is None or rec.cleared_before < ack):
            rec = replace(rec, cleared_before=ack)
        mine = [
            f
            for f in by_gpu.get(index, [])
            if not (f.signal in _EVIDENCE_SIGNALS and rec.cleared_before and f.since and f.since <= rec.cleared_before)
        ]
        slow = slow_gpu(mine)
        # A grouped GPU was decided with its group (above); any other spends the budget of its kind.
        left = grouped.get(index, (slow_budget if slow else budget) > 0)
        step = _step(rec, mine, policy, now, inputs, index in inputs.drained, index in inputs.released, left, slow)
        rec = step.record
        if step.admitted and index in grouped:
            pass
        elif step.admitted and slow:
            slow_budget -= 1
        elif step.admitted:
            budget -= 1
        if step.new_quarantine:
            new.append(index)
            if was_in_service and len(rec.last_failures) == 2 and rec.reason != Signal.NVLINK_PEER:
                intervals.append((index, max(0.0, (rec.last_failures[1] - rec.last_failures[0]).total_seconds())))
        if step.lift:
            lifted.append(index)
        events.extend(DeviceEvent(t, r, m, index) for t, r, m in step.events)
        records.append(rec)
    out = [r for r in records if r.out_of_service and r.reason != Signal.NVLINK_PEER]  # peers are not bad GPUs
    flapped_to_node = [
        r
        for r in out
        if policy.devices.on_flapping == "Node"
        and r.state == DeviceState.AWAITING_REPAIR
        and r.reason == str(Signal.FLAPPING)
    ]
    escalate_reason = ""
    if unplaced:
        escalate_reason = "; ".join(f"{f.describe()}: the GPU cannot be told apart" for f in unplaced)
    elif flapped_to_node:
        escalate_reason = (
            f"{_where(flapped_to_node[0])} flaps (quarantined {len(flapped_to_node[0].quarantines)} times within "
            f"{int(policy.flapping_window_s)}s); the policy takes the node out (devices.onFlapping: Node)"
        )
    elif len(out) > policy.devices.max_bad_gpus_per_node:
        escalate_reason = (
            f"{len(out)} GPUs out of service ({', '.join(str(r.index) for r in out)}), more than "
            f"devices.maxBadGPUsPerNode {policy.devices.max_bad_gpus_per_node}: the node is quarantined"
        )
    return DeviceVerdict(
        records=tuple(records),
        escalate=bool(escalate_reason),
        escalate_reason=escalate_reason,
        new_quarantines=tuple(new),
        intervals=tuple(intervals),
        lifted=tuple(lifted),
        events=tuple(events),
    )


@dataclass(frozen=True)
class _Step:
    record: DeviceRecord
    admitted: bool = False
    new_quarantine: bool = False
    lift: bool = False
    events: tuple[tuple[str, str, str], ...] = ()


def _step(
    rec: DeviceRecord,
    mine: list[Finding],
    policy: Policy,
    now: dt.datetime,
    inputs: DeviceInputs,
    drained: bool,
    released: bool,
    budget_left: bool,
    slow: bool = False,
) -> _Step:
    events: list[tuple[str, str, str]] = []
    if released:
        rec = replace(rec, cleared_before=now, quarantines=())
        if rec.state == DeviceState.AWAITING_REPAIR:
            rec = replace(rec, state=DeviceState.RECOVERING, since=now, healthy_since=None, drained=False)
            events.append(("Normal", "Released", f"{_where(rec)} released by a human; on probation"))
            mine = [f for f in mine if f.signal not in _EVIDENCE_SIGNALS]
    window = dt.timedelta(seconds=policy.flapping_window_s)
    rec = replace(rec, quarantines=tuple(t for t in rec.quarantines if now - t <= window))
    if rec.state == DeviceState.AWAITING_REPAIR:
        return _Step(rec, events=tuple(events))
    if rec.index in inputs.replace and rec.out_of_service and not released:
        rec = replace(rec, state=DeviceState.AWAITING_REPAIR, since=now, drain_action=str(Action.REPAIR))
        events.append(
            ("Warning", "AwaitingRepair", f"{_where(rec)}: its repair ladder is exhausted; it waits for a human")
        )
        return _Step(rec, events=tuple(events))
    if rec.state == DeviceState.DRAINING and drained:
        nxt = DeviceState.AWAITING_REPAIR if rec.drain_action == Action.REPAIR else DeviceState.QUARANTINED
        rec = replace(rec, state=nxt, since=now, drained=True)
        what = "waits for a human repair" if nxt == DeviceState.AWAITING_REPAIR else "stays tainted until it is clean"
        events.append(("Normal", "DrainComplete", f"{_where(rec)}: the pods that held it are gone; it {what}"))
        return _Step(rec, events=tuple(events))
    level = _level(mine)
    if level.quarantines:
        top = _top(mine)
        detail = "; ".join(f.describe() for f in sorted(mine, key=lambda f: f.key))
        if rec.out_of_service:
            rec = replace(rec, instances=held_instances(rec, mine))
            if rec.reason == Signal.NVLINK_PEER and top.signal != Signal.NVLINK_PEER:
                rec = replace(rec, reason=top.reason, rule=rule_of(top))  # a fault of its own: its own path
        if not rec.out_of_service:
            if not budget_left:
                if not rec.held_by_breaker:
                    events.append(
                        (
                            "Warning",
                            "QuarantineHeldBack",
                            f"{detail}. The policy {policy.name!r} {_budget_words(policy, slow)}: "
                            "not taking the GPU out yet",
                        )
                    )
                held = replace(rec, held_by_breaker=True, reason=top.reason, rule=rule_of(top), message=detail)
                return _Step(held, events=tuple(events))
            entering = replace(rec, instances=held_instances(rec, mine))
            return _enter(entering, top, level, detail, now, policy, events, admitted=True)
        if rec.state == DeviceState.RECOVERING:
            return _enter(rec, top, level, detail, now, policy, events, relapse=True)
        if rec.state == DeviceState.QUARANTINED and level == Action.REPAIR and rec.drained:
            rec = replace(rec, state=DeviceState.AWAITING_REPAIR, since=now, reason=top.reason, message=detail)
            events.append(("Warning", "AwaitingRepair", f"{detail}. The GPU waits for a human repair"))
            return _Step(rec, events=tuple(events))
        if rec.state == DeviceState.QUARANTINED and level.severity >= Action.DRAIN.severity and not rec.drained:
            rec = replace(
                rec, state=DeviceState.DRAINING, since=now, reason=top.reason, drain_action=str(level), message=detail
            )
            events.append(("Warning", "Draining", f"{detail}. Draining the pods that hold the GPU"))
            return _Step(rec, events=tuple(events))
        if rec.state == DeviceState.DRAINING and level == Action.REPAIR and rec.drain_action != Action.REPAIR:
            rec = replace(rec, drain_action=str(Action.REPAIR), reason=top.reason)
        return _Step(replace(rec, message=detail), events=tuple(events))
    # No fault on this GPU.
    if not rec.out_of_service:
        cleared = replace(rec, held_by_breaker=False, reason="", rule="", message="", instances=())
        return _Step(cleared, events=tuple(events))
    if rec.state == DeviceState.DRAINING and rec.drain_action == Action.REPAIR:
        return _Step(rec, events=tuple(events))  # suspect hardware: finish the drain, then a human decides
    if not inputs.fresh:
        return _Step(replace(rec, healthy_since=None), events=tuple(events))  # stale facts never count
    if rec.reason == Signal.NVLINK_PEER and rec.state != DeviceState.AWAITING_REPAIR:
        # Held only for a peer's repair, which no longer needs it: back at once (evaluation/peers.py).
        rec = _back_in_service(rec, now)
        events.append(("Normal", "PeerReturned", f"{_where(rec)}: its NVLink peer's repair is done; back in service"))
        return _Step(rec, lift=True, events=tuple(events))
    failed = inputs.validation_failed.get(rec.index)
    if failed is not None:
        if rec.state == DeviceState.RECOVERING:
            msg = f"{_where(rec)}: its validation failed ({failed}); held out for the repair ladder's next step"
            rec = replace(
                rec,
                state=DeviceState.QUARANTINED,
                since=now,
                healthy_since=None,
                reason="ValidationFailed",
                message=msg,
            )
            events.append(("Warning", "ValidationFailed", msg))
        return _Step(rec, events=tuple(events))
    if rec.state != DeviceState.RECOVERING or rec.healthy_since is None:
        if rec.state != DeviceState.RECOVERING:
            events.append(
                ("Normal", "Recovering", f"{_where(rec)} is clean; back in service after {int(policy.probation_s)}s")
            )
        rec = replace(
            rec, state=DeviceState.RECOVERING, since=rec.since if rec.state == DeviceState.RECOVERING else now
        )
        return _Step(replace(rec, healthy_since=now), events=tuple(events))
    if (now - rec.healthy_since).total_seconds() < policy.probation_s or rec.index in inputs.validating:
        return _Step(rec, events=tuple(events))
    rec = _back_in_service(rec, now)
    events.append(("Normal", "ReturnedToService", f"{_where(rec)} clean for the whole probation: taint removed"))
    return _Step(rec, lift=True, events=tuple(events))


def _back_in_service(rec: DeviceRecord, now: dt.datetime) -> DeviceRecord:
    """The record of a GPU that serves again: every trace of its hold and drain gone (its history stays)."""
    return replace(
        rec,
        state=DeviceState.IN_SERVICE,
        since=now,
        reason="",
        rule="",
        message="",
        healthy_since=None,
        drain_action="",
        drained=False,
        instances=(),
    )


def _enter(
    rec: DeviceRecord,
    top: Finding,
    level: Action,
    detail: str,
    now: dt.datetime,
    policy: Policy,
    events: list[tuple[str, str, str]],
    admitted: bool = False,
    relapse: bool = False,
) -> _Step:
    quarantines = (*rec.quarantines, now)[-MAX_DEVICE_HISTORY:]
    # A record written before lastFailures existed: its newest quarantine still in the window.
    failures = (*(rec.last_failures or rec.quarantines[-1:]), now)[-2:]
    if top.signal == Signal.NVLINK_PEER:  # held for a peer's repair: not a failure of its own, never flapping
        quarantines, failures = rec.quarantines, rec.last_failures
    base = replace(
        rec,
        since=now,
        quarantines=quarantines,
        last_failures=failures,
        held_by_breaker=False,
        healthy_since=None,
        drained=False,
        rule=rule_of(top),
    )
    if len(quarantines) >= policy.flapping_max and top.signal != Signal.NVLINK_PEER:
        nrec = replace(
            base,
            state=DeviceState.AWAITING_REPAIR,
            reason=str(Signal.FLAPPING),
            message=f"quarantined {len(quarantines)} times within the flapping window; last: {detail}",
            drain_action=str(Action.REPAIR),
        )
        events.append(("Warning", "Flapping", f"{detail}. The GPU stays out until a human releases it"))
        return _Step(nrec, admitted=admitted, new_quarantine=True, events=tuple(events))
    state = DeviceState.QUARANTINED if level == Action.CORDON else DeviceState.DRAINING
    nrec = replace(
        base,
        state=state,
        reason=top.reason,
        message=detail,
        drain_action=str(level) if state == DeviceState.DRAINING else "",
    )
    verb = "Relapsed during probation" if relapse else "GPU quarantined"
    then = "its pods are drained" if state == DeviceState.DRAINING else "running pods continue"
    only = "this GPU is taken out"
    if rec.instances:
        verb = "Relapsed during probation" if relapse else "MIG device quarantined"
        n = len(rec.instances)
        only = f"its MIG device{'s' if n > 1 else ''} {', '.join(rec.instances)} {'are' if n > 1 else 'is'} taken out, "
        only += "the GPU serves on with its others"
        then = then.replace("its pods", "the pods holding " + ("them" if n > 1 else "it"))
    events.append(("Warning", "DeviceQuarantined", f"{verb}: {detail}. Only {only}; {then}"))
    return _Step(nrec, admitted=admitted, new_quarantine=True, events=tuple(events))
