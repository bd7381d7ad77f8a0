"""The controller's rooms (node reconciler, drainer, breaker, work queue, policy status) through the
Kube port, with an in-memory fake API and a fixed clock."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from gpuhealth.api import pods as P
from gpuhealth.api.timeutil import parse_time
from gpuhealth.controller.act import node_reconciler
from gpuhealth.controller.intake.workqueue import WorkQueue
from gpuhealth.controller.process.runtime import Runtime
from gpuhealth.controller.state.breaker import Breaker
from gpuhealth.controller.state.store import Store
from gpuhealth.evaluation import transitions
from gpuhealth.evaluation.transitions import Decision
from tests.unit.builders import at, report_obj, xid_event
from tests.unit.fake_kube import FakeKube, crash_looping_fleet

TAINT = "gpuhealth.dev/unhealthy"


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


async def runtime(kube: FakeKube, now: dt.datetime | None = None) -> Runtime:
    rt = Runtime(kube, clock=lambda: now or at(10), workers=1)
    await rt._load()
    await rt._list_pods()
    return rt


def faulty(name: str) -> dict[str, Any]:
    """A report with XID 79 (GPU fell off the bus): a drain-level fault."""
    return report_obj(name=name, xids=[xid_event(79, 1)])


def state(kube: FakeKube, name: str) -> str:
    return str(kube.reports[name].get("status", {}).get("state"))


def test_a_fault_is_recorded_before_the_node_is_tainted_and_announced_once() -> None:
    kube = FakeKube()
    kube.add_policy("p", {})
    kube.add_node("n1")
    kube.add_report(faulty("n1"))

    async def body() -> None:
        rt = await runtime(kube)
        await rt.reconciler.reconcile("n1")  # recorded, tainted, announced; the drain waits for the next pass
        await rt.reconciler.reconcile("n1")  # the empty node's drain completes
        await rt.reconciler.reconcile("n1")  # Quarantined, announced once
        await rt.events.flush()

    run(body)
    assert state(kube, "n1") == "Quarantined"
    node = kube.nodes["n1"]
    assert [t["key"] for t in node["spec"]["taints"]] == [TAINT] and node["spec"]["unschedulable"]
    writes = [w for _, w in kube.writes]
    assert writes.index("report/n1/status") < writes.index("node/n1")  # the decision is the write-ahead record
    assert kube.reasons("n1").count("Quarantined") == 1 and kube.reasons("n1").count("GPUHealthAction") == 1


def test_the_breaker_holds_back_without_deciding_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()
    kube.add_policy("p", {"safety": {"maxUnhealthy": 1}})
    for n in ("n1", "n2", "n3"):
        kube.add_node(n)
        kube.add_report(faulty(n))
    calls: list[str] = []
    real = transitions.decide

    def counting(*args: Any, **kw: Any) -> Decision:
        calls.append("decide")
        return real(*args, **kw)

    monkeypatch.setattr(node_reconciler, "decide", counting)

    async def body() -> None:
        rt = await runtime(kube)
        await asyncio.gather(*(rt.reconciler.reconcile(n) for n in ("n1", "n2", "n3")))
        await rt.events.flush()

    run(body)
    assert len(calls) == 3
    states = sorted(state(kube, n) for n in ("n1", "n2", "n3"))
    held = [n for n in ("n1", "n2", "n3") if kube.reports[n]["status"].get("heldByBreaker")]
    assert len(held) == 2 and states.count("Degraded") == 2
    assert all(TAINT not in str(kube.nodes[n]["spec"].get("taints")) for n in held)
    assert sum(kube.reasons(n).count("QuarantineHeldBack") for n in held) == 2


def test_the_breaker_never_admits_past_the_limit() -> None:
    store = Store()
    store.put_policy("p", {"metadata": {"name": "p"}, "spec": {"safety": {"maxUnhealthy": "30%"}}})
    names = [f"n{i}" for i in range(10)]
    for n in names:
        store.put_node(n, {"metadata": {"name": n, "labels": {}}})
    policy = store.policies["p"]
    breaker = Breaker(store)

    async def body() -> None:
        admitted = await asyncio.gather(*(breaker.admit(policy, n) for n in names))
        assert sum(admitted) == 3  # 30% of 10
        assert not await breaker.admit(policy, "n9")
        first = names[admitted.index(True)]
        breaker.release(policy, first)  # written, or failed: the slot is free again
        assert await breaker.admit(policy, "n9")

    run(body)


def test_a_drain_evicts_only_after_the_checkpoint_is_acknowledged() -> None:
    kube = FakeKube()
    kube.add_policy("p", {})
    kube.add_node("n1")
    kube.add_report(faulty("n1"))
    kube.add_pod("ml", "trainer", "n1", {P.CHECKPOINT_MODE: "annotation"})
    now = [at(10)]

    async def body() -> None:
        rt = Runtime(kube, clock=lambda: now[0], workers=1)
        await rt._load()
        await rt._list_pods()
        again = await rt.reconciler.reconcile("n1")
        # Protection first: this pass tainted the node and asks for it again; the drain starts on the next.
        assert state(kube, "n1") == "Draining" and kube.nodes["n1"]["spec"]["taints"] and again == 0.05
        assert ("patch", "pod/ml/trainer") not in kube.writes
        await rt.reconciler.reconcile("n1")
        pod = kube.pods["ml", "trainer"]
        requested = pod["metadata"]["annotations"].get(P.CHECKPOINT_REQUESTED)
        assert requested and ("evict", "pod/ml/trainer") not in kube.writes
        await rt.reconciler.reconcile("n1")  # not acknowledged yet: keep waiting, never ask twice
        assert ("evict", "pod/ml/trainer") not in kube.writes
        assert kube.writes.count(("patch", "pod/ml/trainer")) == 1
        # The workload saves its state and says so; the pod watch delivers the change.
        pod["metadata"]["annotations"][P.CHECKPOINT_COMPLETED] = "2025-01-01T12:00:20Z"
        rt.on_pod("MODIFIED", pod, enqueue=False)
        now[0] = at(30)
        await rt.reconciler.reconcile("n1")
        assert kube.writes.count(("evict", "pod/ml/trainer")) == 1
        await rt.events.flush()

    run(body)
    assert kube.reasons("n1").count("CheckpointRequested") == 1 and kube.reasons("n1").count("Evicted") == 1
    drain = kube.reports["n1"]["status"]["drain"]
    assert drain["pods"]["uid-ml-trainer"]["evictedAt"] and drain["pods"]["uid-ml-trainer"]["acknowledgedAt"]


def test_a_budget_refusal_is_retried_later_not_in_a_loop() -> None:
    kube = FakeKube()
    kube.add_policy("p", {"actions": {"drain": {"checkpointMode": "none"}}})
    kube.add_node("n1")
    kube.add_report(faulty("n1"))  # fatal: evict at once
    kube.add_pod("ml", "web", "n1")
    kube.refuse_evictions["web"] = 429

    async def body() -> None:
        rt = await runtime(kube)
        await rt.reconciler.reconcile("n1")
        again = await rt.reconciler.reconcile("n1")  # the refusal: retried 2 s later, per the record
        pod = kube.reports["n1"]["status"]["drain"]["pods"]["uid-ml-web"]
        assert parse_time(pod["retryAt"]) == at(10) + dt.timedelta(seconds=2)
        assert again == 1.0  # the drain's next pass comes, and sends nothing before retryAt
        await rt.reconciler.reconcile("n1")
        await rt.events.flush()

    run(body)
    assert kube.writes.count(("evict", "pod/ml/web")) == 1
    assert kube.reasons("n1").count("EvictionBlocked") == 1
    assert kube.reports["n1"]["status"]["drain"]["pods"]["uid-ml-web"]["blocked"] == 1


def test_policy_status_is_patched_once_per_change() -> None:
    kube = FakeKube()
    kube.add_policy("p", {})
    kube.add_node("n1")
    kube.add_report(report_obj(name="n1"))

    async def body() -> None:
        rt = await runtime(kube)
        await rt.reconciler.reconcile("n1")
        await rt.policy_status.update()
        await rt.policy_status.update()
        assert kube.writes.count(("patch", "policy/p/status")) == 1
        assert kube.policies["p"]["status"]["healthy"] == 1
        kube.add_node("n2")
        rt.on_node("ADDED", kube.get_node("n2"), enqueue=False)
        await rt.policy_status.update()
        await rt.policy_status.update()
        assert kube.writes.count(("patch", "policy/p/status")) == 2
        assert kube.policies["p"]["status"]["nodes"] == 2

    run(body)


def test_the_work_queue_processes_a_key_once_at_a_time_and_again_if_it_changed() -> None:
    async def body() -> None:
        q = WorkQueue()
        q.add("a")
        q.add("a")
        q.add("b")
        assert await q.get() == "a"
        q.add("a")  # changed while being processed: once more afterwards, not concurrently
        assert await q.get() == "b"
        q.done("b")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(q.get(), 0.05)
        q.done("a")
        assert await asyncio.wait_for(q.get(), 1) == "a"
        q.done("a")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(q.get(), 0.05)

    run(body)


def test_crash_looping_pods_leave_a_quarantined_node_through_the_one_eviction_path() -> None:
    kube = crash_looping_fleet()
    stale = [copy.deepcopy(kube.pods["apps", f"{app}-n1"]) for app in ("svc-a", "svc-b")]

    async def body() -> None:
        rt = await runtime(kube)
        evict = kube.evict_pod

        def evict_while_a_watch_event_lands(
            namespace: str, name: str, uid: str | None, resource_version: str | None = None
        ) -> None:
            # A watch event already on its way replaces the cached pod with its pre-eviction self.
            (pod,) = [p for p in stale if p["metadata"]["name"] == name]
            rt.store.pods.put(copy.deepcopy(pod))
            evict(namespace, name, uid, resource_version)

        kube.evict_pod = evict_while_a_watch_event_lands  # type: ignore[method-assign]
        await rt.reconciler.reconcile("n1")
        await rt.reconciler.reconcile("n1")  # not evicted (nor announced) twice
        await rt.events.flush()

    run(body)
    assert state(kube, "n1") == "Quarantined"
    assert sorted(w for v, w in kube.writes if v == "evict") == ["pod/apps/svc-a-n1", "pod/apps/svc-b-n1"]
    assert kube.reasons("n1").count("EvictedCrashLooping") == 2


def test_urgent_keys_are_handed_out_first_and_a_waiting_key_is_promoted() -> None:
    async def body() -> None:
        q = WorkQueue()
        for k in ("silent-1", "silent-2", "faulty", "silent-3"):
            q.add(k)
        q.add("fresh", urgent=True)
        q.add("faulty", urgent=True)  # already waiting: promoted, not queued twice
        got = [await q.get() for _ in range(5)]
        assert got == ["fresh", "faulty", "silent-1", "silent-2", "silent-3"]
        for k in got:
            q.done(k)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(q.get(), 0.05)  # the promoted key's old place was skipped

    run(body)


def test_an_urgent_key_being_processed_waits_for_its_worker_then_goes_first() -> None:
    async def body() -> None:
        q = WorkQueue()
        q.add("a")
        assert await q.get() == "a"
        q.add("b")
        q.add("a", urgent=True)  # changed while being processed: not handed to a second worker
        assert await q.get() == "b"
        q.add("c")
        q.done("a")
        assert await q.get() == "a"  # once its worker is done, ahead of "c"
        assert await q.get() == "c"

    run(body)


def test_new_facts_from_an_agent_are_queued_urgent_and_our_own_status_echo_is_not() -> None:
    kube = FakeKube()
    kube.add_policy("p", {})
    for n in ("n1", "n2"):
        kube.add_node(n)
        kube.add_report(report_obj(name=n))

    async def body() -> None:
        rt = await runtime(kube)
        rt.queue = rt.feeders.queue = WorkQueue()
        changed = copy.deepcopy(kube.nodes["n1"])
        changed["spec"]["unschedulable"] = True  # a Node change (someone cordoned it): queued, not urgent
        rt.on_node("MODIFIED", changed)
        echo = copy.deepcopy(rt.store.reports["n2"])
        echo["status"] = {"state": "Healthy"}
        rt.on_report("MODIFIED", echo)  # our own status write: same spec, no news
        assert rt.queue._dirty == {"n1": False, "n2": False}
        news = report_obj(name="n2", heartbeat=5)
        news["metadata"]["generation"] = int(echo["metadata"].get("generation") or 1) + 1  # a spec write
        rt.on_report("MODIFIED", news)  # the agent wrote again
        assert rt.queue._dirty == {"n1": False, "n2": True}
        assert await rt.queue.get() == "n2"

    run(body)


def test_a_release_an_sre_asks_for_is_queued_ahead_of_the_backlog() -> None:
    from gpuhealth.api.names import RELEASE_ANNOTATION, RELEASE_GPU_ANNOTATION

    kube = FakeKube()
    kube.add_policy("p", {})
    for n in ("silent", "whole", "gpus"):
        kube.add_node(n)
        kube.add_report(report_obj(name=n))

    async def body() -> None:
        rt = await runtime(kube)
        rt.queue = rt.feeders.queue = WorkQueue()
        cordoned = copy.deepcopy(kube.nodes["silent"])
        cordoned["spec"]["unschedulable"] = True
        rt.on_node("MODIFIED", cordoned)  # a change, nothing asked: in line
        for name, key in (("whole", RELEASE_ANNOTATION), ("gpus", RELEASE_GPU_ANNOTATION)):
            asked = copy.deepcopy(kube.nodes[name])
            asked["metadata"].setdefault("annotations", {})[key] = "2026-12-01T00:00:00Z"
            rt.on_node("MODIFIED", asked)
        assert rt.queue._dirty == {"silent": False, "whole": True, "gpus": True}
        assert [await rt.queue.get() for _ in range(3)] == ["whole", "gpus", "silent"]
        for k in ("whole", "gpus", "silent"):
            rt.queue.done(k)
        again = copy.deepcopy(rt.store.nodes["whole"])
        again["metadata"]["resourceVersion"] = "999"
        rt.on_node("MODIFIED", again)  # the same release seen again: no news, and nothing a pass reads changed
        assert rt.queue._dirty == {}

    run(body)


def test_a_probation_ending_is_queued_ahead_of_silent_nodes() -> None:
    from gpuhealth.api.names import State
    from gpuhealth.api.status import Record

    kube = FakeKube()
    kube.add_policy("p", {})
    for n in ("silent", "probation"):
        kube.add_node(n)
        kube.add_report(report_obj(name=n, heartbeat=-3600))  # an hour old: the agent is silent

    async def body() -> None:
        rt = await runtime(kube)
        rt.queue = rt.feeders.queue = WorkQueue()
        rt.store.set_record("silent", Record(state=State.HEALTHY))
        rt.store.set_record("probation", Record(state=State.RECOVERING))
        rt.sweep()
        assert rt.queue._dirty == {"silent": False, "probation": True}
        assert await rt.queue.get() == "probation"

    run(body)
