"""One admission for every Job gpuhealth runs: the places a policy's limits leave, for the GPU ladder
and node validation alike.

Three kinds of Job count against a limit across a policy's nodes (``Slot``): a repair step in
flight (``spec.remediation.maxConcurrent``), a validation Job, a GPU's or a node's after a release
(``spec.validation.maxConcurrent``, both counted together), and a new node's burn-in
(``spec.validation.newNodes.batchSize``). What runs is what the cached reports' statuses say
(``running.py``); a place given out whose record is not in the store yet is reserved here, under
one lock, so two workers admitting at once cannot both take the last place. The reservation ends
(:meth:`JobSlots.end`) once the record is written, or once the pass gave up on it.

The remediator (``act/remediator.py``) and the node validator (``act/node_validator.py``) share one
instance: a GPU's validation and a node's take places from the same count.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum

from gpuhealth.api.policy import Policy
from gpuhealth.api.status import Running
from gpuhealth.controller.state.running import RunningIndex
from gpuhealth.controller.state.store import Store

NODE_SCOPE = -1  # the reservation's index for a Job of the whole node (a node's validation, a burn-in)


class Slot(StrEnum):
    RESET = "reset"  # a step of a GPU's ladder in flight
    VALIDATION = "validation"  # a GPU's validation, or a node's after a release
    BURN_IN = "burn-in"  # a new node's validation


def limit(kind: Slot, policy: Policy) -> tuple[int, str]:
    """The policy's limit for ``kind``, and why a Job waits when it is reached (the field named)."""
    if kind == Slot.RESET:
        n = policy.remediation.max_concurrent
        return n, f"spec.remediation.maxConcurrent ({n}) resets are in flight"
    if kind == Slot.VALIDATION:
        n = policy.validation.max_concurrent
        return n, f"spec.validation.maxConcurrent ({n}) validations are running"
    n = policy.validation.new_nodes.batch_size
    return n, f"spec.validation.newNodes.batchSize ({n}) burn-ins are running"


def _running(kind: Slot, r: Running) -> int:
    return r.steps if kind == Slot.RESET else r.validations if kind == Slot.VALIDATION else r.burn_ins


class JobSlots:
    def __init__(self, store: Store) -> None:
        self.running = RunningIndex(store)
        self._lock = asyncio.Lock()
        self._reserved: dict[Slot, set[tuple[str, int]]] = {kind: set() for kind in Slot}

    def count(self, kind: Slot, policy: str) -> int:
        """Jobs of ``kind`` running across the policy's nodes (their records), plus those being admitted."""
        return len(self._reserved[kind]) + sum(_running(kind, r) for r in self.running.under(policy))

    async def admit(self, kind: Slot, policy: Policy, node: str, index: int = NODE_SCOPE) -> str:
        """Reserve a place for a Job of ``kind`` on ``node`` (GPU ``index``, or the whole node); ``""``
        if reserved, else why not. The reservation lasts until :meth:`end`."""
        most, why = limit(kind, policy)
        async with self._lock:
            if self.count(kind, policy.name) >= most:
                return why
            self._reserved[kind].add((node, index))
        return ""

    def end(self, kind: Slot, node: str, index: int = NODE_SCOPE) -> None:
        """The reservation ends: the record is written (the count reads it from there now), or the pass
        gave up. Ending one that was never made does nothing."""
        self._reserved[kind].discard((node, index))
