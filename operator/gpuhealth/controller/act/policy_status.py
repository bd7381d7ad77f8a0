"""Each policy's status (counts per state, the breaker, overlaps), its metrics and breaker Events.

Computed on every sweep from the store's per-policy tallies (kept as nodes and records change, so
a sweep costs the number of policies, not of nodes) and written only when it changed, so an idle
fleet costs no policy writes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.api.names import API_VERSION, OUT_OF_SERVICE, POLICY_KIND, State
from gpuhealth.api.timeutil import format_time
from gpuhealth.controller import metrics
from gpuhealth.controller.state import capacity
from gpuhealth.controller.state.store import Store
from gpuhealth.kube.aio import AsyncKube
from gpuhealth.kube.client import is_not_found
from gpuhealth.kube.events import EventSink


@dataclass
class PolicyView:
    """What the sweep learned about a policy, for its status."""

    nodes: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    overlaps: dict[str, int] = field(default_factory=dict)
    held: int = 0
    gpus: int = 0
    gpus_out: int = 0
    gpus_held: int = 0  # GPUs whose own quarantine the GPU budget holds back
    slow: int = 0  # nodes out for a slow, not broken, signal (their own budget: maxSlow)
    gpus_slow: int = 0  # GPUs held out for a slow signal, by node or one by one: degraded, apart from broken


def summarize(store: Store) -> dict[str, PolicyView]:
    """Each policy's view, from the store's per-policy tallies: the cost is the number of policies."""
    views = {}
    for policy in store.policies.values():
        t = store.tally(policy)
        views[policy.name] = PolicyView(
            nodes=t.nodes,
            counts=dict(t.counts),
            overlaps=dict(t.overlaps),
            held=t.held,
            gpus=t.gpus,
            gpus_out=t.gpus_out,
            gpus_held=t.gpus_held,
            slow=t.slow,
            gpus_slow=t.gpus_slow,
        )
    return views


class PolicyStatus:
    def __init__(self, *, kube: AsyncKube, store: Store, events: EventSink, clock: Callable[[], dt.datetime]) -> None:
        self.kube = kube
        self.store = store
        self.events = events
        self.clock = clock
        self.breaker_open: dict[str, bool] = {}
        self._written: dict[str, dict[str, Any]] = {}

    def forget(self) -> None:
        """After a pause: re-read what the statuses say before announcing or skipping a write."""
        self.breaker_open.clear()
        self._written.clear()

    async def update(self) -> None:
        capacity.export_counts(
            {
                (p.name, str(s)): self.store.tally(p).gpus_by_state.get(str(s), 0)
                for p in self.store.policies.values()
                for s in OUT_OF_SERVICE
            }
        )
        capacity.export_devices({p.name: self.store.tally(p) for p in self.store.policies.values()})
        for pname, v in summarize(self.store).items():
            await self._update_one(pname, v)

    async def _update_one(self, pname: str, v: PolicyView) -> None:
        policy = self.store.policies[pname]
        limit = policy.breaker_limit(v.nodes)
        out = sum(v.counts.get(str(s), 0) for s in OUT_OF_SERVICE)
        is_open = v.held > 0 or v.gpus_held > 0
        for s in State:
            metrics.NODES.labels(pname, str(s)).set(v.counts.get(str(s), 0))
        metrics.BREAKER_OPEN.labels(pname).set(1 if is_open else 0)
        capacity.export_slow(pname, v.slow, v.gpus_slow, max(0, v.gpus_out - v.gpus_slow))
        obj = self.store.policy_objs.get(pname, {})
        uid = obj.get("metadata", {}).get("uid", pname)
        # What was last announced is what the policy's status says (it is written before the Event),
        # so a restarted operator or a new leader does not announce the same transition again.
        was_open = self.breaker_open.get(pname)
        if was_open is None:
            was_open = (obj.get("status") or {}).get("breaker") == "Open"
        overlap_msg = ", ".join(f"{n} nodes governed by {w}" for w, n in sorted(v.overlaps.items()))
        status: dict[str, Any] = {
            "observedGeneration": policy.generation,
            "nodes": v.nodes,
            "healthy": v.counts.get("Healthy", 0),
            "degraded": v.counts.get("Degraded", 0),
            "quarantined": v.counts.get("Quarantined", 0),
            "draining": v.counts.get("Draining", 0),
            "awaitingRepair": v.counts.get("AwaitingRepair", 0),
            "recovering": v.counts.get("Recovering", 0),
            "unknown": v.counts.get("Unknown", 0),
            "breaker": "Open" if is_open else "Closed",
            "breakerLimit": limit,
            "outOfService": out,
            "heldBack": v.held,
            "gpus": v.gpus,
            "gpusOutOfService": v.gpus_out,
            "gpuBreakerLimit": policy.gpu_breaker_limit(v.gpus, v.nodes),
            "gpusHeldBack": v.gpus_held,
            "slow": v.slow,
            "slowBreakerLimit": policy.slow_breaker_limit(v.nodes),
            "gpusSlow": v.gpus_slow,
            "slowGPUBreakerLimit": policy.slow_gpu_breaker_limit(v.gpus, v.nodes),
            "gpusBroken": max(0, v.gpus_out - v.gpus_slow),
            "overlaps": overlap_msg or None,
        }
        prev = self._written.get(pname)
        if prev is None:
            prev = {k: val for k, val in (obj.get("status") or {}).items() if k in status}
        if all(prev.get(k) == val for k, val in status.items()):
            self._written[pname] = status
            self._announce_breaker(pname, uid, was_open, is_open, v, out, limit)
            return
        status["conditions"] = [
            {
                "type": "BreakerOpen",
                "status": "True" if is_open else "False",
                "reason": "LimitReached" if is_open else "UnderLimit",
                "message": f"{out}/{v.nodes} out of service, limit {limit}",
                "lastTransitionTime": format_time(self.clock()),
            },
            {
                "type": "Overlapping",
                "status": "True" if overlap_msg else "False",
                "reason": "LowerPriority" if overlap_msg else "NoOverlap",
                "message": overlap_msg or "no node matches a higher-priority policy",
                "lastTransitionTime": format_time(self.clock()),
            },
        ]
        try:
            await self.kube.patch_policy_status(pname, {"status": status})
            self._written[pname] = {k: v2 for k, v2 in status.items() if k != "conditions"}
        except Exception as e:
            if not is_not_found(e):
                raise
            return  # the policy is gone: nothing to announce on it
        self._announce_breaker(pname, uid, was_open, is_open, v, out, limit)

    def _announce_breaker(
        self, pname: str, uid: str, was_open: bool, is_open: bool, v: PolicyView, out: int, limit: int
    ) -> None:
        """Announce a breaker transition once, after the status that records it was written."""
        self.breaker_open[pname] = is_open
        if is_open == was_open:
            return
        if is_open:
            self.events(
                POLICY_KIND,
                pname,
                uid,
                "Warning",
                "BreakerOpen",
                f"{out} of {v.nodes} nodes are out of service (limit {limit}): holding back {v.held} more "
                f"quarantines; {v.gpus_out} of {v.gpus} GPUs out (maxUnhealthyGPUs limit "
                f"{self.store.policies[pname].gpu_breaker_limit(v.gpus, v.nodes)}): holding back {v.gpus_held} GPUs",
                API_VERSION,
            )
        else:
            self.events(
                POLICY_KIND,
                pname,
                uid,
                "Normal",
                "BreakerClosed",
                f"Back under the limit ({out} of {v.nodes} out of service, limit {limit})",
                API_VERSION,
            )
