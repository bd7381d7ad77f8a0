"""A start-up that acts on the fleet before its pods are listed (``runtime._list_pods``): a new fault is
tainted at once, its drain waits for the pods, and a quarantine the pods justify is never touched
while they are missing. Through the in-memory Kube port; the real start-up is timed by `make bench`
(warm restart) and exercised on the real control plane by the integration suite."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from gpuhealth.api import pods as P
from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import at, report_obj, xid_event
from tests.unit.fake_kube import FakeKube, crash_looping_fleet

TAINT = "gpuhealth.dev/unhealthy"


def _taints(kube: FakeKube, name: str) -> list[str]:
    return [t["key"] for t in kube.nodes[name]["spec"].get("taints") or []]


def quarantined_for_a_loop() -> FakeKube:
    """The crash-looping fleet after a first operator, with its pods, quarantined n1 for the loop."""
    kube = crash_looping_fleet()

    async def first_operator() -> None:
        rt = Runtime(kube, clock=lambda: at(10), workers=1)
        await rt._load()
        await rt._list_pods()
        await rt.reconciler.reconcile("n1")
        await rt.events.flush()

    asyncio.run(first_operator())
    return kube


def test_a_new_fault_is_tainted_before_the_pods_are_in_and_drained_after() -> None:
    kube = FakeKube()
    kube.add_policy("p", {"actions": {"drain": {"checkpointMode": "none"}}})
    kube.add_node("n1")
    kube.add_report(report_obj(name="n1", xids=[xid_event(79, 1)]))
    kube.add_pod("ml", "trainer", "n1", {P.CHECKPOINT_MODE: "none"})

    async def body() -> None:
        rt = Runtime(kube, clock=lambda: at(10), workers=1)
        rt.store.pods.expect()
        await rt._load()
        assert await rt.queue.get() == "n1"  # the start-up queues the fleet: this is n1's first pass
        rt.queue.done("n1")
        await rt.reconciler.reconcile("n1")
        assert _taints(kube, "n1") == [TAINT]
        assert kube.reports["n1"]["status"]["state"] == "Draining"
        # Draining with no pod known would call the drain complete: it waits for the list instead.
        assert await rt.reconciler.reconcile("n1") is None
        assert ("evict", "pod/ml/trainer") not in kube.writes
        assert kube.reports["n1"]["status"].get("drain") is None
        await rt._list_pods()
        assert not rt.store.pods.pending
        assert await asyncio.wait_for(rt.queue.get(), 1) == "n1"  # every node again, with its pods
        await rt.reconciler.reconcile("n1")
        assert kube.writes.count(("evict", "pod/ml/trainer")) == 1
        await rt.events.flush()

    asyncio.run(body())


def test_a_quarantine_only_the_pods_justify_is_left_alone_until_they_are_in() -> None:
    kube = quarantined_for_a_loop()
    assert kube.reports["n1"]["status"]["state"] in ("Quarantined", "Draining") and _taints(kube, "n1") == [TAINT]
    status, node = copy.deepcopy(kube.reports["n1"]["status"]), copy.deepcopy(kube.nodes["n1"])
    writes = len(kube.writes)

    async def restarted() -> Any:
        rt = Runtime(kube, clock=lambda: at(20), workers=1)
        rt.store.pods.expect()
        await rt._load()
        # Without the pods the loop is not seen and the facts are clean: deciding on that would
        # start the node's way back. Nothing is written until the pods are in.
        for _ in range(3):
            assert await rt.reconciler.reconcile("n1") is None
        assert len(kube.writes) == writes and kube.reports["n1"]["status"] == status and kube.nodes["n1"] == node
        await rt._list_pods()
        await rt.reconciler.reconcile("n1")
        await rt.events.flush()
        return rt

    asyncio.run(restarted())
    assert kube.reports["n1"]["status"]["state"] in ("Quarantined", "Draining") and _taints(kube, "n1") == [TAINT]


def test_a_fleet_never_evaluated_gets_its_first_verdicts_before_the_pods_are_in() -> None:
    # Two healthy nodes and one whose pods alone show a restart loop: none was ever evaluated.
    kube = crash_looping_fleet()

    async def body() -> None:
        rt = Runtime(kube, clock=lambda: at(10), workers=1)
        rt.store.pods.expect()
        await rt._load()
        for n in ("n1", "n2", "n3"):
            before = len(kube.writes)
            await rt.reconciler.reconcile(n)
            # Its first verdict, with the Node's label and condition, while the pods are still listed:
            # two writes, the report's status and one Node status write carrying the label with it.
            assert kube.writes[before:] == [("patch", f"report/{n}/status"), ("patch", f"node/{n}/status")]
            assert kube.reports[n]["status"]["state"] == "Healthy"
            assert kube.nodes[n]["metadata"]["labels"]["gpuhealth.dev/state"] == "Healthy"
            assert any(c["type"] == "GPUHealthy" for c in kube.nodes[n]["status"]["conditions"])
        writes = len(kube.writes)
        # The node is evaluated now: another pass before the pods writes nothing.
        assert await rt.reconciler.reconcile("n2") is None and len(kube.writes) == writes
        await rt._list_pods()
        # The pod list's pass corrects the one verdict the pods change, and only that one.
        for n in ("n1", "n2", "n3"):
            await rt.reconciler.reconcile(n)
        await rt.events.flush()
        assert kube.reports["n1"]["status"]["state"] in ("Quarantined", "Draining") and _taints(kube, "n1") == [TAINT]
        assert kube.reports["n2"]["status"]["state"] == "Healthy" and not _taints(kube, "n2")

    asyncio.run(body())


def test_a_quarantined_node_whose_status_was_lost_waits_for_the_pods() -> None:
    # Quarantined for a restart loop, then its report's status lost (the report recreated): its taint
    # is on the Node, so it is not a node gpuhealth never evaluated, and nothing is lifted without the pods.
    kube = quarantined_for_a_loop()
    assert _taints(kube, "n1") == [TAINT]
    del kube.reports["n1"]["status"]
    node = copy.deepcopy(kube.nodes["n1"])
    writes = len(kube.writes)

    async def restarted() -> None:
        rt = Runtime(kube, clock=lambda: at(20), workers=1)
        rt.store.pods.expect()
        await rt._load()
        assert await rt.reconciler.reconcile("n1") is None
        assert len(kube.writes) == writes and kube.nodes["n1"] == node and "status" not in kube.reports["n1"]
        await rt._list_pods()
        await rt.reconciler.reconcile("n1")
        await rt.events.flush()

    asyncio.run(restarted())
    assert _taints(kube, "n1") == [TAINT]
