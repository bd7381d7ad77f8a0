"""Proof before return for a whole node: after a repair's release, and a new node's burn-in.

The node reconciler calls :meth:`NodeValidator.observe` before the state machine decides (its
``hold`` keeps a Recovering node from returning, its ``failed`` sends it to AwaitingRepair) and
:meth:`NodeValidator.act` once the node's status is written. The decision is pure
(``evaluation/node_validation.py``); here are the API reads it needs and the writes, in the order
the GPU's validation uses (``remediator.py``), which survives a kill at any line:

1. ``status.nodeValidation`` first (the write-ahead record: the Job's name, ``created: false``).
   A move that creates no Job (a verdict, a timeout, a release) is written in the node's own status
   patch instead (:meth:`NodeValidator.fold`): the state it decides and the record that decides it
   land together, so no reader sees a node Healthy beside a validation still Running, and no kill
   between two writes leaves the record behind the state (which the next pass would read as a fault
   during the run);
2. gpuhealth's burn-in taint, placed or lifted (only one it placed: ``held`` in the record); then
   the Job deleted (timed out or superseded) or created under the recorded name (409: it exists);
3. the record again (``created: true``), Events and metrics.

The records of 1 and 3 go through ``status_writes.py``, the one status write besides the decision patch.

A node's validation starts only when: the policy enables ``spec.validation`` (and
``spec.remediation``, whose namespace and service account the Job runs under); the mode is
Enforce (DryRun records and announces what it would run; Paused never gets here); for a release,
the node is Recovering (tainted, cordoned, drained) and fewer than ``spec.validation.maxConcurrent``
validations run across the policy's nodes (GPUs' and nodes' together); for a burn-in, fewer than
``newNodes.batchSize`` burn-ins run; and, re-read from the API right before, no pod that uses a GPU
runs on the node (the Job requests no GPU, so the scheduler would not keep a workload off it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from gpuhealth.actions import validation_jobs
from gpuhealth.api.names import (
    BURN_IN_ACCEPTED,
    BURN_IN_LABEL,
    BURN_IN_REQUESTED,
    BURN_IN_TAINT_KEY,
    GPU_RESOURCE,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    Mode,
    State,
)
from gpuhealth.api.policy import Policy
from gpuhealth.api.report import MIG_ENABLED, Report
from gpuhealth.api.timeutil import format_time
from gpuhealth.api.validation import NodeValidation, Outcome, Trigger, ValidationSettings
from gpuhealth.controller import metrics
from gpuhealth.controller.act import status_writes
from gpuhealth.controller.act.again import Again
from gpuhealth.controller.act.passes import NodePass
from gpuhealth.controller.act.step_jobs import StepJobs
from gpuhealth.controller.state.job_slots import JobSlots, Slot
from gpuhealth.controller.state.store import Store
from gpuhealth.evaluation.node_validation import NodeMove, NodeObserved, node_move
from gpuhealth.kube.aio import AsyncKube
from gpuhealth.kube.events import EventSink

POLL_S = 2.0  # a node validation waiting or running is looked at again this often


def _uses_gpu(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        return True
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = c.get("resources") or {}
        if any(GPU_RESOURCE in (res.get(k) or {}) for k in ("limits", "requests")):
            return True
    return False


def active(policy: Policy) -> bool:
    """Whether node validations act under this policy at all."""
    return policy.validation.enabled and policy.remediation.enabled and policy.mode != Mode.PAUSED


class NodeValidator:
    def __init__(self, *, kube: AsyncKube, store: Store, events: EventSink, slots: JobSlots, jobs: StepJobs) -> None:
        self.kube = kube
        self.store = store
        self.events = events
        self.slots = slots  # the remediator's: a node's validation and a GPU's take places from one count
        self.jobs = jobs
        self._blocked: dict[str, str] = {}

    def _event(self, node: str, type_: str, reason: str, message: str) -> None:
        self.events("Node", node, node, type_, reason, message)

    def _block(self, node: str, why: str) -> None:
        if self._blocked.get(node) != why:
            self._blocked[node] = why
            self._event(node, "Normal", "RemediationBlocked", f"The node's validation waits: {why}")

    async def observe(self, p: NodePass) -> NodeMove | None:
        """The node validation's next move (None: not under this policy), its API reads done."""
        name, policy, prior, report, now = p.name, p.policy, p.prior, p.report, p.now
        nv = p.found.node_validation
        if not active(policy):  # off (or no remediation namespace): gpuhealth's hold goes with it
            return (
                None if nv is None or not nv.held else node_move(prior, nv, NodeObserved(), now, ValidationSettings())
            )
        labels = (p.node.get("metadata") or {}).get("labels") or {}
        requested = labels.get(BURN_IN_LABEL) == BURN_IN_REQUESTED
        new_node = policy.validation.new_nodes.enabled and (
            requested or (not p.found.decided and name not in self.store.records)
        )
        dry = policy.mode == Mode.DRY_RUN
        verdict: tuple[Outcome, str] | None = None
        may = False
        v = nv.validation if nv is not None else None
        if nv is not None and v is not None and not nv.dry_run and not dry:
            if v.outcome == Outcome.RUNNING and v.created and v.job:
                verdict = await self.jobs.validation_verdict(name, v.job)
            elif v.outcome == Outcome.PENDING and (nv.trigger == Trigger.BURN_IN or prior.state == State.RECOVERING):
                may = await self._may_validate(name, policy, nv, report)
        obs = NodeObserved(released=p.released, new_node=new_node, may_validate=may, verdict=verdict, dry_run=dry)
        return node_move(prior, nv, obs, now, policy.validation)

    async def _may_validate(self, name: str, policy: Policy, nv: NodeValidation, report: Report | None) -> bool:
        if report is None or not report.devices:
            self._block(name, "the agent's report lists no GPU yet")
            return False
        why = await self.slots.admit(Slot.BURN_IN if nv.trigger == Trigger.BURN_IN else Slot.VALIDATION, policy, name)
        if not why:
            pods = await self.kube.list_pods_on_node(name)
            holding = sorted(
                f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}"
                for p in pods
                if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                and ((p.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) != MANAGED_BY_VALUE
                and _uses_gpu(p)
            )
            if holding:
                why = f"pod {', '.join(holding[:5])} uses the node's GPUs"
        if why:
            self.end(name)
            self._block(name, why)
            return False
        return True

    def end(self, name: str) -> None:
        """End the admission :meth:`observe` reserved (once the record is written, or the pass failed)."""
        self.slots.end(Slot.BURN_IN, name)
        self.slots.end(Slot.VALIDATION, name)

    async def act(self, p: NodePass, move: NodeMove) -> Again:
        """Carry out ``move`` in the write-ahead order of the module docstring."""
        try:
            return await self._act(p, move)
        finally:
            self.end(p.name)

    def _record(self, p: NodePass, move: NodeMove) -> NodeValidation | None:
        """The record ``move`` leaves, less a hold on a taint of that key someone else placed."""
        rec, old = move.record, p.found.node_validation
        if move.taint and rec is not None and self._tainted(p.name) and (old is None or not old.held):
            rec = replace(rec, held=False)  # a taint of that key someone else placed is not gpuhealth's
        return rec

    def _tainted(self, name: str) -> bool:
        taints = ((self.store.nodes.get(name) or {}).get("spec") or {}).get("taints") or []
        return any(t.get("key") == BURN_IN_TAINT_KEY for t in taints)

    def holds(self, p: NodePass, move: NodeMove | None) -> bool:
        """Whether gpuhealth's burn-in taint holds the node once ``move`` is carried out: then none of
        its GPUs is in service (``status.inServiceGPUs`` 0), whatever its state."""
        rec = p.found.node_validation if move is None else self._record(p, move)
        return rec is not None and rec.holds

    def fold(self, p: NodePass, move: NodeMove | None) -> dict[str, Any]:
        """``status.nodeValidation`` to write in the node's own status patch: a move that creates no
        Job, when its record changes (see the module docstring); empty otherwise."""
        if move is None or move.start:
            return {}
        rec = self._record(p, move)
        return {} if rec == p.found.node_validation else {"nodeValidation": _entry(rec)}

    async def _act(self, p: NodePass, move: NodeMove) -> Again:
        name, policy, report = p.name, p.policy, p.report
        rec = self._record(p, move)
        node = self.store.nodes.get(name) or {}
        ours = self._tainted(name)
        old = p.found.node_validation  # as the pass found it: a folded move is in the store already
        body: dict[str, Any] | None = None
        if move.start and rec is not None:
            v = rec.validation
            jname = v.job.partition("/")[2] or validation_jobs.node_job_name(
                name, str(rec.trigger), format_time(rec.episode)
            )
            devices = report.devices if report is not None else ()
            gpus = [(d.index, d.uuid) for d in devices]
            mig = {d.index for d in devices if d.mig_mode == MIG_ENABLED}
            body, why = validation_jobs.build_node_validation_job(
                policy.remediation, policy.validation, name, gpus, jname, mig
            )
            if body is None:
                self._block(name, why)
                return POLL_S  # the record stays where it was: the next pass tries again
            if not v.job:
                rec = replace(rec, validation=replace(v, job=f"{policy.remediation.namespace}/{jname}"))
        if rec != old and move.start:  # (a move without a Job came with the node's status: fold)
            await self._write(name, rec)  # 1. the write-ahead record
        held = rec is not None and rec.held
        if held and not ours:
            await self._taint(name, node, True)  # 2. gpuhealth's hold (again, if a restart came in between)
        elif move.taint is False and old is not None and old.held and ours:
            await self._taint(name, node, False)
        if move.stop_job:
            await self.jobs.delete(move.stop_job)
        if body is not None and rec is not None:
            await self.jobs.create(body, partial(self._block, name))  # 2. the Job, under the recorded name
            done = replace(rec, validation=replace(rec.validation, created=True))
            await self._write(name, done)  # 3.
            self._blocked.pop(name, None)
        for type_, reason, message in move.events:
            if reason == "ValidationStarted" and rec is not None and rec.validation.job:
                message += f", Job {rec.validation.job}"
            self._event(name, type_, reason, message)
        if move.validated is not None:
            metrics.VALIDATIONS.labels(move.validated[0]).inc()
            if move.validated[1] is not None:
                metrics.VALIDATION_DURATION.observe(move.validated[1])
        if rec is not None and not rec.done and not rec.dry_run:
            return POLL_S
        return None

    async def _taint(self, name: str, node: Mapping[str, Any], on: bool) -> None:
        """Place or lift gpuhealth's burn-in taint; taints have no merge key, so the whole list is
        written under the Node's resourceVersion (a 409 re-reads and decides again)."""
        meta = node.get("metadata") or {}
        taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != BURN_IN_TAINT_KEY]
        patch: dict[str, Any] = {"metadata": {"resourceVersion": meta.get("resourceVersion")}}
        if on:
            taints.append({"key": BURN_IN_TAINT_KEY, "value": "validating", "effect": "NoSchedule"})
            if (meta.get("labels") or {}).get(BURN_IN_LABEL) == BURN_IN_REQUESTED:
                patch["metadata"]["labels"] = {BURN_IN_LABEL: BURN_IN_ACCEPTED}
        patch["spec"] = {"taints": taints or None}
        updated = await self.kube.patch_node(name, patch)
        self.store.reflect_node(name, updated)

    async def _write(self, name: str, rec: NodeValidation | None) -> None:
        await status_writes.record(self.kube, self.store, name, {"nodeValidation": _entry(rec)})


def _entry(rec: NodeValidation | None) -> dict[str, Any] | None:
    """The record as a merge patch's value: the keys a new record drops are nulled (a merge patch
    merges objects), and None removes the record."""
    entry = rec.to_status() if rec is not None else None
    if entry is not None:
        for k in ("job", "created", "startedAt", "finishedAt", "findings", "held", "dryRun"):
            entry.setdefault(k, None)
    return entry
