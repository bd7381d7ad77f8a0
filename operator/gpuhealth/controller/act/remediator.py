"""Repair, not only quarantine: climbs each held-out GPU's ladder (``evaluation/ladder.py``).

Called by the node reconciler after the node's and the GPUs' drains, once per pass of a node whose
policy enables ``spec.remediation``. Per GPU it reads what the ladder needs from the API (the
attempt's Job by its recorded name: ``step_jobs.py``), checks a GPUReset's preconditions right before it starts, asks
the pure ladder for the next move, and then acts in an order that survives a kill at any line (it
decides after the Node write, so its records are written through ``status_writes.py``, not in the
node's decision patch):

1. ``status.remediation["<index>"]`` first (the write-ahead record: step, attempt, the Job's name;
   its patch planned by ``actions/ladder_patches.py``), then the move's Events (announced once
   recorded, before anything acts on it);
2. then the Job: created under that deterministic name (409: it exists, done), or deleted when
   its attempt ran past its timeout;
3. then the record again (``Running``), and metrics.

Killed after 1, the restarted operator finds ``Pending`` and a Job name: it GETs the Job and
creates it only if it is absent. Killed after 2, the GET finds it. Never a second reset.

A GPUReset starts only when all of these hold, the last two re-read from the API right before:
the GPU is Quarantined, its drain complete and its DeviceTaintRule (NoSchedule) recorded; the node
itself is in service; no other step is in flight on this node; fewer than ``maxConcurrent``
resets are in flight across the policy's nodes; gpuhealth's DeviceTaintRule for it exists with
effect NoSchedule; and no pod holds the device (ResourceClaims listed afresh, pods of the node
listed from the API, not the cache). Otherwise the GPU waits, with one ``RemediationBlocked``
Event per reason. A pod on the node that holds it queues the node when it leaves (the pod watch). A
claim still reserved for a pod that is not on the node (gone, and the claim controller has yet to
clear ``reservedFor``; or not bound yet) changes with no event gpuhealth watches: the node is looked
at again after ``HANDOVER_S``, growing while the wait lasts. Waiting for an unrelated event instead
left a drained GPU unreset for tens of seconds (docs/remediation.md, the measured repair).

"The device" is every DRA device of the GPU (``DeviceRecord.devices``), each with its own rule: a
MIG-enabled GPU is published only as its MIG devices, and a reset or a DCGM diagnostic takes all of
its instances at once (DCGM diagnoses a MIG GPU only with every instance idle), so neither starts
while a pod still holds any instance of it. A GPU with only some instances held out climbs no ladder.

P2P-aware repair: a GPU whose recovery action needs its NVLink peers idle (``DrainAndReset``) and
whose report names them resets only once every peer is held out by gpuhealth too (``NVLinkPeer``,
``evaluation/peers.py``), Quarantined with its drain complete, its rule NoSchedule and no pod
holding its devices, all re-read like the GPU's own. ONE reset Job, for the faulted GPU alone: a
reset on an NVSwitch system is of the GPU NVIDIA names, with its peers idle. With the peers not
known, the ladder starts at ``NodeReboot`` and a ``PeersUnknown`` Event says why, once per ladder.

Proof before return (``spec.validation``): a reset that worked puts the record in ``Validating``.
The validation Job (``actions/validation_jobs.py``) starts under the same discipline: its
preconditions re-read from the API (rule in place, no pod holds the device, fewer than
``spec.validation.maxConcurrent`` validations running), its name recorded before it is created
(``validation.job``, ``created: false``), then created (409: it exists), then ``created: true``.
Killed in between, the restarted operator creates it once under the recorded name; a Job absent
after ``created`` is ``Lost``. Its verdict is read by name: the Job, and its pod among the node's.

Repeat offenders: each attempt a record adds to its history is also appended, in the same write-ahead
patch, to ``status.repairs["<GPU UUID>"]`` (bounded: ``MAX_REPAIRS`` per GPU, ``MAX_REPAIR_GPUS``
GPUs), which the ladder reads back as the GPU's earlier repairs whatever its index.

The device-plugin route (a GPU held out with no DRA device: ``DeviceRecord.via_plugin``): its hold is
the device plugin's withholding or gpuhealth's ``gpu-out`` node taint, re-read from the Node right
before a reset or a validation, and the pods that hold it are those the agent's report names, matched
against the pods the API has on the node. Once its repair worked and its probation is over, a GPU the
plugin still withholds (the Node's allocatable short of it) gets the plugin restarted, in the same
write-ahead order: the plugin's pod (``actions/plugin_restart.py``) recorded by name and uid in
``status.remediation["<index>"].plugin``, then deleted with that uid as its precondition (404 or 409:
it is gone already, never the DaemonSet's new pod), then ``deleted: true``. Killed in between, the
restarted operator deletes the recorded pod once more (404: done). No pod, no permission (403) or a
taint its DaemonSet would not tolerate: nothing is deleted, the record's ``blocked`` and message and a
``DevicePluginNotRestarted`` Event say that the GPU stays withheld until the plugin restarts. The GPU
returns only once the Node's allocatable shows it (``evaluation/ladder.py`` ``awaits_plugin``).

Human approval (``approval: Manual`` or ``TwoPerson``): a record in ``PendingApproval`` consumes the
Node's approve or reject annotation (``api/remediation_status.py`` ``Approvals``) only by writing itself
past that phase (``approved`` recorded, or the Job's name) or, for an approval that names its approver
(``gpuhealth.dev/approver*``), by writing the approver into its ``approvers``; the node reconciler
removes the annotation only after this pass, so a SIGKILL in between neither loses the approval (still
on the Node) nor uses it twice (the record no longer waits, or already names that approver: the same
person counts once). Under ``TwoPerson`` a step of ``twoPersonSteps`` is approved only once the
record's approvers and this pass's number two distinct names; an approval naming nobody counts only
under ``Manual``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from kubernetes.client.rest import ApiException

from gpuhealth.actions import validation_jobs
from gpuhealth.actions.ladder_patches import entry_patch, repairs_patch
from gpuhealth.actions.plugin_hold import gpu_out_tainted, offered_words, still_withheld
from gpuhealth.actions.plugin_restart import plugin_pod, restart_hint
from gpuhealth.actions.remediation_jobs import build_reset_job, job_name
from gpuhealth.api.devices import DeviceRecord, DeviceRef, DeviceState
from gpuhealth.api.names import OUT_OF_SERVICE, Mode
from gpuhealth.api.nodes import plugin_withholds
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.remediation import Approval, RemediationSettings, StepKind
from gpuhealth.api.remediation_status import (
    Approvals,
    Approver,
    LadderRecord,
    Phase,
    Repair,
    merge_approvers,
)
from gpuhealth.api.report import Device
from gpuhealth.api.status import Record
from gpuhealth.api.timeutil import format_time
from gpuhealth.api.validation import Outcome
from gpuhealth.controller import metrics
from gpuhealth.controller.act import status_writes
from gpuhealth.controller.act.again import Again, soonest
from gpuhealth.controller.act.passes import NodePass
from gpuhealth.controller.act.step_jobs import StepJobs
from gpuhealth.controller.backoff import growing_delay
from gpuhealth.controller.state.job_slots import JobSlots, Slot
from gpuhealth.controller.state.store import Store
from gpuhealth.drain.claims import pods_holding
from gpuhealth.evaluation.ladder import GPU, Move, Observed, advance, restart_blocked, steps_for
from gpuhealth.evaluation.peers import REREAD_TIMEOUT_S, awaiting_reread, needs_peers_idle, p2p_drain, peers_of
from gpuhealth.kube.aio import AsyncKube
from gpuhealth.kube.events import EventSink

log = logging.getLogger(__name__)
POLL_S = 2.0  # a step in flight is looked at again this often (Jobs are read by name, not watched)
HANDOFF_POLL_S = 30.0
P2P_WAIT = (
    "recovery action DrainP2P: its NVLink peers are drained with it; waiting for the agent's next reading, which "
    f"names the next action (a NodeReboot if it still says DrainP2P {int(REREAD_TIMEOUT_S)}s after the drain)"
)
HANDOVER_S, HANDOVER_MAX_S = 0.5, 30.0  # a claim reserved for a pod not on the node: looked at again


def facts_clean(device: Device | None) -> bool:
    """The agent's facts show nothing a reset or a reboot clears (read only when fresh)."""
    if device is None:
        return False
    return (
        device.ecc_volatile_uncorrected == 0
        and not device.remap_pending
        and not device.retired_pending
        and device.recovery_action in (None, RecoveryAction.NONE)
    )


def approved_enough(
    settings: RemediationSettings, rec: LadderRecord, approvers: Sequence[Approver], calls: Approvals
) -> bool:
    """Whether ``rec``'s waiting step may run: as many distinct approvers as it needs (TwoPerson: two for
    a step of ``twoPersonSteps``); under Manual an approval that names nobody (``approve[-gpu]``) is
    enough too. A rejection was looked at first."""
    if settings.approval == Approval.MANUAL and calls.approves(rec.index):
        return True
    return len({a.by for a in approvers}) >= max(1, settings.approvals_needed(rec.approval_step))


class Remediator:
    def __init__(
        self,
        *,
        kube: AsyncKube,
        store: Store,
        events: EventSink,
        slots: JobSlots | None = None,
        jobs: StepJobs | None = None,
    ) -> None:
        self.kube = kube
        self.store = store
        self.events = events
        self._blocked: dict[tuple[str, int], str] = {}  # last RemediationBlocked reason, per GPU
        self._handover: dict[tuple[str, int], int] = {}  # looks at a GPU held by a stale reservation
        self.slots = slots or JobSlots(store)  # places under the policy's limits (the node validator's too)
        self.jobs = jobs or StepJobs(kube)  # the steps' Jobs, by their recorded names (the node validator's too)

    def _event(self, node: str, type_: str, reason: str, message: str) -> None:
        self.events("Node", node, node, type_, reason, message)

    async def run(self, p: NodePass, node: Record, records: Sequence[DeviceRecord]) -> Again:
        """Advance each held-out GPU's ladder one move; returns when the node wants its next pass
        (a step in flight is polled, a hand-off checked less often). Before a release (or a human's
        approve or reject) is acknowledged: the node reconciler removes the annotation after this."""
        name, policy, report, now = p.name, p.policy, p.report, p.now
        fresh, released, node_cleared = not p.assessment.unknown, p.gpus, p.cleared
        settings = policy.remediation
        if not settings.enabled or policy.mode == Mode.PAUSED:
            return None
        again: Again = None
        # The ladders as this pass leaves them (the remediator is the only writer of its records): each
        # GPU's next check, one reset at a time per node, sees the moves written before it in this pass.
        ladders = dict(p.found.ladders)
        repairs = dict(p.found.repairs)  # a copy: repairs_patch keeps it up to date as attempts are added
        dry = policy.mode == Mode.DRY_RUN
        manual = settings.waits_for_people
        calls = p.approvals if not dry else Approvals()
        plugin_out = sum(1 for r in records if r.via_plugin and r.out_of_service)
        counts = offered_words(p.node)
        for dev in sorted(records, key=lambda r: r.index):
            lad = ladders.get(dev.index)
            if lad is None and (not dev.out_of_service or dev.instances):
                # A GPU with only some MIG devices out climbs no ladder: a reset or a reboot would
                # take its other instances, which still serve, with it.
                self._blocked.pop((name, dev.index), None)
                continue
            facts = report.device(dev.index) if report is not None else None
            peers = peers_of(facts) if needs_peers_idle(facts) else None
            reason = lad.reason if lad else dev.reason
            steps = steps_for(settings, reason, facts.recovery_action if facts else None, peers is not None)
            if lad is None and p2p_drain(facts) and dev.out_of_service:
                # DrainP2P: the group is drained, then the agent reads the field again (evaluation/peers.py).
                wait = awaiting_reread(dev, now)
                if wait is not None:
                    self._block(name, dev.index, P2P_WAIT, "step")
                    again = soonest(again, wait if dev.drained else None)
                    continue
                steps = steps_for(settings, reason, facts.recovery_action if facts else None)  # NodeReboot
            gpu = GPU(
                index=dev.index,
                uuid=dev.uuid,
                state=dev.state,
                reason=dev.reason,
                since=dev.since,
                drained=dev.drained,
                taint_rule=dev.taint_rule,
                facts_clean=fresh and facts_clean(facts),
                plugin=dev.via_plugin,
            )
            job = ""
            if lad is not None and lad.job and lad.phase in (Phase.PENDING, Phase.RUNNING):
                job = await self.jobs.outcome(lad.job)
            may_start = handover = False
            next_kind = lad.step if lad is not None else (steps[0].kind if steps else None)
            waiting = lad is not None and lad.phase == Phase.PENDING_APPROVAL
            rejected = waiting and calls.rejects(dev.index)
            approvers = merge_approvers(lad.approvers, calls.approvers(dev.index), now) if waiting and lad else ()
            approved = waiting and not rejected and lad is not None and approved_enough(settings, lad, approvers, calls)
            ready = lad is None or lad.phase == Phase.READY or (approved and lad.validation is None)
            may_approve = not manual or approved or (lad is not None and lad.approved)
            if (
                ready
                and may_approve
                and not dry
                and next_kind == StepKind.GPU_RESET
                and dev.state == DeviceState.QUARANTINED
                and dev.drained
                and (dev.taint_rule or dev.via_plugin)
            ):
                may_start, handover = await self._may_start(p, node, dev, peers or (), records, ladders)
            verdict: tuple[Outcome, str] | None = None
            may_validate = False
            clean_unattended = gpu.facts_clean and not manual  # no human's approval to wait for
            v = lad.validation if lad is not None and lad.phase == Phase.VALIDATING else None
            if v is not None and v.outcome == Outcome.RUNNING and v.created and v.job:
                verdict = await self.jobs.validation_verdict(name, v.job)
            elif (
                lad is not None
                and not dry
                and policy.validation.enabled
                and (
                    (lad.phase == Phase.VALIDATING and (v is None or v.outcome == Outcome.PENDING))
                    # the pass that finds the reset's facts clean starts the validation at once
                    or (lad.phase == Phase.VERIFYING and lad.step == StepKind.GPU_RESET and clean_unattended)
                    or (approved and lad.validation is not None)
                )
            ):
                may_validate, handover = await self._may_validate(p, dev, records)
            uuid = (lad.uuid if lad is not None else "") or dev.uuid  # the GPU the ladder is for
            earlier = tuple(r.attempt for r in repairs.get(uuid, ())) if uuid else ()
            healthy = dev.healthy_since if dev.state == DeviceState.RECOVERING else None
            obs = Observed(
                job,
                may_start,
                node_cleared,
                dev.index in released,
                dry,
                may_validate=may_validate,
                validation=verdict,
                manual=manual,
                approved=approved,
                rejected=rejected,
                approvers=approvers,
                two_person=settings.needs_two,
                repairs=earlier,
                repeat=settings.repeat,
                plugin_withheld=dev.via_plugin and still_withheld(p.node, plugin_out),
                plugin_counts=counts,
                probation_over=healthy is not None and (now - healthy).total_seconds() >= policy.probation_s,
                plugin_restart=settings.device_plugin.restart,
                plugin_timeout_s=settings.device_plugin.return_timeout_s,
            )
            move = advance(lad, gpu, steps, obs, now, policy.validation)
            if lad is None and move.record is not None and needs_peers_idle(facts) and peers is None:
                move = replace(move, events=(*move.events, self._peers_unknown(dev, facts)))
            if handover:  # no event comes when the claim controller clears the reservation: look again
                looks = self._handover[(name, dev.index)] = self._handover.get((name, dev.index), 0) + 1
                again = soonest(again, growing_delay(looks, HANDOVER_S, HANDOVER_MAX_S))
            else:
                self._handover.pop((name, dev.index), None)
            try:
                left = await self._act(p, dev, lad, move, repairs)
                if left is None:
                    ladders.pop(dev.index, None)
                else:
                    ladders[dev.index] = left
            finally:
                self.slots.end(Slot.RESET, name, dev.index)
                self.slots.end(Slot.VALIDATION, name, dev.index)
            if move.record is not None and move.record.in_flight:
                again = soonest(again, POLL_S)
            elif move.record is not None and move.record.phase == Phase.RESTARTING_PLUGIN and move.record.plugin:
                # Allocatable comes back with a Node event; until the timeout it is also looked at.
                plugin = move.record.plugin
                again = soonest(again, None if plugin.blocked or plugin.timed_out else POLL_S)
            elif move.record is not None and move.record.phase == Phase.HANDED_OFF:
                again = soonest(again, HANDOFF_POLL_S)
        return again

    async def _act(
        self,
        p: NodePass,
        dev: DeviceRecord,
        lad: LadderRecord | None,
        move: Move,
        repairs: dict[str, tuple[Repair, ...]] | None = None,
    ) -> LadderRecord | None:
        """Carry out ``move`` (the module docstring's order); returns the GPU's record as it leaves it."""
        name, policy, now = p.name, p.policy, p.now
        old: Mapping[str, Any] | None = p.found.ladder_entries.get(str(dev.index))  # the entry as written
        settings = policy.remediation
        rec = move.record
        body: dict[str, Any] | None = None
        if move.start == StepKind.GPU_RESET and rec is not None:
            jname = rec.job.partition("/")[2] or job_name(
                name, dev.index, dev.uuid, format_time(rec.since or now), rec.attempt
            )
            step = next((s for s in steps_for(settings, rec.reason) if s.kind == StepKind.GPU_RESET), None)
            body, why = build_reset_job(settings, name, dev.index, dev.uuid, jname, step.timeout_s if step else 600.0)
            if body is None:
                self._block(name, dev.index, why)
                return lad  # no record, no Job: the GPU stays held out and reported
            rec = rec if rec.job else replace(rec, job=f"{settings.namespace}/{jname}")
        vbody: dict[str, Any] | None = None
        if move.start_validation and rec is not None and rec.validation is not None:
            v = rec.validation
            vname = v.job.partition("/")[2] or validation_jobs.job_name(
                name, dev.index, dev.uuid, format_time(rec.since or now), rec.attempt
            )
            vbody, why = validation_jobs.build_validation_job(
                settings, policy.validation, name, dev.index, dev.uuid, vname
            )
            if vbody is None:
                self._block(name, dev.index, why)
                return lad  # the record stays where it was: the GPU stays held out, the next pass tries again
            rec = replace(rec, validation=replace(v, job=f"{settings.namespace}/{vname}"))
        if move.restart_plugin and rec is not None and rec.plugin is not None and not rec.plugin.pod:
            # The device plugin's pod on the node, picked right before the record names it.
            plugin, restart = settings.device_plugin, rec.plugin
            pods = await self.kube.list_pods_on_node(name)
            pod, why = plugin_pod(pods, plugin, p.node, name)
            if pod is None:
                move = restart_blocked(rec, why, restart_hint(plugin, name), offered_words(p.node))
                rec = move.record
            else:
                meta = pod["metadata"]
                picked = replace(restart, pod=f"{meta.get('namespace')}/{meta.get('name')}", uid=str(meta["uid"]))
                rec = replace(rec, plugin=picked)
        left = lad
        if rec != lad:
            # 1. the write-ahead record, and the attempts it adds in the GPU's history by UUID
            await self._write(name, dev.index, entry_patch(rec, old), repairs_patch(repairs, dev, lad, rec))
            old = rec.to_status() if rec is not None else None
            left = rec
        # The move is announced right after it is recorded and before anything acts on it (as the
        # node reconciler does): a kill after the record leaves its announcement posted, or about to
        # be, and a resumed pass acts on the record without announcing it again.
        for type_, reason, message in move.events:
            if reason == "GPUReset" and rec is not None:
                message += f", Job {rec.job}"
            if reason == "ValidationStarted" and rec is not None and rec.validation is not None:
                message += f", Job {rec.validation.job}"
            if reason == "RestartingDevicePlugin" and rec is not None and rec.plugin is not None:
                message += f": pod {rec.plugin.pod}"
            self._event(name, type_, reason, message)
        if move.stop_job:
            await self.jobs.delete(move.stop_job)
        if move.restart_plugin and rec is not None and rec.plugin is not None and rec.plugin.pod:
            left = await self._restart_plugin(p, dev, rec, old)
        if body is not None and rec is not None:
            await self.jobs.create(body, partial(self._block, name, dev.index))  # 2. the Job, under the recorded name
            left = replace(rec, phase=Phase.RUNNING)
            await self._write(name, dev.index, entry_patch(left, old))  # 3.
        if vbody is not None and rec is not None and rec.validation is not None:
            await self.jobs.create(vbody, partial(self._block, name, dev.index))  # 2. the validation Job, recorded name
            left = replace(rec, validation=replace(rec.validation, created=True))
            await self._write(name, dev.index, entry_patch(left, old))  # 3.
        if move.repeat_offender:
            metrics.REPEAT_OFFENDERS.inc()
        if move.validated is not None:
            metrics.VALIDATIONS.labels(move.validated[0]).inc()
            if move.validated[1] is not None:
                metrics.VALIDATION_DURATION.observe(move.validated[1])
        for kind, result in move.finished:
            metrics.REMEDIATIONS.labels(kind, result).inc()
        if move.back_in_service is not None and lad is not None:
            metrics.REMEDIATION_MTTR.labels(str(lad.step)).observe(move.back_in_service)
        if move.start is not None or move.start_validation:
            # Blocked once, announced once: a GPU waiting for its holder to leave is passed over on
            # every sweep, and only a new reason (or a reset that finally starts) is news.
            self._blocked.pop((name, dev.index), None)
        return left

    async def _restart_plugin(
        self, p: NodePass, dev: DeviceRecord, rec: LadderRecord, old: Mapping[str, Any] | None
    ) -> LadderRecord | None:
        """2. delete the recorded pod of the device plugin (its uid the precondition), 3. record it done;
        returns the record as it leaves it."""
        assert rec.plugin is not None
        namespace, _, pod = rec.plugin.pod.partition("/")
        try:
            await self.kube.delete_pod(namespace, pod, rec.plugin.uid)
        except ApiException as e:
            if e.status == 403:
                why = (
                    f"the operator may not delete pods in namespace {namespace} (403 Forbidden: docs/install.md, "
                    "the device plugin's restart)"
                )
                plugin = p.policy.remediation.device_plugin
                move = restart_blocked(rec, why, restart_hint(plugin, p.name), offered_words(p.node))
                if move.record is not None:
                    await self._write(p.name, dev.index, entry_patch(move.record, old))
                for type_, reason, message in move.events:
                    self._event(p.name, type_, reason, message)
                return move.record if move.record is not None else rec
            if e.status not in (404, 409):  # 404 gone, 409 another pod of that name: restarted already
                raise
        done = replace(rec, plugin=replace(rec.plugin, deleted=True))
        await self._write(p.name, dev.index, entry_patch(done, old))  # 3.
        return done

    def _block(self, name: str, index: int, why: str, what: str = "reset") -> None:
        if self._blocked.get((name, index)) != why:
            self._blocked[(name, index)] = why
            self._event(name, "Normal", "RemediationBlocked", f"GPU {index}: no {what} yet: {why}")

    @staticmethod
    def _peers_unknown(dev: DeviceRecord, facts: Device | None) -> tuple[str, str, str]:
        action = facts.recovery_action if facts is not None else None
        return (
            "Warning",
            "PeersUnknown",
            f"GPU {dev.index}: its recovery action {action} needs its NVLink peers idle before a reset, and the "
            "report does not name them (spec.devices[].nvlink.peers): no GPU reset, the ladder starts at NodeReboot",
        )

    async def _may_start(
        self,
        p: NodePass,
        node: Record,
        dev: DeviceRecord,
        peers: Sequence[int],
        records: Sequence[DeviceRecord],
        ladders: Mapping[int, LadderRecord],
    ) -> tuple[bool, bool]:
        """A GPUReset's preconditions (see the module docstring); the reason in an Event if not. Also
        whether what blocks it is only a claim reserved for a pod not on the node (``_held_and_free``).
        ``ladders``: the node's ladders as this pass left them so far (``run``)."""
        name, policy = p.name, p.policy
        why = ""
        by_index = {r.index: r for r in records}
        waiting = [
            p
            for p in peers
            if (r := by_index.get(p)) is None
            or r.state != DeviceState.QUARANTINED
            or not r.drained
            or not (r.taint_rule or r.via_plugin)
            or not r.out_of_service
        ]
        if node.state in OUT_OF_SERVICE:
            why = f"the node itself is {node.state}"
        elif any(r.in_flight for i, r in ladders.items() if i != dev.index):
            why = "another GPU of this node is being reset (one at a time per node)"
        elif waiting:
            why = f"its NVLink peers {', '.join(map(str, waiting))} are not held out and drained yet"
        if why:
            self._block(name, dev.index, why)
            return False, False
        handover = False
        why = await self.slots.admit(Slot.RESET, policy, name, dev.index)
        if not why:
            why, handover = await self._held_and_free(p, dev, [by_index[i] for i in peers], records)
        if why:
            self.slots.end(Slot.RESET, name, dev.index)
            self._block(name, dev.index, why)
            return False, handover
        return True, False

    async def _may_validate(self, p: NodePass, dev: DeviceRecord, records: Sequence[DeviceRecord]) -> tuple[bool, bool]:
        """A validation's preconditions: under the policy's limit, the GPU held out and free (and, as
        for a reset, whether only a stale reservation blocks it)."""
        name, policy = p.name, p.policy
        handover = False
        why = await self.slots.admit(Slot.VALIDATION, policy, name, dev.index)
        if not why:
            why, handover = await self._held_and_free(p, dev, (), records)
        if why:
            self.slots.end(Slot.VALIDATION, name, dev.index)
            self._block(name, dev.index, why, "validation")
            return False, handover
        return True, False

    async def _held_and_free(
        self, p: NodePass, dev: DeviceRecord, peers: Sequence[DeviceRecord] = (), records: Sequence[DeviceRecord] = ()
    ) -> tuple[str, bool]:
        """Re-read from the API: the GPU's rule holds it out, and no pod holds its device; the same of
        each of its NVLink ``peers`` (P2P-aware repair), from one read of rules, claims and pods. Returns
        why not (``""``: it may go ahead), and whether only claims reserved for pods not on the node hold
        them: a pod that left with its claim not yet released, or one the scheduler has yet to bind."""
        if dev.via_plugin:
            return await self._plugin_held_and_free(p, dev, peers, records), False
        rules = {r["metadata"]["name"]: r for r in await self.kube.list_device_taint_rules()}
        refs: list[tuple[str, DeviceRef]] = []
        for d, whose in ((dev, ""), *((p, f"its NVLink peer GPU {p.index}: ") for p in peers)):
            # Every device of the GPU: a MIG-enabled GPU is published only as its MIG devices, and a
            # reset or a diagnostic takes all of its instances, so each must be held out and free.
            for name in d.taint_rules or ("",):
                rule = rules.get(name)
                if rule is None or ((rule.get("spec") or {}).get("taint") or {}).get("effect") != "NoSchedule":
                    return f"{whose}its DeviceTaintRule {name} (NoSchedule) is not in place", False
            held = d.refs()
            if not held:
                return f"{whose}its DRA device is unknown", False
            refs.extend((whose, ref) for ref in held)
        node = refs[0][1].pool
        claims, pods = await asyncio.gather(self.kube.list_resource_claims(), self.kube.list_pods_on_node(node))
        ended = {
            f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}"
            for p in pods
            if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        }
        on_node = {f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}" for p in pods}
        for whose, ref in refs:
            holding = sorted(pods_holding([ref], claims, pods) - ended)
            if holding:
                return f"{whose}pod {', '.join(holding)} holds its device {ref}", not on_node.intersection(holding)
        return "", False

    async def _plugin_held_and_free(
        self, p: NodePass, dev: DeviceRecord, peers: Sequence[DeviceRecord], records: Sequence[DeviceRecord]
    ) -> str:
        """The device-plugin route's preconditions, re-read from the API: the Node keeps new work off the
        GPUs held out this way (gpuhealth's ``gpu-out`` taint, or the device plugin withholds them all),
        and none of the pods the agent's report names as holding the GPU (or a peer) is still on the node."""
        if p.report is None or p.report.pod_resources is None or not p.report.pod_resources.available:
            return "the agent's report does not say which pods hold it (spec.podResources)"
        node = await self.kube.get_node(p.name)
        out = sum(1 for r in records if r.via_plugin and r.out_of_service) or 1
        if not gpu_out_tainted(node) and not plugin_withholds(node, out):
            return (
                f"new work is not kept off it yet: the device plugin does not withhold it ({offered_words(node)}) "
                "and the node has no gpuhealth.dev/gpu-out taint"
            )
        pods = await self.kube.list_pods_on_node(p.name)
        live = {
            f"{q['metadata'].get('namespace', '')}/{q['metadata']['name']}"
            for q in pods
            if (q.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        }
        for d, whose in ((dev, ""), *((q, f"its NVLink peer GPU {q.index}: ") for q in peers)):
            holding = sorted({f"{h.namespace}/{h.name}" for h in p.report.holders(d.index)} & live)
            if holding:
                return f"{whose}pod {', '.join(holding)} holds it (the kubelet's pod-resources, as the agent reports)"
        return ""

    async def _write(
        self, name: str, index: int, entry: Mapping[str, Any] | None, repairs: Mapping[str, Any] | None = None
    ) -> None:
        status: dict[str, Any] = {"remediation": {str(index): entry}}
        if repairs:
            status["repairs"] = repairs
        await status_writes.record(self.kube, self.store, name, status)
