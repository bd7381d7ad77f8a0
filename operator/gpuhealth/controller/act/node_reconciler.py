"""The per-node pipeline: evaluate (pure; what each finding takes out, one GPU, the node, its NVLink
domain or its rack, in the one order ``scoping.py`` runs), decide (pure), then write in an order that
survives a kill at any line:

1. the GPUNodeHealth status (the decision, the write-ahead record), with a resourceVersion
   precondition so a decision is never based on a stale record. It is the pass's one status write:
   the keys other rooms decide before it ride on it (their ``fold``: a validation's move that
   creates no Job, the drain records the decision ends); what a room must record after the Node
   write goes through ``status_writes.py``, the only other writer of the status;
2. the Node (taint, cordon, state label and the ownership annotation, in one patch, also with a
   resourceVersion precondition);
3. the Node's GPUHealthy condition, then Events; then the drain, if the state says so. A pass that
   took the node or a GPU out leaves the condition and the drain to the node's next pass, queued at
   once: protection first, so that in a storm every taint is written before anything else.

Per-GPU quarantine (``device_reconciler.py``) rides on the same order: the GPUs' verdicts are part of
the status written in step 1 (``status.devices[]``, each with its device and rule name), and only
then are gpuhealth's DeviceTaintRules of the node converged to them; a pass that created a rule
leaves the Node (its state label and condition) to the next pass, protection first as for drains;
the drain of the pods that hold a bad GPU (``device_drainer.py``) follows the node's drain.

A restarted operator re-reads everything, finds the record, and converges the Node to it; an action
Event is posted only by the write that changed the Node, so actions are never announced twice.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any

from gpuhealth.actions.nodes import (
    TAINT_ONLY_NOTE,
    Marks,
    NodePlan,
    condition_message,
    node_writes,
    plan_condition,
    plan_node,
)
from gpuhealth.api.devices import KEPT_OFF_BY_TAINT
from gpuhealth.api.names import (
    API_VERSION,
    GPU_OUT_TAINT_KEY,
    OUT_OF_SERVICE,
    RELEASE_ANNOTATION,
    RELEASE_GPU_ANNOTATION,
    REPORT_KIND,
    Mode,
    Signal,
    State,
)
from gpuhealth.api.policy import Policy
from gpuhealth.api.remediation_status import Approvals
from gpuhealth.api.report import Report, ReportError, parse_report
from gpuhealth.api.status import (
    ClockSkewRecord,
    Record,
    drain_done,
    evidence_entry,
    node_status,
    status_changes,
)
from gpuhealth.api.timeutil import format_time
from gpuhealth.controller import metrics
from gpuhealth.controller.act.again import Again, soonest
from gpuhealth.controller.act.device_drainer import DeviceDrainer
from gpuhealth.controller.act.device_reconciler import DevicePlan, DeviceReconciler, released_gpus
from gpuhealth.controller.act.drainer import Drainer
from gpuhealth.controller.act.node_validator import NodeValidator
from gpuhealth.controller.act.passes import NodePass
from gpuhealth.controller.act.remediator import Remediator
from gpuhealth.controller.act.scoping import Scoping
from gpuhealth.controller.state.breaker import Breaker
from gpuhealth.controller.state.store import Store, gpu_capacity
from gpuhealth.controller.state.topology import Topology
from gpuhealth.evaluation.assess import Assessment, Finding, NodeView
from gpuhealth.evaluation.freshness import Skew, heard_at, skew_episode
from gpuhealth.evaluation.rules import fatal
from gpuhealth.evaluation.startup import acts_before_pods, never_evaluated
from gpuhealth.evaluation.transitions import Decision, Inputs, decide, wants_quarantine
from gpuhealth.kube.aio import AsyncKube
from gpuhealth.kube.client import is_conflict, is_not_found, status_of
from gpuhealth.kube.events import EventSink

log = logging.getLogger(__name__)
CONFLICT_ATTEMPTS = 5
SLICES_POLL_S = 0.5  # a device-scoped finding waiting for the first ResourceSlice list


def evidence(a: Assessment) -> list[dict[str, Any]]:
    return [
        evidence_entry(str(f.signal), f.reason, str(f.action), f.detail, f.gpu, f.uuid, f.code, f.since)
        for f in a.actionable()
    ]


class NodeReconciler:
    def __init__(
        self,
        *,
        kube: AsyncKube,
        store: Store,
        breaker: Breaker,
        drainer: Drainer,
        events: EventSink,
        clock: Callable[[], dt.datetime],
        devices: DeviceReconciler,
        device_drainer: DeviceDrainer,
        remediator: Remediator,
        topology: Topology | None = None,
        validator: NodeValidator | None = None,
    ) -> None:
        self.remediator = remediator
        self.topology = topology or Topology(store)
        # What each finding takes out, in one order (scoping.py): GPU, node, NVLink domain or rack.
        self.scoping = Scoping(
            store=store, breaker=breaker, devices=devices, device_drainer=device_drainer, topology=self.topology
        )
        self.validator = validator or NodeValidator(
            kube=kube, store=store, events=events, slots=remediator.slots, jobs=remediator.jobs
        )
        self.devices = devices
        self.device_drainer = device_drainer
        self.kube = kube
        self.store = store
        self.breaker = breaker
        self.drainer = drainer
        self.events = events
        self.clock = clock
        self.bad_report_versions: dict[str, str] = {}

    def _event(self, node: str, type_: str, reason: str, message: str) -> None:
        self.events("Node", node, node, type_, reason, message)

    async def reconcile(self, name: str) -> Again:
        """Reconcile one node; a 409 means someone wrote first: re-read it and decide again. Returns
        when the node wants its next pass (``again.py``); the runtime's worker schedules it."""
        for attempt in range(CONFLICT_ATTEMPTS):
            try:
                return await self._reconcile_once(name)
            except Exception as e:
                if is_conflict(e) and attempt < CONFLICT_ATTEMPTS - 1:
                    metrics.CONFLICTS.labels("reconcile").inc()
                    await self._refresh(name)
                    continue
                raise
        return None  # not reached: the last attempt returns or raises

    async def _refresh(self, name: str) -> None:
        try:
            self.store.reflect_node(name, await self.kube.get_node(name))
        except Exception as e:
            if not is_not_found(e):
                raise
            self.store.forget_node(name)
        try:
            report = await self.kube.get_report(name)
        except Exception as e:
            if not is_not_found(e):
                raise
            return
        self.store.reread_report(name, report)

    def _parse(self, name: str, obj: Mapping[str, Any] | None) -> Report | None:
        if obj is None:
            return None
        try:
            return parse_report(obj)
        except ReportError as e:
            rv = str(obj["metadata"].get("resourceVersion"))
            if self.bad_report_versions.get(name) != rv:
                self.bad_report_versions[name] = rv
                metrics.INVALID_INPUT.labels("GPUNodeHealth").inc()
                log.warning("report %s ignored: %s", name, e)
                self._event(
                    name,
                    "Warning",
                    "InvalidReport",
                    f"The agent's report is unusable and was ignored (no action taken on it): {e}",
                )
            return None

    async def _reconcile_once(self, name: str) -> Again:
        store = self.store
        node = store.nodes.get(name)
        if node is None:
            return None
        policy, overridden = store.governing(name)
        if policy is None or policy.mode == Mode.PAUSED:
            return None
        now = self.clock()
        report_obj = store.reports.get(name)
        if report_obj is None and (now - (store.first_seen(name) or now)).total_seconds() < policy.silence_after_s:
            return None  # a new node's agent gets the silence period to send its first report
        report = self._parse(name, report_obj)
        if report is not None:  # fresh by when the operator saw the agent write, not by the node's clock
            report = dataclasses.replace(report, heartbeat=heard_at(store.heard(name), report.heartbeat))
        # The persisted state, parsed once for the whole pass (api/status.py, controller/act/passes.py).
        stored = store.status(name)
        prior = store.records.get(name) or stored.record
        annotations = node["metadata"].get("annotations") or {}
        # A release is a Node write to acknowledge (the annotation is removed), so only Enforce acts on it.
        released = RELEASE_ANNOTATION in annotations and policy.mode == Mode.ENFORCE
        view = NodeView(name, node["metadata"].get("labels") or {}, gpu_capacity(node))
        # A release acknowledges all evidence up to now, in this very evaluation.
        cleared = now if released else prior.cleared_before
        # Scope, steps 1-3 (scoping.py): built-in, policy, and the NVLink domain's and rack's findings.
        scoped = await self.scoping.assess(name, policy, report, view, now, stored.pending, cleared)
        a, domain = scoped.assessment, scoped.domain
        if self.devices.slices_pending(a):
            return SLICES_POLL_S  # the slice watch requeues it too, once its list is in
        enforce = policy.mode == Mode.ENFORCE
        p = NodePass(
            name=name,
            policy=policy,
            now=now,
            node=node,
            report=report,
            found=stored,
            prior=prior,
            assessment=a,
            released=released,
            gpus=released_gpus(annotations) if enforce else frozenset(),
            cleared=cleared,
            approvals=Approvals.from_annotations(annotations) if enforce else Approvals(),
        )
        gpus, calls = p.gpus, p.approvals
        consumed = False
        # Scope, steps 4-6: NVLink peers, placement, escalation. The GPU budgets it takes stay reserved
        # until the status is written (``breaker.release`` below).
        dev = await self.scoping.devices_of(p)
        node_a = dev.node_view  # device-scoped faults held out one GPU at a time are not the node's
        # Ask the breaker before deciding, so the state machine decides once, with its answer.
        allows = not wants_quarantine(prior, node_a, policy) or await self.scoping.admit(policy, name, node_a, domain)
        # A node's validation (after a repair's release, or a burn-in) holds its return or fails it.
        nmove = await self.validator.observe(p)
        # A member on probation for its NVLink domain returns only with the others out for it.
        joins = self.topology.domain_return(name, policy, domain, prior, now)
        inputs = Inputs(
            breaker_allows=allows,
            drain_complete=drain_done(stored.drain, prior),
            released=released,
            validating=nmove is not None and nmove.hold,
            validation_failed=nmove.failed if nmove is not None else "",
            domain_waits=joins.waits_for,
        )
        decision = decide(prior, node_a, policy, now, inputs)
        again: Again = None
        domain_again: Again = None
        if joins.retry_at is not None and decision.record.state == State.RECOVERING:
            # The last of the members it waits for ends its probation then: pass again right after.
            domain_again = max(0.05, (joins.retry_at - now).total_seconds() + 0.05)
        validation_again: Again = None
        try:
            if store.pods.pending and not acts_before_pods(
                prior,
                stored.devices.values(),
                decision.new_quarantine,
                dev.verdict.new_quarantines,
                released or bool(gpus),
                first=name not in store.records and never_evaluated(stored, node, len(self.devices.rules_of(name))),
            ):
                return None  # the start-up pod list passes every node again once it is in (runtime.py)
            skew, new_skew = skew_episode(store.report_seen(name), stored.clock_skew, now)
            # A validation's move that creates no Job lands in this same write (node_validator.py), and
            # so does dropping the drain record of a GPU this decision moves out of Draining, or the
            # node's of an episode this decision ends (drainer.py): one status write per pass, besides
            # the rooms' records that must precede or follow their effects (status_writes.py).
            folded = {
                **self.validator.fold(p, nmove),
                **self.device_drainer.fold(p, dev.records),
                **self.drainer.fold(p, decision.record),
            }
            held = self.validator.holds(p, nmove)
            await self._persist(p, overridden, report_obj, decision, dev, skew, folded, held)
            # The decision is announced right after it is recorded and before anything acts on it.
            self._announce(name, policy, decision, a)
            if new_skew is not None:
                self._announce_skew(name, new_skew)
            if nmove is not None:
                validation_again = await self.validator.act(p, nmove)
            escalated = dev.verdict.escalate and decision.new_quarantine
            fallback = decision.new_quarantine and any(
                f.action.quarantines for f in node_a.findings if f.gpu in dev.fallbacks
            )
            self.devices.announce(p, dev, escalated, fallback)
            created = await self.devices.converge_rules(name, policy, dev.records)
            # Protection first, for GPUs as for nodes: in a storm of device faults every DeviceTaintRule
            # is written before a worker spends two more requests on a Node's state label and condition
            # (they repeat what the record says); the next pass converges the Node.
            node_later = created and not decision.new_quarantine and not (released or gpus)
            if policy.mode == Mode.ENFORCE and node_later:
                again = 0.05
            elif policy.mode == Mode.ENFORCE:
                # A new quarantine's condition waits for the next pass too: the taint is the protection.
                await self._converge_node(p, decision.record, node_a, not decision.new_quarantine, dev)
                # A GPU newly held out on the device-plugin route: its taint (if it needs one) is on now.
                plugin_new = any(r.via_plugin for r in dev.out if r.index in dev.verdict.new_quarantines)
                if decision.new_quarantine or created or plugin_new:
                    # Protection first: the drain, which takes several requests, starts on this node's
                    # next pass, queued behind the other nodes' first passes, so that in a storm every
                    # taint and DeviceTaintRule is written before any worker spends its time draining.
                    again = 0.05
                elif not store.pods.pending:  # drains and repairs need the pods
                    again = soonest(
                        await self.drainer.run(p, decision.record, fatal(node_a)),
                        await self.device_drainer.run(p, decision.record, dev.records),
                        await self.remediator.run(p, decision.record, dev.records),
                    )
                    # A human's approve/reject is acknowledged once the remediator has seen it: the
                    # waiting records wrote themselves past PendingApproval first (remediator.py).
                    consumed = calls.any
                ack = {k: None for k in (RELEASE_ANNOTATION, RELEASE_GPU_ANNOTATION) if k in annotations}
                if consumed:
                    ack.update({k: None for k in calls.keys})  # approve/reject and each approver's
                if released or gpus or consumed:
                    # Reflected at once, so a pass before the watch brings it does not see the release again.
                    self.store.reflect_node(name, await self.kube.patch_node(name, {"metadata": {"annotations": ack}}))
            elif policy.mode == Mode.DRY_RUN:
                again = await self.remediator.run(p, decision.record, dev.records)
        finally:
            self.breaker.release(policy, name)
            self.validator.end(name)
        return soonest(again, validation_again, domain_again)

    async def _persist(
        self,
        p: NodePass,
        overridden: list[Policy],
        report_obj: Mapping[str, Any] | None,
        decision: Decision,
        dev: DevicePlan,
        clock_skew: ClockSkewRecord | None = None,
        folded: Mapping[str, Any] | None = None,
        held: bool = False,
    ) -> None:
        """Write the node's status; ``folded`` (other rooms' keys, already a merge patch's values)
        goes in the same patch. ``held``: gpuhealth's burn-in taint holds the node (none of its GPUs
        in service)."""
        name, policy, a = p.name, p.policy, p.assessment
        body = node_status(
            decision.record,
            policy=policy.name,
            overridden=[p.name for p in overridden],
            dry_run=policy.mode == Mode.DRY_RUN,
            total_gpus=a.total_gpus,
            healthy_gpus=a.healthy_gpus,
            last_xid=a.last_xid,
            evidence=evidence(a),
            pending=a.pending,
            unknown_message=a.unknown_reason,
            devices=dev.status(),
            # DryRun holds nothing out (no Node change, rules with effect None): every GPU serves.
            # A burn-in's hold (its NoSchedule taint) keeps every GPU from new work: none serves.
            in_service_gpus=a.total_gpus
            if policy.mode == Mode.DRY_RUN
            else 0
            if held
            else dev.in_service(decision.record.out_of_service, a.total_gpus),
            clock_skew=clock_skew,
        )
        changed = {**status_changes(p.found.written, body), **(folded or {})}
        if report_obj is None:
            report_obj = await self._create_stub(name)
            changed = {**body, **(folded or {})}
        if not changed:
            self.store.set_record(name, decision.record)
            return
        patch = {"metadata": {"resourceVersion": report_obj["metadata"]["resourceVersion"]}, "status": changed}
        result = await self.kube.patch_report_status(name, patch)
        self.store.wrote(name, result)
        self.store.set_record(name, decision.record)

    async def _create_stub(self, name: str) -> dict[str, Any]:
        """No agent report after the silence period: create a stub so the Unknown verdict has a home."""
        body = {"apiVersion": API_VERSION, "kind": REPORT_KIND, "metadata": {"name": name}, "spec": {"nodeName": name}}
        try:
            obj: dict[str, Any] = await self.kube.create_report(body)
        except Exception as e:
            if status_of(e) != 409:
                raise
            obj = await self.kube.get_report(name)
        self.store.created(name, obj)
        return obj

    async def _converge_node(
        self, p: NodePass, rec: Record, a: Assessment, condition: bool = True, dev: DevicePlan | None = None
    ) -> None:
        """The Node to ``rec`` (``a``: what the node's state machine decided on), and its condition;
        with ``dev``, gpuhealth's gpu-out taint to the GPUs held out on the device-plugin route."""
        name, policy, now = p.name, p.policy, p.now
        node = self.store.nodes[name]
        top = a.top
        reason = rec.reason or (top.reason if top else "")
        tainting = sorted(r.index for r in dev.out if r.kept_off_by == KEPT_OFF_BY_TAINT) if dev is not None else []
        marks = Marks(
            state=rec.state,
            quarantine=rec.state in OUT_OF_SERVICE,
            reason=reason,
            effect=policy.taint_effect,
            cordon=policy.cordon,
            since=format_time(rec.since or now),
            gpu_out=bool(tainting),
            gpu_out_value=("gpu-" if len(tainting) == 1 else "gpus-") + ".".join(str(i) for i in tainting),
        )
        plan = plan_node(node, marks)
        message = condition_message(rec.message, marks)
        cond = plan_condition(node, rec.state, rec.reason, message, format_time(now)) if condition else None
        node_patch, status_patch = node_writes(plan.patch, cond)
        # Each write's answer is cached, so the next pass does not repeat it before the watch brings it
        # (the answer is a new copy through the store, never the cached one edited in place).
        if node_patch is not None:
            self.store.reflect_node(name, await self.kube.patch_node(name, node_patch))
            self._acted(name, plan, marks, rec, top, policy)
        if status_patch is not None:
            self.store.reflect_node(name, await self.kube.patch_node_status(name, status_patch))
            if node_patch is None and plan.patch is not None:  # the plan rode on the status write
                self._acted(name, plan, marks, rec, top, policy)

    def _acted(self, name: str, plan: NodePlan, marks: Marks, rec: Record, top: Finding | None, policy: Policy) -> None:
        """What a Node write that carried ``plan`` counts and announces, once: right after that write, so
        a failed condition write after it is retried without announcing the plan again."""
        for act in plan.actions:
            metrics.ACTIONS.labels(act, marks.reason, str(policy.mode)).inc()
        if "taint" in plan.actions and top is not None and top.since is not None:
            metrics.DETECTION_TO_ACTION.observe(max(0.0, (self.clock() - top.since).total_seconds()))
        self._announce_node_actions(name, plan.actions, plan.lifted_by_others, plan.foreign_cordon, marks, rec)

    def _announce_node_actions(
        self,
        name: str,
        actions: tuple[str, ...],
        lifted: tuple[str, ...],
        foreign_cordon: bool,
        marks: Marks,
        rec: Record,
    ) -> None:
        msgs = []
        if "taint" in actions:
            msgs.append(f"Tainted {marks.reason} ({marks.effect})")
            if not marks.cordon:
                msgs.append(f"Not cordoned: {TAINT_ONLY_NOTE}")
        if "cordon" in actions:
            msgs.append("Cordoned")
        if foreign_cordon:
            msgs.append("Already cordoned by someone else: gpuhealth will leave that cordon in place")
        if "untaint" in actions:
            msgs.append("Removed gpuhealth's taint")
        if "uncordon" in actions:
            msgs.append(
                "Uncordoned (gpuhealth's own cordon)"
                + (f": the node stays {TAINT_ONLY_NOTE}" if marks.quarantine else "")
            )
        if "gpu-out-taint" in actions or "gpu-out-retaint" in actions:
            msgs.append(
                f"Tainted {GPU_OUT_TAINT_KEY}={marks.gpu_out_value} (NoSchedule): "
                + marks.gpu_out_value.replace("gpus-", "GPUs ").replace("gpu-", "GPU ").replace(".", ", ")
                + " held out on the device-plugin route, which the device plugin does not withhold; no new pod "
                "lands on the node, the pods on its other GPUs keep running (not cordoned)"
            )
        if "gpu-out-untaint" in actions:
            msgs.append(f"Removed gpuhealth's taint {GPU_OUT_TAINT_KEY}: no GPU of the node is held out any more")
        if msgs:
            self._event(name, "Normal", "GPUHealthAction", "; ".join(msgs) + f". State: {rec.state}")
        for what in lifted:
            self._event(
                name,
                "Warning",
                "LiftedByOthers",
                f"Someone else removed gpuhealth's {what} while the node is {rec.state} ({rec.reason}); "
                "recorded, and not put back for this episode",
            )

    def _announce_skew(self, name: str, skew: Skew) -> None:
        """A clock-skew episode that the status write just recorded (once per episode, at start-up too;
        ``freshness.skew_episode``). It changes no verdict: on-call learns why the node's times are off."""
        metrics.INVALID_INPUT.labels("ClockSkew").inc()
        log.warning("report %s: %s", name, skew.describe())
        self._event(name, "Warning", "ClockSkew", skew.describe())

    def _announce(self, name: str, policy: Policy, d: Decision, a: Assessment) -> None:
        dry = policy.mode == Mode.DRY_RUN
        if d.new_quarantine:
            for f in a.actionable():
                metrics.FAULTS.labels(str(f.signal), "" if f.code is None else str(f.code)).inc()
        for type_, reason, message in d.events:
            if reason == Signal.NVML_UNRESPONSIVE:  # observed (Unknown): counted as a fault all the same
                metrics.FAULTS.labels(reason, "").inc()
            if dry:
                message = f"DryRun (policy {policy.name}): would act, no Node was changed. {message}"
                metrics.ACTIONS.labels(reason, d.record.reason or reason, "DryRun").inc()
            self._event(name, type_, reason, message)
