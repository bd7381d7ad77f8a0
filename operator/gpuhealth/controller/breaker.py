"""The per-policy circuit breaker: admission of new quarantines, and drain slots.

A node about to leave service asks for a slot under its policy's lock; the slot stays reserved
until the node's status is written (``release``), so concurrent workers cannot overshoot
``maxUnhealthy``. Drains take one of ``maxConcurrentDrains`` slots the same way.
"""

from __future__ import annotations

import asyncio

from gpuhealth.api.policy import Policy
from gpuhealth.controller.store import Store


class Breaker:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._locks: dict[str, asyncio.Lock] = {}
        self._reserved: dict[str, set[str]] = {}
        self._draining: dict[str, set[str]] = {}

    def _lock(self, policy: Policy) -> asyncio.Lock:
        return self._locks.setdefault(policy.name, asyncio.Lock())

    async def admit(self, policy: Policy, name: str) -> bool:
        """Reserve a slot for ``name`` to leave service, if the policy's limit allows one more."""
        async with self._lock(policy):
            governed = self._store.governed_by(policy)
            reserved = self._reserved.setdefault(policy.name, set())
            records = self._store.records
            out = {n for n in governed if (r := records.get(n)) is not None and r.out_of_service} | reserved
            out.discard(name)
            if len(out) + 1 <= policy.breaker_limit(len(governed)):
                reserved.add(name)
                return True
            return False

    def release(self, policy: Policy, name: str) -> None:
        """The node's status is written (or the write failed): its record now counts, not the slot."""
        self._reserved.get(policy.name, set()).discard(name)

    # -- drain slots -------------------------------------------------------------------------------

    def draining(self, policy: Policy, name: str) -> bool:
        return name in self._draining.get(policy.name, set())

    async def take_drain_slot(self, policy: Policy, name: str) -> bool:
        """A drain slot for ``name`` if fewer than ``maxConcurrentDrains`` run for the policy."""
        async with self._lock(policy):
            active = self._draining.setdefault(policy.name, set())
            if name in active:
                return True
            if len(active) >= policy.max_concurrent_drains:
                return False
            active.add(name)
            return True

    def end_drain(self, policy: Policy, name: str) -> None:
        self._draining.get(policy.name, set()).discard(name)

    def drains(self) -> set[str]:
        """Every node holding a drain slot (pod changes re-queue them)."""
        return {n for nodes in self._draining.values() for n in nodes}

    def clear(self) -> None:
        """After a pause: another replica may have moved things on; slots are re-earned from records."""
        self._reserved.clear()
        self._draining.clear()
