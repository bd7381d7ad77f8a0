"""Drains a node while it is Draining, and evicts crash-looping pods from quarantined nodes.

The drainer is given the Kube port, the caches, the breaker (for drain slots) and an Event sink; it
never sees the node reconciler, and tells it when the node wants its next pass by returning it
(``again.py``). It keeps a drain's progress in the node's
GPUNodeHealth ``status.drain`` (written before the first request, so a restart recognises this
drain's requests, and after the requests went out: ``status_writes.py``) and carries out the pure
plan (``drain.plan``) step by step. A record the node's decision ends (the node back Healthy, or a
new Draining episode) is dropped in the decision's own status patch (:meth:`Drainer.fold`), not in a
write of its own after the Node's.

Each step is idempotent by construction: a checkpoint request is a pod annotation written with the
pod's resourceVersion as precondition (so a request is never made twice), and an eviction is only
sent to a pod without a deletionTimestamp. A 429 from a PodDisruptionBudget is retried with growing
delays, never in a tight loop: the pod's ``retryAt`` in the record keeps every pass before it from
sending the eviction again. Every eviction, in a drain or not, goes through ``_evict``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from gpuhealth.api import pods as P
from gpuhealth.api.names import OUT_OF_SERVICE, Mode, State
from gpuhealth.api.policy import Policy
from gpuhealth.api.status import (
    DrainRecord,
    PodDrain,
    Record,
    WorkloadMove,
    drain_is_current,
)
from gpuhealth.api.timeutil import format_time, format_time_precise, parse_time
from gpuhealth.controller.act import status_writes
from gpuhealth.controller.act.again import Again
from gpuhealth.controller.act.passes import NodePass
from gpuhealth.controller.backoff import growing_delay
from gpuhealth.controller.state.breaker import Breaker
from gpuhealth.controller.state.store import Store
from gpuhealth.drain.plan import DrainPlan, Step, crashloop_evictions, plan_drain
from gpuhealth.kube.aio import AsyncKube
from gpuhealth.kube.client import status_of
from gpuhealth.kube.events import EventSink

log = logging.getLogger(__name__)
MAX_RETRY_S = 60.0
DRAIN_CONCURRENCY = 32  # checkpoint requests and evictions in flight at once, over every drain (--drain-concurrency)
SENT_MEMORY_S = 300.0  # how long an eviction sent is remembered (the watch shows it long before)
SENT_PRUNE_AT = 10000  # evictions remembered before the old ones are forgotten


class WorkloadMover(Protocol):
    """Takes the plan's evictions of pods whose workload moves as a whole (Kueue, ``controller/act/admission.py``)
    and returns the steps left for the pod path."""

    async def take(self, node: str, plan: DrainPlan, cause: str, now: dt.datetime) -> list[Step]: ...


class Drainer:
    def __init__(
        self,
        *,
        kube: AsyncKube,
        events: EventSink,
        store: Store,
        breaker: Breaker,
        clock: Callable[[], dt.datetime],
        steps: AsyncKube | None = None,
        parallel: int = DRAIN_CONCURRENCY,
    ) -> None:
        self.kube = kube
        # The checkpoint requests and evictions: on a pool of their own (``steps``), and each drain's
        # steps at once, at most ``parallel`` of them (the pool bounds all drains together the same way).
        self.steps = steps or kube
        self.parallel = max(1, parallel)
        self.events = events
        self.store = store
        self.breaker = breaker
        self.clock = clock
        # Crash-looping pods evicted outside a drain, by node: pod uids kept until the pod leaves the
        # cache. A watch event that was already on its way when we evicted brings back a copy without
        # the deletionTimestamp; this memory, not the cached pod, keeps it from being evicted twice.
        self._evicted: dict[str, set[str]] = {}
        # Set by the runtime when the Kueue admission room runs; None: every pod takes the pod path.
        self.mover: WorkloadMover | None = None
        # Every pod this replica evicted (or is evicting), by uid, with when: a gang spanning several
        # draining nodes is evicted by each of their drains, concurrently, before any cache shows the
        # first eviction; the uid is taken before the request is sent, so only one drain sends it.
        self._sent: dict[str, float] = {}

    def _event(self, node: str, type_: str, reason: str, message: str) -> None:
        self.events("Node", node, node, type_, reason, message)

    async def run(self, p: NodePass, rec: Record, fatal: bool) -> Again:
        """Drain while Draining; evict crash-looping pods from any quarantined node. Returns when the
        node wants its next pass: soon after a completed drain, every second while one runs. The drain
        runs under the settings for the node's reason (``Policy.drain_for``: patient for a slow one)."""
        name, policy, now = p.name, p.policy, p.now
        found = DrainRecord() if self.fold(p, rec) else p.found.drain  # as the decision patch left it
        record = DrainRecord(**found)  # a copy: the pass's record is read only
        if rec.state != State.DRAINING:
            self.breaker.end_drain(policy, name)
            if rec.state in OUT_OF_SERVICE:
                await self._evict_crashlooping(name, policy, now)
            else:
                self._evicted.pop(name, None)
            return None  # a Healthy node's drain record went with the decision (``fold``)
        if record and not drain_is_current(record, rec):
            record = DrainRecord()  # a previous episode's drain (``fold`` drops it with the decision): start afresh
        if record.get("phase") == "Completed":
            self.breaker.end_drain(policy, name)
            return None
        if not self.breaker.draining(policy, name):
            if not await self.breaker.take_drain_slot(policy, name):
                if record.get("phase") != "Queued":
                    await self.write(name, DrainRecord(phase="Queued"))
                    self._event(
                        name,
                        "Normal",
                        "DrainQueued",
                        f"Waiting for a drain slot (maxConcurrentDrains {policy.max_concurrent_drains})",
                    )
                return None
            if record.get("phase") == "Queued":
                record = DrainRecord()
        if not record.get("startedAt"):
            # Record the start before the first request, so a restart recognises this drain's requests.
            if set(found) - {"phase"}:
                await self.write(name, None)  # a merge patch would keep a previous drain's pods (``fold``
                # dropped a previous episode's already: this is only a record its episode cannot place)
            record = DrainRecord(phase="Running", startedAt=format_time(now), fatal=fatal, pods={})
            await self.write(name, record)
        pods = self.store.pods.on(name)
        gangs = self.store.pods.gangs()
        plan = plan_drain(
            name, pods, gangs, policy.drain_for(rec.reason), fatal, record, now, self._gang_drains(name, pods, gangs)
        )
        new_record = await self.execute(name, plan, now, f"{rec.reason}: {rec.message}")
        if plan.complete:
            self.breaker.end_drain(policy, name)
            self._event(
                name,
                "Normal",
                "DrainFinished",
                f"All {new_record.get('total', 0)} workload pods have left the node "
                f"({new_record.get('evicted', 0)} evicted)",
            )
        if new_record != record:
            await self.write(name, new_record)
        # Complete: the state machine moves on with the completed drain. Running: the next pass sees
        # acknowledgements, pods gone and retry times come.
        return 0.05 if plan.complete else 1.0

    def _gang_drains(
        self, name: str, pods: Sequence[Mapping[str, Any]], gangs: Mapping[str, Sequence[Mapping[str, Any]]]
    ) -> dict[str, dt.datetime]:
        """When the running drains of the other nodes this node's gangs span started (from their records)."""
        nodes = {
            _node_of(m)
            for p in pods
            if (gk := P.gang_key(p)) is not None
            for m in gangs.get(gk, [])
            if _node_of(m) not in ("", name)
        }
        out = {}
        for n in nodes:
            drain = self.store.status(n).drain
            at = parse_time(drain.get("startedAt")) if drain.get("phase") == "Running" else None
            if at is not None:
                out[n] = at
        return out

    async def _evict_crashlooping(self, name: str, policy: Policy, now: dt.datetime) -> None:
        """Evict the pods that keep failing on this out-of-service node, each once."""
        pods = self.store.pods.on(name)
        evicted = self._evicted.setdefault(name, set())
        evicted &= {p["metadata"].get("uid") for p in pods}  # forget pods that have left
        for step in crashloop_evictions(policy, pods, now):
            uid = step.pod["metadata"].get("uid")
            if uid in evicted:
                continue
            if await self._evict(name, step, None, now):
                evicted.add(uid)
        if not evicted:
            self._evicted.pop(name, None)

    def fold(self, p: NodePass, rec: Record) -> dict[str, Any]:
        """``status.drain`` to drop in the node's own status patch (Enforce, where drains run): the
        drain record of a node this pass's decision (``rec``) makes Healthy, or of an earlier episode
        than the Draining one ``rec`` is in. The record goes with the decision that ends it, in one
        write, not in a second one after the Node's, and the drain ``run`` starts from no record."""
        drain = p.found.drain
        if not drain or p.policy.mode != Mode.ENFORCE:
            return {}
        if rec.state == State.HEALTHY or (rec.state == State.DRAINING and not drain_is_current(drain, rec)):
            return {"drain": None}
        return {}

    async def write(self, name: str, record: DrainRecord | None) -> None:
        """Write (or, with ``None``, remove) ``status.drain``."""
        await status_writes.record(self.kube, self.store, name, {"drain": None if record is None else dict(record)})

    async def execute(self, node: str, plan: DrainPlan, now: dt.datetime, cause: str = "") -> DrainRecord:
        """Carry out the plan's steps; returns the progress record they updated. ``cause`` (the fault)
        goes into what a moved Workload is told. The steps update a copy of the plan's record (the
        planner's output is never edited in place), pod by pod."""
        record = DrainRecord(**plan.record)
        record["pods"] = {uid: PodDrain(**p) for uid, p in (plan.record.get("pods") or {}).items()}
        if "workloads" in plan.record:  # the Kueue mover's entries: shared with the cached status otherwise
            record["workloads"] = {k: WorkloadMove(**w) for k, w in plan.record["workloads"].items()}
        plan = dataclasses.replace(plan, record=record)
        pods_rec: dict[str, PodDrain] = record["pods"]
        for type_, reason, message in plan.events:
            self._event(node, type_, reason, message)
        steps = plan.steps
        if self.mover is not None:
            steps = await self.mover.take(node, plan, cause, now)
        slots = asyncio.Semaphore(self.parallel)

        async def one(step: Step) -> None:
            prec = pods_rec.setdefault(step.pod["metadata"]["uid"], PodDrain(pod=step.key, node=_node_of(step.pod)))
            async with slots:
                if step.kind == "request":
                    await self._request(node, step, prec)
                elif step.kind == "evict":
                    await self._evict(node, step, prec, now)
                elif step.kind == "force-delete":
                    await self._force(node, step, prec, now)

        # A node's pods are independent requests: sent one after another, 15 pods held a reconcile worker
        # for 15 round trips, and a drain storm kept the workers from the next fault's taint. Every step
        # runs to its end before the first failure is raised: one refusal does not abandon the others in
        # flight, and the pods they evicted are not evicted again by the retry (``_sent``, then the
        # pods' deletionTimestamp), though this pass's record is not written.
        failures = [r for r in await asyncio.gather(*map(one, steps), return_exceptions=True) if r is not None]
        if failures:
            raise failures[0]
        return record

    async def _request(self, node: str, step: Step, prec: PodDrain) -> None:
        meta = step.pod["metadata"]
        at = format_time_precise(self.clock())
        patch = {
            "metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {P.CHECKPOINT_REQUESTED: at}}
        }
        try:
            updated = await self.steps.patch_pod(meta["namespace"], meta["name"], patch)
        except Exception as e:
            if status_of(e) in (404, 409):
                return  # gone, or changed under us: the next reconcile re-plans on the fresh pod
            raise
        self.store.pods.refresh(updated)
        prec["requestedAt"] = at
        self._event(
            node,
            "Normal",
            "CheckpointRequested",
            f"Asked {step.key} to checkpoint (annotation {P.CHECKPOINT_REQUESTED}={at})",
        )

    async def _evict(self, node: str, step: Step, prec: PodDrain | None, now: dt.datetime) -> bool:
        """The one eviction path; True once the pod is evicted (or already gone). ``prec`` is the pod's
        drain progress; ``None`` outside a drain, where a refusal is left for the next reconcile."""
        meta = step.pod["metadata"]
        uid = meta.get("uid")
        if uid and self._already_sent(uid):
            if prec is not None:  # another drain of this replica evicted it (a gang across draining nodes)
                prec.setdefault("evictedAt", format_time_precise(now))
                prec.pop("retryAt", None)
            return True
        if uid:
            self._sent[uid] = time.monotonic()
        try:
            await self.steps.evict_pod(meta["namespace"], meta["name"], meta.get("uid"), meta.get("resourceVersion"))
        except Exception as e:
            code = status_of(e)
            if uid and code != 404:
                self._sent.pop(uid, None)  # not evicted: a later plan may try again
            if prec is None:
                if code == 404:
                    return True
                if code in (409, 429, 500):
                    log.info("eviction of %s refused (%s); the next reconcile tries again", step.key, code)
                    return False
                raise
            if code == 404:
                prec["evictedAt"] = format_time_precise(now)
                return True
            if code == 409:
                return False  # the pod changed since it was planned (evicted by another?): the next pass sees it
            if code in (429, 500):
                self._blocked(node, step, prec, code, now)
                return False
            raise
        if prec is None:
            self._event(node, "Normal", step.reason, step.message)
            return True
        prec["evictedAt"] = format_time_precise(now)
        prec.pop("retryAt", None)
        self._event(node, "Normal", step.reason or "Evicted", step.message or f"Evicted {step.key}: {step.why}")
        return True

    def _already_sent(self, uid: str) -> bool:
        """Whether this replica sent (or is sending) an eviction for the pod recently; forgets old ones.

        The memory only has to outlast the watch catching up with the eviction (the pod then shows its
        deletionTimestamp, or is gone, and no plan picks it again).
        """
        now = time.monotonic()
        if len(self._sent) > SENT_PRUNE_AT:
            self._sent = {u: t for u, t in self._sent.items() if now - t < SENT_MEMORY_S}
        at = self._sent.get(uid)
        return at is not None and now - at < SENT_MEMORY_S

    def _blocked(self, node: str, step: Step, prec: PodDrain, code: int, now: dt.datetime) -> None:
        """A budget (429) or overlapping budgets (500) refused the eviction: retry with growing delays."""
        blocked = int(prec.get("blocked", 0)) + 1
        prec["blocked"] = blocked
        delay = growing_delay(blocked, 2.0, MAX_RETRY_S)
        prec["retryAt"] = format_time_precise(now + dt.timedelta(seconds=delay))
        if code == 500:
            self._event(
                node,
                "Warning",
                "EvictionRefused",
                f"Evicting {step.key} failed: more than one PodDisruptionBudget selects it; "
                f"retrying in {delay:.0f}s. Fix the overlapping budgets",
            )
        elif blocked == 1:
            self._event(
                node,
                "Warning",
                "EvictionBlocked",
                f"A PodDisruptionBudget does not allow evicting {step.key} yet; retrying with growing delays",
            )

    async def _force(self, node: str, step: Step, prec: PodDrain, now: dt.datetime) -> None:
        meta = step.pod["metadata"]
        try:
            await self.steps.force_delete_pod(meta["namespace"], meta["name"], meta.get("uid"))
        except Exception as e:
            if status_of(e) != 404:
                raise
        prec["forceDeletedAt"] = format_time_precise(now)
        self._event(
            node,
            "Warning",
            "ForceDeleted",
            f"Force-deleted {step.key} ({step.why}); the policy allows force deletion",
        )


def _node_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")
