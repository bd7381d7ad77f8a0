"""An NVLink domain leaves service as one decision through the node pipeline, and a restarted operator
completes a domain its predecessor began: never a partial domain, never an announcement twice.
Through the in-memory Kube port; on the real control plane in tests/integration/test_domains.py."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gpuhealth.api.names import TAINT_KEY
from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import gpu, report_obj
from tests.unit.controller.act._device_support import Clock
from tests.unit.fake_kube import FakeKube

CLIQUE = "nvidia.com/gpu.clique"
DOMAIN = ("d0", "d1", "d2", "d3")


def _fleet(max_unhealthy: int) -> FakeKube:
    kube = FakeKube()
    kube.add_policy(
        "p", {"safety": {"maxUnhealthy": max_unhealthy, "maxConcurrentDrains": 4}, "devices": {"scope": "Node"}}
    )
    for n in DOMAIN:
        kube.add_node(n, {CLIQUE: "c0ffee.7"})
        devices = [gpu(i, recoveryAction="RecoverImexDomain") if (n, i) == ("d2", 3) else gpu(i) for i in range(8)]
        kube.add_report(report_obj(name=n, devices=devices))
    for n in ("x0", "x1", "x2", "x3"):
        kube.add_node(n)
        kube.add_report(report_obj(name=n))
    return kube


async def _runtime(kube: FakeKube) -> Runtime:
    rt = Runtime(kube, clock=Clock(), workers=1)
    rt.slice_watch.cache.replace([])
    await rt._load()
    await rt._list_pods()
    return rt


def _status(kube: FakeKube, node: str) -> dict[str, Any]:
    return kube.reports[node].get("status") or {}


def _tainted(kube: FakeKube, node: str) -> bool:
    return TAINT_KEY in {t["key"] for t in kube.nodes[node]["spec"].get("taints") or []}


def test_the_whole_domain_leaves_or_none_of_it() -> None:
    async def body() -> None:
        kube = _fleet(max_unhealthy=3)  # 3 of 8 nodes: the domain of 4 does not fit
        rt = await _runtime(kube)
        for n in DOMAIN:
            await rt.reconciler.reconcile(n)
        assert all(_status(kube, n)["heldByBreaker"] and _status(kube, n)["reason"] == "ImexDomain" for n in DOMAIN)
        assert not any(_tainted(kube, n) for n in DOMAIN)
        await rt.events.flush()

    asyncio.run(body())


def test_a_restarted_operator_completes_the_domain_and_announces_nothing_twice() -> None:
    async def body() -> None:
        kube = _fleet(max_unhealthy=4)
        first = await _runtime(kube)
        await first.reconciler.reconcile("d1")  # the decision for the whole domain; d1's record written
        await first.events.flush()
        assert _status(kube, "d1")["state"] == "Draining" and _tainted(kube, "d1")
        assert not any(_tainted(kube, n) for n in ("d0", "d2", "d3"))  # killed here
        announced = kube.reasons("d1")
        # Meanwhile the budget shrank: by the count alone, the rest of the domain would not fit.
        kube.policies["p"]["spec"]["safety"]["maxUnhealthy"] = 1
        second = await _runtime(kube)
        for n in DOMAIN:
            await second.reconciler.reconcile(n)
        await second.events.flush()
        assert all(_status(kube, n)["state"] == "Draining" and _tainted(kube, n) for n in DOMAIN)
        assert all("c0ffee.7" in _status(kube, n)["message"] for n in DOMAIN)
        assert announced and kube.reasons("d1")[: len(announced)] == announced
        # d1's quarantine was announced once, by the first operator; each other member's once, by the second.
        for n in DOMAIN:
            assert all(kube.reasons(n).count(r) == 1 for r in announced), (n, kube.reasons(n))
        assert not any(_tainted(kube, n) for n in ("x0", "x1", "x2", "x3"))

    asyncio.run(body())


# Two domains of 3 under a budget of 4: one fits, never both (hack/chaos/scenarios/domain_kills.py).
PAIR = {"a": ("a0", "a1", "a2"), "b": ("b0", "b1", "b2")}


def _pair() -> FakeKube:
    kube = FakeKube()
    kube.add_policy("p", {"safety": {"maxUnhealthy": 4, "maxConcurrentDrains": 6}, "devices": {"scope": "Node"}})
    for d, members in PAIR.items():
        for n in members:
            kube.add_node(n, {CLIQUE: f"c0ffee.{d}"})
            bad = n in ("a1", "b1")
            kube.add_report(
                report_obj(
                    name=n,
                    devices=[gpu(i, recoveryAction="RecoverImexDomain" if bad and i == 2 else "") for i in range(8)],
                )
            )
    for n in ("x0", "x1", "x2", "x3", "x4", "x5"):
        kube.add_node(n)
        kube.add_report(report_obj(name=n))
    return kube


def _judge(kube: FakeKube) -> None:
    """Never over the budget; each domain all out (for its domain) or all held back, none in part."""
    out = {n for ns in PAIR.values() for n in ns if _tainted(kube, n)}
    assert len(out) <= 4, sorted(out)
    for ns in PAIR.values():
        assert {n in out for n in ns} in ({True}, {False}), sorted(out)
        if not out & set(ns):
            assert all(_status(kube, n)["heldByBreaker"] for n in ns), [_status(kube, n) for n in ns]
    assert len(out) == 3


def test_a_domain_whose_asker_is_written_keeps_its_members_slots_from_another_domain() -> None:
    """Once the asking member's record is written its reservation is released: the other members'
    slots must still count (its record says they follow), or a second domain is admitted beside it."""

    async def body() -> None:
        kube = _pair()
        rt = await _runtime(kube)
        for n in ("a1", "b1", "b0", "b2", "a0", "a2"):
            await rt.reconciler.reconcile(n)
        await rt.events.flush()
        _judge(kube)

    asyncio.run(body())


def test_a_restarted_operator_counts_the_domain_its_predecessor_decided_before_admitting_another() -> None:
    """Killed right after the first member's record (and taint): the records are all a restarted
    operator has of that admission, and its first pass may be another domain's."""

    async def body() -> None:
        kube = _pair()
        first = await _runtime(kube)
        await first.reconciler.reconcile("a1")
        await first.events.flush()
        assert _status(kube, "a1")["reason"] == "ImexDomain" and _tainted(kube, "a1")  # killed here
        second = await _runtime(kube)
        for n in ("b1", "b0", "b2", "a0", "a2", "b1"):
            await second.reconciler.reconcile(n)
        await second.events.flush()
        _judge(kube)
        assert all(_tainted(kube, n) for n in PAIR["a"])

    asyncio.run(body())


def test_a_restart_after_records_out_but_no_node_write_takes_the_whole_domain_out() -> None:
    """domain_kills, seed 32157 (round 0, "the first back, the second out"): the operator was killed
    after writing two members' records ``Draining/ImexDomain`` and before their Node writes, the third
    member still recorded held by the breaker. A restarted operator converges the records onto the
    Nodes and admits the held member into the slot its domain's records keep for it (not counted twice)."""

    async def body() -> None:
        kube = _pair()
        kube.add_report(report_obj(name="a1", devices=[gpu(i) for i in range(8)]))  # a is back
        kube.policies["p"]["spec"]["safety"]["maxUnhealthy"] = 2  # b held back (a was out then)
        first = await _runtime(kube)
        for n in PAIR["b"]:
            await first.reconciler.reconcile(n)
        assert all(_status(kube, n)["heldByBreaker"] for n in PAIR["b"])
        kube.policies["p"]["spec"]["safety"]["maxUnhealthy"] = 4
        second = await _runtime(kube)
        patch_node = kube.patch_node

        def killed(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("SIGKILL before the Node write")

        kube.patch_node = killed  # type: ignore[method-assign]
        for n in ("b2", "b0"):
            with contextlib.suppress(RuntimeError):
                await second.reconciler.reconcile(n)
        kube.patch_node = patch_node  # type: ignore[method-assign]
        assert [(_status(kube, n)["state"], _tainted(kube, n)) for n in PAIR["b"]] == [
            ("Draining", False),
            ("Degraded", False),
            ("Draining", False),
        ]
        assert _status(kube, "b1")["heldByBreaker"]
        third = await _runtime(kube)
        for n in ("b2", "b0", "b1", *PAIR["a"]):
            await third.reconciler.reconcile(n)
        await third.events.flush()
        for n in PAIR["b"]:
            assert _status(kube, n)["state"] == "Draining" and _status(kube, n)["reason"] == "ImexDomain", n
            assert _tainted(kube, n) and kube.nodes[n]["spec"].get("unschedulable"), n
        assert not any(_tainted(kube, n) for n in PAIR["a"])

    asyncio.run(body())
