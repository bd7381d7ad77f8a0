"""Node Lease renewals as the agents' heartbeat: freshness by the operator's clock, no reconcile and
no write for a renewal that changes nothing, silence still detected, Unknown left on a renewal."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from gpuhealth.controller import metrics
from gpuhealth.controller.intake.objectwatch import ObjectWatch
from gpuhealth.controller.process.runtime import Runtime
from gpuhealth.controller.state.slim import slim_lease
from gpuhealth.evaluation.freshness import Seen, latest, observe_lease
from tests.unit.builders import at, iso, report_obj
from tests.unit.fake_kube import FakeKube


def lease(name: str, renewed: float, uid: str = "l-uid", rv: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "gpuhealth-system", "uid": uid, "resourceVersion": rv},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 120, "renewTime": iso(renewed)},
    }


def test_a_renewal_counts_when_the_operator_sees_it_not_by_the_agents_clock() -> None:
    live = observe_lease(None, lease("n1", renewed=500), at(10), live=True)
    assert live is not None and live.at == at(10)
    # Listed at start-up without the server's time of the renewal: its renewTime, never in the
    # future, and none at all where it is further ahead than latency explains (a broken clock).
    assert (listed := observe_lease(None, lease("n1", renewed=5), at(10), live=False)) and listed.at == at(5)
    assert (future := observe_lease(None, lease("n1", renewed=100), at(10), live=False)) and future.at == at(10)
    assert (broken := observe_lease(None, lease("n1", renewed=900), at(10), live=False)) and broken.at is None
    # The same renewal seen again (a relist), or a Lease without one: nothing new.
    assert observe_lease(live, lease("n1", renewed=500, rv="2"), at(20), live=True) is live
    assert observe_lease(live, {"metadata": {"name": "n1"}, "spec": {}}, at(20), live=True) is live
    assert latest(None, live, Seen(("u", 1), at(3))) is live and latest(None, None) is None


def renewal_entry(written: float, subresource: str | None = None) -> dict[str, Any]:
    """The managedFields entry the API server keeps for the agent's renewals (its own clock)."""
    e = {
        "manager": "gpuhealth-agent",
        "operation": "Update",
        "time": iso(written),
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:holderIdentity": {}, "f:renewTime": {}}},
    }
    return {**e, "subresource": subresource} if subresource else e


def test_a_listed_lease_counts_from_the_servers_time_of_its_renewal() -> None:
    broken = {"metadata": {**lease("n1", 1)["metadata"], "managedFields": [renewal_entry(5)]}}
    body = {**lease("n1", 1), **broken}
    body["spec"] = {**body["spec"], "renewTime": "2099-01-01T00:00:00.000000Z"}
    assert (listed := observe_lease(None, body, at(600), live=False)) and listed.at == at(5)
    assert (same := observe_lease(None, slim_lease(body), at(600), live=False)) and same.at == at(5)
    # A renewTime an hour behind, renewed two seconds ago by the server's clock: a live agent.
    behind = {**body, "metadata": {**body["metadata"], "managedFields": [renewal_entry(598)]}}
    behind["spec"] = {**body["spec"], "renewTime": iso(-3000)}
    assert (live := observe_lease(None, behind, at(600), live=False)) and live.at == at(598)
    # An entry of a subresource is not a renewal.
    other = {**body, "metadata": {**body["metadata"], "managedFields": [renewal_entry(5, "status")]}}
    assert (undated := observe_lease(None, other, at(600), live=False)) and undated.at is None


def test_slim_lease_keeps_only_what_freshness_reads() -> None:
    body = {**lease("n1", 1), "metadata": {**lease("n1", 1)["metadata"], "managedFields": [{"x": 1}]}}
    slim = slim_lease(body)
    assert slim == {
        "metadata": {"name": "n1", "uid": "l-uid", "resourceVersion": "1"},
        "spec": {"renewTime": iso(1)},
    }
    body["metadata"]["managedFields"] = [renewal_entry(1), {"manager": "other", "fieldsV1": {"f:metadata": {}}}]
    assert slim_lease(body) == {
        "metadata": {"name": "n1", "uid": "l-uid", "resourceVersion": "1", "writtenAt": iso(1)},
        "spec": {"renewTime": iso(1)},
    }


class Clock:
    def __init__(self) -> None:
        self.now = at(0)

    def __call__(self) -> dt.datetime:
        return self.now


def queued(rt: Runtime) -> set[str]:
    return set(rt.queue._dirty)


def test_renewals_cost_no_reconcile_and_silence_is_still_detected() -> None:
    kube = FakeKube()
    kube.add_policy("p", {"rules": {"agentSilence": {"after": "60s"}}})
    kube.add_node("n1")
    kube.add_report(report_obj(name="n1", heartbeat=0))
    kube.leases["n1"] = lease("n1", renewed=0)
    clock = Clock()

    async def body() -> None:
        rt = Runtime(kube, clock=clock, workers=1, lease_namespace="gpuhealth-system")
        assert isinstance(rt.lease_watch, ObjectWatch) and rt.lease_watch.kind == "leases"
        await rt._load()
        await rt._list_pods()
        await rt.reconciler.reconcile("n1")
        assert kube.reports["n1"]["status"]["state"] == "Healthy"
        rt.queue._dirty.clear()
        writes = len(kube.writes)
        renewals = metrics.LEASE_RENEWALS._value.get()
        woken = metrics.LEASE_RECONCILES._value.get()

        # Heartbeats every 30 s for four minutes, the report never changing: no reconcile, no write.
        for t in range(30, 241, 30):
            clock.now = at(t)
            rt.on_lease("MODIFIED", slim_lease(lease("n1", renewed=t, rv=str(t))))
            rt.sweep()
            assert queued(rt) == set(), f"a renewal at {t}s queued the node"
        assert len(kube.writes) == writes
        assert metrics.LEASE_RENEWALS._value.get() - renewals == 8
        assert metrics.LEASE_RECONCILES._value.get() == woken

        # The agent dies: no renewal. Within the silence period nothing happens; past it the sweep
        # queues the node and it becomes Unknown.
        clock.now = at(240 + 59)
        rt.sweep()
        assert queued(rt) == set()
        clock.now = at(240 + 61)
        rt.sweep()
        assert queued(rt) == {"n1"}
        rt.queue._dirty.clear()
        await rt.reconciler.reconcile("n1")
        assert kube.reports["n1"]["status"]["state"] == "Unknown"

        # It comes back (a renewal only, no report write): an Unknown node is queued and leaves Unknown.
        clock.now = at(400)
        rt.on_lease("MODIFIED", slim_lease(lease("n1", renewed=400, rv="400")))
        assert queued(rt) == {"n1"} and metrics.LEASE_RECONCILES._value.get() == woken + 1
        await rt.reconciler.reconcile("n1")
        assert kube.reports["n1"]["status"]["state"] == "Healthy"
        await rt.events.flush()

    asyncio.run(body())


def test_a_lease_listed_at_start_keeps_a_node_with_an_old_report_fresh() -> None:
    """The report was written an hour ago (no fact changed since); the Lease was renewed just now."""
    kube = FakeKube()
    kube.add_policy("p", {"rules": {"agentSilence": {"after": "60s"}}})
    kube.add_node("n1")
    kube.add_report(report_obj(name="n1", heartbeat=0))
    kube.leases["n1"] = lease("n1", renewed=3590)
    clock = Clock()
    clock.now = at(3600)

    async def body() -> None:
        rt = Runtime(kube, clock=clock, workers=1, lease_namespace="gpuhealth-system")
        await rt._load()
        await rt._list_pods()
        await rt.reconciler.reconcile("n1")
        assert kube.reports["n1"]["status"]["state"] == "Healthy"
        # Without the Lease the same report is silent.
        plain = FakeKube()
        plain.add_policy("p", {"rules": {"agentSilence": {"after": "60s"}}})
        plain.add_node("n1")
        plain.add_report(report_obj(name="n1", heartbeat=0))
        rt2 = Runtime(plain, clock=clock, workers=1)
        assert rt2.lease_watch is None
        await rt2._load()
        await rt2._list_pods()
        await rt2.reconciler.reconcile("n1")
        assert plain.reports["n1"]["status"]["state"] == "Unknown"
        await rt.events.flush()
        await rt2.events.flush()

    asyncio.run(body())
