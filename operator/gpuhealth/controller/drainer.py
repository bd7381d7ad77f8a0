"""Carries out drain plans: checkpoint requests, evictions (Eviction API only), force deletions.

Each step is idempotent by construction: a checkpoint request is a pod annotation written with the
pod's resourceVersion as precondition (so a request is never made twice), and an eviction is only
sent to a pod without a deletionTimestamp. A 429 from a PodDisruptionBudget is retried with growing
delays, never in a tight loop.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuhealth.actions.kube import status_of
from gpuhealth.api.timeutil import format_time_precise
from gpuhealth.controller.backoff import growing_delay
from gpuhealth.drain import pods as P
from gpuhealth.drain.plan import DrainPlan, Step

if TYPE_CHECKING:
    from gpuhealth.controller.reconciler import Reconciler

log = logging.getLogger(__name__)
MAX_RETRY_S = 60.0


class Drainer:
    def __init__(self, reconciler: Reconciler) -> None:
        self.r = reconciler

    async def execute(self, node: str, plan: DrainPlan, now: dt.datetime) -> dict[str, Any]:
        pods_rec: dict[str, dict[str, Any]] = plan.record.setdefault("pods", {})
        for type_, reason, message in plan.events:
            self.r._event("Node", node, node, type_, reason, message)
        for step in plan.steps:
            prec = pods_rec.setdefault(step.pod["metadata"]["uid"], {"pod": step.key, "node": _node_of(step.pod)})
            if step.kind == "request":
                await self._request(node, step, prec)
            elif step.kind == "evict":
                await self._evict(node, step, prec, now)
            elif step.kind == "force-delete":
                await self._force(node, step, prec, now)
        return plan.record

    async def _request(self, node: str, step: Step, prec: dict[str, Any]) -> None:
        meta = step.pod["metadata"]
        at = format_time_precise(self.r.clock())
        patch = {
            "metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {P.CHECKPOINT_REQUESTED: at}}
        }
        try:
            updated = await self.r.call(self.r.kube.patch_pod, meta["namespace"], meta["name"], patch)
        except Exception as e:
            if status_of(e) in (404, 409):
                return  # gone, or changed under us: the next reconcile re-plans on the fresh pod
            raise
        self.r.on_pod("MODIFIED", updated, enqueue=False)
        prec["requestedAt"] = at
        self.r._event(
            "Node",
            node,
            node,
            "Normal",
            "CheckpointRequested",
            f"Asked {step.key} to checkpoint (annotation {P.CHECKPOINT_REQUESTED}={at})",
        )

    async def _evict(self, node: str, step: Step, prec: dict[str, Any], now: dt.datetime) -> None:
        meta = step.pod["metadata"]
        try:
            await self.r.call(self.r.kube.evict_pod, meta["namespace"], meta["name"], meta.get("uid"))
        except Exception as e:
            code = status_of(e)
            if code == 404:
                prec["evictedAt"] = format_time_precise(now)
                return
            if code in (429, 500):
                blocked = int(prec.get("blocked", 0)) + 1
                prec["blocked"] = blocked
                delay = growing_delay(blocked, 2.0, MAX_RETRY_S)
                prec["retryAt"] = format_time_precise(now + dt.timedelta(seconds=delay))
                if code == 500:
                    self.r._event(
                        "Node",
                        node,
                        node,
                        "Warning",
                        "EvictionRefused",
                        f"Evicting {step.key} failed: more than one PodDisruptionBudget selects it; "
                        f"retrying in {delay:.0f}s. Fix the overlapping budgets",
                    )
                elif blocked == 1:
                    self.r._event(
                        "Node",
                        node,
                        node,
                        "Warning",
                        "EvictionBlocked",
                        f"A PodDisruptionBudget does not allow evicting {step.key} yet; retrying with growing delays",
                    )
                self.r.queue_later(node, delay)
                return
            raise
        prec["evictedAt"] = format_time_precise(now)
        prec.pop("retryAt", None)
        self.r._event("Node", node, node, "Normal", "Evicted", f"Evicted {step.key}: {step.why}")

    async def _force(self, node: str, step: Step, prec: dict[str, Any], now: dt.datetime) -> None:
        meta = step.pod["metadata"]
        try:
            await self.r.call(self.r.kube.force_delete_pod, meta["namespace"], meta["name"], meta.get("uid"))
        except Exception as e:
            if status_of(e) != 404:
                raise
        prec["forceDeletedAt"] = format_time_precise(now)
        self.r._event(
            "Node",
            node,
            node,
            "Warning",
            "ForceDeleted",
            f"Force-deleted {step.key} ({step.why}); the policy allows force deletion",
        )


def _node_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")
