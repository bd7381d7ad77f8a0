"""A rack's power-brake episode and an NVLink domain's episode through the node pipeline: the rack's
brake lifting node by node never leaves its last braked node under a finding of its own, and a domain's
members, out for it, return together; both from the written statuses, so a restarted operator goes on
where its predecessor was. Through the in-memory Kube port; on the real control plane in
tests/integration/test_domains.py."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from typing import Any

from gpuhealth.api.names import TAINT_KEY
from gpuhealth.controller import metrics
from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import at, gpu, iso, report_obj
from tests.unit.controller.act._device_support import Clock
from tests.unit.controller.act._device_support import runtime as device_runtime
from tests.unit.fake_kube import FakeKube

RACK_LABEL = "topology.kubernetes.io/rack"
CLIQUE = "nvidia.com/gpu.clique"
RACK = ("r0", "r1", "r2", "r3")
DOMAIN = ("d0", "d1", "d2", "d3")
BRAKE = 0x80 | 0x8


async def _runtime(kube: FakeKube, clock: Clock) -> Runtime:
    return await device_runtime(kube, clock, slices=False)  # no DRA slices: the list is in, empty


def _report(rt: Runtime, kube: FakeKube, clock: Clock, node: str, devices: list[dict[str, Any]]) -> None:
    """The agent of ``node`` writes its facts now (a fresh heartbeat), and the watch brings them."""
    body = report_obj(name=node, devices=devices, heartbeat=(clock.t - at(0)).total_seconds())
    kube.reports[node]["spec"] = body["spec"]
    rt.on_report("MODIFIED", copy.deepcopy(kube.reports[node]), enqueue=False)


def _braked(since_s: float) -> list[dict[str, Any]]:
    return [gpu(i, clockEventReasons=BRAKE, clockEventsSince=iso(since_s)) if i == 1 else gpu(i) for i in range(8)]


def _status(kube: FakeKube, node: str) -> dict[str, Any]:
    return kube.reports[node].get("status") or {}


def _held(kube: FakeKube, node: str) -> bool:
    """gpuhealth keeps new work off the node or one of its GPUs."""
    spec = kube.nodes[node]["spec"]
    tainted = TAINT_KEY in {t["key"] for t in spec.get("taints") or []}
    rules = [r for r in kube.rules.values() if node in str(r)]
    return tainted or bool(spec.get("unschedulable")) or bool(rules)


async def _pass(rt: Runtime, nodes: tuple[str, ...]) -> None:
    for n in nodes:
        await rt.reconciler.reconcile(n)
    await rt.events.flush()


def _rack_gauge() -> float:
    return float(metrics.RACK_FINDINGS.labels("p", "rack-1", "RackPowerBrake")._value.get())


def _rack_fleet() -> FakeKube:
    kube = FakeKube()
    kube.add_policy("p", {"rules": {"powerBrake": {"sustainedFor": "2s"}}, "safety": {"maxUnhealthy": 8}})
    for n in RACK:
        kube.add_node(n, {RACK_LABEL: "rack-1"})
        kube.add_report(report_obj(name=n))
    return kube


def test_the_rack_brake_lifting_node_by_node_leaves_no_node_under_a_finding_of_its_own() -> None:
    kube, clock = _rack_fleet(), Clock()

    async def body() -> None:
        rt = await _runtime(kube, clock)
        await _pass(rt, RACK)
        for n in RACK[:3]:  # the rack's power shelf brakes three of its nodes at once
            _report(rt, kube, clock, n, _braked(0))
        await _pass(rt, RACK)
        assert all(_status(kube, n)["reason"] == "RackPowerBrake" for n in RACK[:3])
        # The brake lifts node by node: r1 first, then r2, below the rack's minNodes (3).
        clock.t += dt.timedelta(seconds=1)
        _report(rt, kube, clock, "r1", [gpu(i) for i in range(8)])
        await _pass(rt, RACK)
        clock.t += dt.timedelta(seconds=1)
        _report(rt, kube, clock, "r2", [gpu(i) for i in range(8)])
        await _pass(rt, RACK)
        assert _status(kube, "r0")["reason"] == "RackPowerBrake" and _status(kube, "r0")["state"] == "Degraded"
        assert "1 node (r0)" in _status(kube, "r0")["message"]
        assert _rack_gauge() == 1
        # A restarted operator finds the episode in what its predecessor wrote.
        rt = await _runtime(kube, clock)
        clock.t += dt.timedelta(seconds=5)
        _report(rt, kube, clock, "r0", _braked(0))
        await _pass(rt, RACK)
        assert _status(kube, "r0")["reason"] == "RackPowerBrake"
        # A node braked while the episode lasts is the rack's too, not held on its own.
        _report(rt, kube, clock, "r3", _braked(6))
        clock.t += dt.timedelta(seconds=3)
        for n in ("r0", "r3"):
            _report(rt, kube, clock, n, _braked(0 if n == "r0" else 6))
        await _pass(rt, RACK)
        assert _status(kube, "r3")["reason"] == "RackPowerBrake"
        assert all(_status(kube, n)["state"] == "Healthy" for n in ("r1", "r2"))
        # The last brakes lift: the episode is over.
        _report(rt, kube, clock, "r0", [gpu(i) for i in range(8)])
        _report(rt, kube, clock, "r3", [gpu(i) for i in range(8)])
        await _pass(rt, RACK)
        assert all(_status(kube, n)["state"] == "Healthy" for n in RACK)
        assert not any(_held(kube, n) for n in RACK)
        assert _rack_gauge() == 0  # the rack's alert stops with its episode
        assert not [r for n in RACK for r in kube.reasons(n) if r in ("Quarantined", "GPUQuarantined")]
        # A brake on one node after the episode is that node's own again.
        clock.t += dt.timedelta(seconds=10)
        _report(rt, kube, clock, "r2", _braked((clock.t - at(0)).total_seconds() - 3))
        await _pass(rt, RACK)
        assert "PowerBrake" in {e.get("signal") for e in _status(kube, "r2").get("evidence") or []}
        assert _held(kube, "r2")

    asyncio.run(body())


def _domain_fleet() -> FakeKube:
    kube = FakeKube()
    safety = {"maxUnhealthy": 4, "maxConcurrentDrains": 4, "probation": "10s"}
    kube.add_policy("p", {"safety": safety, "devices": {"scope": "Node"}})
    for n in DOMAIN:
        kube.add_node(n, {CLIQUE: "c0ffee.7"})
        devices = [gpu(i, recoveryAction="RecoverImexDomain") if (n, i) == ("d2", 3) else gpu(i) for i in range(8)]
        kube.add_report(report_obj(name=n, devices=devices))
    return kube


async def _out_then_clean(kube: FakeKube, clock: Clock) -> Runtime:
    """The domain out for its fault (drained: nothing runs on it), then the fault cleared on d2."""
    rt = await _runtime(kube, clock)
    for _ in range(3):
        await _pass(rt, DOMAIN)
    assert all(_status(kube, n)["state"] == "Quarantined" for n in DOMAIN), [_status(kube, n) for n in DOMAIN]
    _report(rt, kube, clock, "d2", [gpu(i) for i in range(8)])
    return rt


def test_a_domain_returns_as_one_when_its_members_probation_began_passes_apart() -> None:
    kube, clock = _domain_fleet(), Clock()

    async def body() -> None:
        rt = await _out_then_clean(kube, clock)
        await _pass(rt, DOMAIN[:3])
        assert all(_status(kube, n)["state"] == "Recovering" for n in DOMAIN[:3])
        clock.t += dt.timedelta(seconds=4)  # d3's pass after the fault cleared comes 4 s later
        for n in DOMAIN:
            _report(rt, kube, clock, n, [gpu(i) for i in range(8)])
        await _pass(rt, ("d3",))
        clock.t += dt.timedelta(seconds=7)  # past the first three's probation (10 s), not d3's
        for n in DOMAIN:
            _report(rt, kube, clock, n, [gpu(i) for i in range(8)])
        waits = [await rt.reconciler.reconcile(n) for n in DOMAIN]
        await rt.events.flush()
        assert all(_status(kube, n)["state"] == "Recovering" and _held(kube, n) for n in DOMAIN), [
            (_status(kube, n)["state"], _status(kube, n)["message"], _held(kube, n)) for n in DOMAIN
        ]
        assert "d3 not yet back" in _status(kube, "d0")["message"]
        assert waits[0] is not None and 2.9 <= waits[0] <= 3.5  # the next pass when d3's probation ends
        assert not [r for n in DOMAIN for r in kube.reasons(n) if r == "ReturnedToService"]
        clock.t += dt.timedelta(seconds=3)
        await _pass(rt, DOMAIN)
        assert all(_status(kube, n)["state"] == "Healthy" and not _held(kube, n) for n in DOMAIN)

    asyncio.run(body())


def test_a_domain_member_with_unknown_facts_holds_the_domains_return_even_across_a_restart() -> None:
    kube, clock = _domain_fleet(), Clock()

    async def body() -> None:
        rt = await _out_then_clean(kube, clock)
        await _pass(rt, DOMAIN)
        assert all(_status(kube, n)["state"] == "Recovering" for n in DOMAIN)
        # d1's agent falls silent (past spec.rules.agentSilence.after, 2m): its probation does not count.
        clock.t += dt.timedelta(seconds=130)
        for n in ("d0", "d2", "d3"):
            _report(rt, kube, clock, n, [gpu(i) for i in range(8)])
        await _pass(rt, ("d1", "d0", "d2", "d3"))
        assert _status(kube, "d1")["state"] == "Recovering" and not _status(kube, "d1").get("healthySince")
        assert all(_status(kube, n)["state"] == "Recovering" and _held(kube, n) for n in DOMAIN)
        rt = await _runtime(kube, clock)  # a restart: still waiting, from the written statuses alone
        await _pass(rt, DOMAIN)
        assert not [r for n in DOMAIN for r in kube.reasons(n) if r == "ReturnedToService"]
        # d1's agent is back: its probation runs, then the domain returns together.
        for n in DOMAIN:
            _report(rt, kube, clock, n, [gpu(i) for i in range(8)])
        await _pass(rt, DOMAIN)
        clock.t += dt.timedelta(seconds=10)
        for n in DOMAIN:
            _report(rt, kube, clock, n, [gpu(i) for i in range(8)])
        await _pass(rt, DOMAIN)
        assert all(_status(kube, n)["state"] == "Healthy" for n in DOMAIN)

    asyncio.run(body())
