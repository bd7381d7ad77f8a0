"""The breaker admits an NVLink domain whole or not at all (controller/state/breaker.py)."""

from __future__ import annotations

import asyncio

from gpuhealth.api.names import Signal, State
from gpuhealth.api.status import Record
from gpuhealth.controller.state.breaker import Breaker
from gpuhealth.controller.state.store import Store


def _store(nodes: int, max_unhealthy: int) -> Store:
    store = Store()
    store.put_policy("p", {"metadata": {"name": "p"}, "spec": {"safety": {"maxUnhealthy": max_unhealthy}}})
    for i in range(nodes):
        store.put_node(
            f"n{i}", {"metadata": {"name": f"n{i}", "labels": {}}, "status": {"capacity": {"nvidia.com/gpu": "8"}}}
        )
    return store


DOMAIN = ("n0", "n1", "n2", "n3")


def test_a_domain_that_fits_is_admitted_whole_and_its_members_follow() -> None:
    async def body() -> None:
        store = _store(10, 4)
        breaker, p = Breaker(store), store.policies["p"]
        assert await breaker.admit_domain(p, "n2", DOMAIN, decided=False)
        # Every member holds its slot: nothing else fits until the domain's record is written.
        assert not await breaker.admit(p, "n9")
        for n in DOMAIN:
            assert await breaker.admit_domain(p, n, DOMAIN, decided=False)

    asyncio.run(body())


def test_a_domain_that_does_not_fit_takes_no_slot_at_all() -> None:
    async def body() -> None:
        store = _store(10, 3)
        breaker, p = Breaker(store), store.policies["p"]
        assert not await breaker.admit_domain(p, "n0", DOMAIN, decided=False)
        # Nothing was reserved in part: three single nodes still fit.
        assert all([await breaker.admit(p, n) for n in ("n7", "n8", "n9")])

    asyncio.run(body())


def test_a_decided_domain_is_completed_whatever_the_count() -> None:
    """An operator killed after writing some members' records resumes with the rest, never a part."""

    async def body() -> None:
        store = _store(10, 1)
        for n in ("n0", "n1"):
            store.set_record(n, Record(state=State.DRAINING, reason=Signal.IMEX_DOMAIN))
        breaker, p = Breaker(store), store.policies["p"]
        assert not await breaker.admit_domain(p, "n2", DOMAIN, decided=False)
        assert await breaker.admit_domain(p, "n2", DOMAIN, decided=True)

    asyncio.run(body())


def test_the_askers_release_frees_the_members_it_reserved() -> None:
    async def body() -> None:
        store = _store(10, 4)
        breaker, p = Breaker(store), store.policies["p"]
        assert await breaker.admit_domain(p, "n0", DOMAIN, decided=False)
        breaker.release(p, "n0")  # its status write failed: no record counts, no slot is left behind
        assert all([await breaker.admit(p, n) for n in ("n6", "n7", "n8", "n9")])

    asyncio.run(body())


def test_slow_nodes_have_a_budget_of_their_own() -> None:
    """A fleet-wide slowdown stops at maxSlow and leaves maxUnhealthy whole for broken nodes."""

    async def body() -> None:
        store = Store()
        spec = {"safety": {"maxUnhealthy": 1, "maxSlow": 2}}
        store.put_policy("p", {"metadata": {"name": "p"}, "spec": spec})
        for i in range(10):
            store.put_node(f"n{i}", {"metadata": {"name": f"n{i}"}, "status": {"capacity": {"nvidia.com/gpu": "8"}}})
        breaker, p = Breaker(store), store.policies["p"]
        for n in ("n0", "n1"):
            assert await breaker.admit(p, n, slow=True)
            store.set_record(n, Record(state=State.QUARANTINED, reason=Signal.POWER_BRAKE))
            breaker.release(p, n)
        assert not await breaker.admit(p, "n2", slow=True)  # the slow budget is spent
        assert await breaker.admit(p, "n3")  # the broken budget is untouched by it
        store.set_record("n3", Record(state=State.DRAINING, reason="XID79"))
        breaker.release(p, "n3")
        assert not await breaker.admit(p, "n4")
        tally = store.tally(p)
        assert (tally.out, tally.slow, tally.gpus_slow) == (3, 2, 16)

    asyncio.run(body())


def test_members_follow_the_nodes_labels() -> None:
    store = Store()
    key = "nvidia.com/gpu.clique"

    def put(name: str, **labels: str) -> None:
        store.put_node(name, {"metadata": {"name": name, "labels": labels}})

    put("c", **{key: "x.1"})
    put("a", **{key: "x.1"})
    put("b", **{key: "y.1"})
    assert store.members(key, "x.1") == ("a", "c")
    put("b", **{key: "x.1"})  # relabelled into the domain
    put("c")  # out of every domain
    put("d", **{key: "x.1"})  # a new node after the index was built
    assert store.members(key, "x.1") == ("a", "b", "d")
    store.forget_node("a")
    assert store.members(key, "x.1") == ("b", "d") and store.members(key, "y.1") == ()


CLIQUE = "nvidia.com/gpu.clique"


def _domains(max_unhealthy: int) -> Store:
    """Two 3-node NVLink domains (a0-a2, b0-b2) and four nodes of no domain."""
    store = _store(0, max_unhealthy)
    for d in ("a", "b"):
        for i in range(3):
            labels = {CLIQUE: f"c0ffee.{d}"}
            store.put_node(
                f"{d}{i}",
                {"metadata": {"name": f"{d}{i}", "labels": labels}, "status": {"capacity": {"nvidia.com/gpu": "8"}}},
            )
    for i in range(4):
        store.put_node(
            f"x{i}", {"metadata": {"name": f"x{i}", "labels": {}}, "status": {"capacity": {"nvidia.com/gpu": "8"}}}
        )
    return store


A, B = ("a0", "a1", "a2"), ("b0", "b1", "b2")
OUT = Record(state=State.DRAINING, reason=Signal.IMEX_DOMAIN)


def test_a_decided_domain_keeps_its_members_slots_once_the_askers_reservation_is_released() -> None:
    """The asker's record written, its reservation ends; the members it reserved still count, from
    its record alone: no second domain, and no single node, takes their slots."""

    async def body() -> None:
        store = _domains(4)
        breaker, p = Breaker(store), store.policies["p"]
        assert await breaker.admit_domain(p, "a1", A, decided=False)
        store.set_record("a1", OUT)
        breaker.release(p, "a1")
        assert not await breaker.admit_domain(p, "b1", B, decided=False)
        assert await breaker.admit(p, "x0")  # 3 of the domain + 1: the last slot
        assert not await breaker.admit(p, "x1")
        # A restarted operator (an empty breaker) counts them just the same.
        again = Breaker(store)
        assert not await again.admit_domain(p, "b1", B, decided=False)
        assert await again.admit_domain(p, "a0", A, decided=True)  # the members follow into their slots

    asyncio.run(body())


def test_a_domain_holds_its_slots_until_its_last_member_is_back() -> None:
    async def body() -> None:
        store = _domains(4)
        breaker, p = Breaker(store), store.policies["p"]
        for n in A:
            store.set_record(n, OUT)
        assert not await breaker.admit_domain(p, "b0", B, decided=False)
        store.set_record("a0", Record())  # back in service
        store.set_record("a1", Record())
        assert not await breaker.admit_domain(p, "b0", B, decided=False)  # a2 still out: its episode lasts
        store.set_record("a2", Record(state=State.AWAITING_REPAIR, reason=Signal.IMEX_DOMAIN))
        # Waiting for a human, a2 has left the domain's episode: it counts for itself only.
        assert await breaker.admit_domain(p, "b0", B, decided=False)

    asyncio.run(body())
