"""The per-policy circuit breaker: admission of new quarantines, and drain slots.

A node about to leave service asks for a slot under its policy's lock; the slot stays reserved
until the node's status is written (``release``), so concurrent workers cannot overshoot
``maxUnhealthy``. Drains take one of ``maxConcurrentDrains`` slots the same way.

An NVLink domain is admitted whole or not at all (``admit_domain``): its asking member reserves a
slot for every member, held until that member's status is written. From then on its record is the
domain's decision (``domains.domain_decided``): the other members follow it, and until the last of
them is counted out their slots are counted from the records (``Topology.committed``), not from
this process's memory, so neither a later admission nor an operator restarted after a kill at any
line gives them to another node or domain.

Admission reads the store's per-policy tally (kept as nodes and records change), never the fleet:
its cost under the lock is the number of reserved slots plus the members of the domains out for
their domain, whatever the fleet's size.
"""

from __future__ import annotations

import asyncio

from gpuhealth.api.policy import Policy
from gpuhealth.controller.state.store import Store
from gpuhealth.controller.state.topology import Topology


class Breaker:
    def __init__(self, store: Store, topology: Topology | None = None) -> None:
        self._store = store
        self._topology = topology or Topology(store)
        self._locks: dict[str, asyncio.Lock] = {}
        self._reserved: dict[str, set[str]] = {}
        self._reserved_slow: dict[str, set[str]] = {}  # slots of the slow budget (maxSlow)
        self._draining: dict[str, set[str]] = {}
        self._reserved_gpus: dict[str, dict[str, int]] = {}
        self._reserved_slow_gpus: dict[str, dict[str, int]] = {}  # GPUs of the slow budget (maxSlow)
        self._domain_slots: dict[str, dict[str, set[str]]] = {}  # policy -> asking node -> members reserved

    def _lock(self, policy: Policy) -> asyncio.Lock:
        return self._locks.setdefault(policy.name, asyncio.Lock())

    def _pending(self, policy: Policy) -> set[str]:
        """Nodes that count against ``maxUnhealthy`` though their records do not say out (yet): those
        holding a slot reserved here, and the members of decided domains (``Topology.committed``)."""
        reserved = self._reserved.setdefault(policy.name, set())
        return {n for n in reserved | self._topology.committed(policy) if not self._store.counted_out(policy, n)}

    async def admit(self, policy: Policy, name: str, slow: bool = False) -> bool:
        """Reserve a slot for ``name`` to leave service, if the policy's limit allows one more.

        ``slow``: it leaves for a slow, not broken, signal only; such nodes have a budget of their own
        (``maxSlow``) and neither spend nor are held back by the one for broken nodes (``maxUnhealthy``).
        """
        async with self._lock(policy):
            tally = self._store.tally(policy)
            mine = self._reserved_slow if slow else self._reserved
            reserved = mine.setdefault(policy.name, set())
            # Nodes out of service by their records, plus those counted before their records say so:
            # slots reserved, and (the broken budget's) members of decided domains.
            if slow:
                pending = {n for n in reserved if not self._store.counted_out(policy, n)}
                out = tally.slow + len(pending)
            else:
                pending = self._pending(policy)
                out = tally.out - tally.slow + len(pending)
            if name in pending or self._store.counted_out(policy, name):
                out -= 1  # the node itself is not one more
            limit = policy.slow_breaker_limit(tally.nodes) if slow else policy.breaker_limit(tally.nodes)
            if out + 1 <= limit:
                reserved.add(name)
                return True
            return False

    async def admit_domain(self, policy: Policy, name: str, nodes: tuple[str, ...], decided: bool) -> bool:
        """One decision for a whole NVLink domain: reserve a slot for every member of ``nodes`` not yet
        out of service, or for none, so a domain never leaves service in part.

        ``decided``: a member is already out for the domain by its persisted record (an earlier pass,
        or an operator since restarted, took the decision): the rest follow into the slots counted
        for them since that record (``Topology.committed``), whatever the count is now (a budget
        lowered since is not a reason to leave a domain half out). The members' slots are reserved
        here until ``name``'s status is written; by then its record says the domain is decided, and
        the records hold the slots from there.
        """
        async with self._lock(policy):
            reserved = self._reserved.setdefault(policy.name, set())
            if decided or name in reserved:
                reserved.add(name)
                return True
            tally = self._store.tally(policy)
            pending = self._pending(policy)
            out = tally.out - tally.slow + len(pending)
            new = {n for n in (*nodes, name) if n not in pending and not self._store.counted_out(policy, n)}
            if out + len(new) > policy.breaker_limit(tally.nodes):
                return False
            reserved.update(new)
            self._domain_slots.setdefault(policy.name, {})[name] = new
            return True

    async def gpu_budget(self, policy: Policy, name: str, wanted: int, slow: bool = False) -> int:
        """Reserve up to ``wanted`` more GPUs of ``name`` to leave service one by one, within
        ``maxUnhealthyGPUs`` of the policy's GPUs; a node out of service counts all its GPUs.

        ``slow``: GPUs leaving for a slow, not broken, signal only; they have a budget of their own
        (``maxSlow`` in GPUs) and neither spend nor are held back by the one for dead GPUs."""
        async with self._lock(policy):
            tally = self._store.tally(policy)
            mine = self._reserved_slow_gpus if slow else self._reserved_gpus
            reserved = mine.setdefault(policy.name, {})
            counted = tally.gpus_slow if slow else tally.gpus_out - tally.gpus_slow
            out = counted + sum(v for n, v in reserved.items() if n != name)
            limit = (
                policy.slow_gpu_breaker_limit(tally.gpus, tally.nodes)
                if slow
                else policy.gpu_breaker_limit(tally.gpus, tally.nodes)
            )
            grant = max(0, min(wanted, limit - out))
            reserved[name] = grant
            return grant

    def release(self, policy: Policy, name: str) -> None:
        """The node's status is written (or the write failed): its record now counts, not the slot."""
        self._reserved.get(policy.name, set()).discard(name)
        self._reserved_slow.get(policy.name, set()).discard(name)
        self._reserved_gpus.get(policy.name, {}).pop(name, None)
        self._reserved_slow_gpus.get(policy.name, {}).pop(name, None)
        for member in self._domain_slots.get(policy.name, {}).pop(name, set()):
            self._reserved.get(policy.name, set()).discard(member)

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
        self._reserved_slow.clear()
        self._reserved_gpus.clear()
        self._reserved_slow_gpus.clear()
        self._domain_slots.clear()
        self._draining.clear()
