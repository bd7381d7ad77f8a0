"""A gang spanning several draining nodes is evicted by each of their drains, concurrently: each pod
must still get one Eviction (issue #26's drain storm found every cross-node rank evicted twice)."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from typing import Any, TypeVar, TypeVarTuple

from kubernetes.client.rest import ApiException

from gpuhealth.api.status import PodDrain, StoredStatus
from gpuhealth.controller.act.drainer import Drainer
from gpuhealth.drain.plan import Step
from gpuhealth.kube.aio import AsyncKube
from tests.unit.fake_kube import InlineExecutor

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


class _Kube:
    def __init__(self, refuse: int | None = None) -> None:
        self.evictions: list[str] = []
        self.refuse = refuse

    def evict_pod(self, namespace: str, name: str, uid: str | None, resource_version: str | None = None) -> None:
        self.evictions.append(name)
        if self.refuse:
            raise ApiException(status=self.refuse)


class _Port(AsyncKube):
    """The async port over the fake: each request is in flight for one turn of the loop, so the other
    drain runs meanwhile."""

    def __init__(self, kube: Any) -> None:
        super().__init__(kube, InlineExecutor())

    async def run(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        await asyncio.sleep(0)
        return fn(*args)


def _drainer(kube: _Kube) -> Drainer:
    return Drainer(kube=_Port(kube), events=lambda *a: None, store=None, breaker=None, clock=lambda: NOW)  # type: ignore[arg-type]


def _pod(name: str, node: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"}, "spec": {"nodeName": node}}


def test_two_drains_of_one_gang_evict_each_rank_once() -> None:
    kube = _Kube()
    d = _drainer(kube)
    ranks = [_pod("rank-0", "a"), _pod("rank-1", "b")]
    recs = {n: [PodDrain(), PodDrain()] for n in ("a", "b")}

    async def drain(node: str) -> list[bool]:
        return [
            await d._evict(node, Step("evict", p, "checkpoint acknowledged"), recs[node][i], NOW)
            for i, p in enumerate(ranks)
        ]

    async def both() -> list[list[bool]]:
        return list(await asyncio.gather(drain("a"), drain("b")))

    assert asyncio.run(both()) == [[True, True], [True, True]]
    assert sorted(kube.evictions) == ["rank-0", "rank-1"]
    assert all(r.get("evictedAt") for rs in recs.values() for r in rs)


def test_a_refused_eviction_is_not_remembered() -> None:
    kube = _Kube(refuse=429)
    d = _drainer(kube)
    pod = _pod("web-0", "a")
    prec = PodDrain()
    assert not asyncio.run(d._evict("a", Step("evict", pod, "draining"), prec, NOW))
    kube.refuse = None
    prec.pop("retryAt", None)
    assert asyncio.run(d._evict("a", Step("evict", pod, "draining"), prec, NOW))
    assert kube.evictions == ["web-0", "web-0"]  # the budget refused the first; the retry is sent


class _Store:
    def __init__(self, reports: dict[str, Any]) -> None:
        self.reports = reports

    def status(self, name: str) -> StoredStatus:
        return StoredStatus.of(self.reports.get(name))


def test_the_running_drains_of_a_gangs_other_nodes_are_found() -> None:
    gang = {"jobset.sigs.k8s.io/jobset-name": "js"}
    ranks = [_pod("r0", "a"), _pod("r1", "b"), _pod("r2", "c"), _pod("solo", "a")]
    for r in ranks[:3]:
        r["metadata"]["labels"] = gang
    reports = {
        "b": {"status": {"drain": {"phase": "Running", "startedAt": "2026-12-01T11:59:50Z"}}},
        "c": {"status": {"drain": {"phase": "Completed", "startedAt": "2026-12-01T11:00:00Z"}}},
    }
    kube: Any = _Kube()
    store: Any = _Store(reports)
    d = Drainer(kube=_Port(kube), events=lambda *a: None, store=store, breaker=None, clock=lambda: NOW)  # type: ignore[arg-type]
    found = d._gang_drains("a", [ranks[0], ranks[3]], {"ml/jobset.sigs.k8s.io/jobset-name=js": ranks[:3]})
    assert found == {"b": dt.datetime(2026, 12, 1, 11, 59, 50, tzinfo=dt.UTC)}  # c's drain is over


def test_a_drains_steps_run_at_once_bounded_and_on_the_step_pool() -> None:
    """Fifteen evictions of one node go out together (at most ``parallel``), through the step port."""
    from gpuhealth.drain.plan import DrainPlan

    kube = _Kube()
    in_flight, peak, via = 0, 0, []

    class Steps(_Port):
        async def run(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
            nonlocal in_flight, peak
            via.append(getattr(fn, "__name__", ""))
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.01)
            in_flight -= 1
            return fn(*args)

    class Reconciles(_Port):
        async def run(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
            raise AssertionError("drain steps must not use the reconcile pool")

    none: Any = None
    d = Drainer(
        kube=Reconciles(kube),
        events=lambda *a: None,
        store=none,
        breaker=none,
        clock=lambda: NOW,
        steps=Steps(kube),
        parallel=4,
    )
    plan = DrainPlan(steps=[Step("evict", _pod(f"p{i}", "a"), "draining") for i in range(15)])
    record = asyncio.run(d.execute("a", plan, NOW))
    assert sorted(kube.evictions) == sorted(f"p{i}" for i in range(15))
    assert peak == 4 and set(via) == {"evict_pod"}
    assert all(r.get("evictedAt") for r in (record.get("pods") or {}).values())
    assert len(record.get("pods") or {}) == 15


def test_one_failed_step_does_not_stop_the_others_and_is_raised() -> None:
    from gpuhealth.drain.plan import DrainPlan

    class _Flaky(_Kube):
        def evict_pod(self, namespace: str, name: str, uid: str | None, resource_version: str | None = None) -> None:
            self.evictions.append(name)
            if name == "p1":
                raise ApiException(status=403)

    kube = _Flaky()
    d = _drainer(kube)
    plan = DrainPlan(steps=[Step("evict", _pod(f"p{i}", "a"), "draining") for i in range(3)])
    try:
        asyncio.run(d.execute("a", plan, NOW))
    except ApiException as e:
        assert e.status == 403
    else:
        raise AssertionError("the 403 must be raised")
    assert sorted(kube.evictions) == ["p0", "p1", "p2"]
    # The retry evicts only the pod that was refused: the others' evictions are remembered.
    kube.evictions.clear()
    _Flaky.evict_pod = _Kube.evict_pod  # type: ignore[method-assign]
    record = asyncio.run(d.execute("a", plan, NOW + dt.timedelta(seconds=1)))
    assert kube.evictions == ["p1"]
    assert sorted(k for k, v in (record.get("pods") or {}).items() if v.get("evictedAt")) == [
        "uid-p0",
        "uid-p1",
        "uid-p2",
    ]


def test_a_second_replica_planning_from_the_pod_before_its_eviction_does_not_evict_it_again() -> None:
    """Kopf peering is not a lock: for a moment two replicas may both act (the 10,000-node drain storm
    saw it). Each remembers only its own evictions, so the eviction carries the resourceVersion it was
    planned from, and the API server's 409 for a pod changed since stops the second one."""

    class _Server(_Kube):
        def __init__(self) -> None:
            super().__init__()
            self.rv = {"p": "7"}

        def evict_pod(self, namespace: str, name: str, uid: str | None, resource_version: str | None = None) -> None:
            if resource_version is not None and resource_version != self.rv[name]:
                raise ApiException(status=409)
            self.evictions.append(name)
            self.rv[name] = str(int(self.rv[name]) + 1)  # the graceful deletion is a write

    kube = _Server()
    pod = {**_pod("p", "a"), "metadata": {**_pod("p", "a")["metadata"], "resourceVersion": "7"}}
    first, second = _drainer(kube), _drainer(kube)  # two replicas, each with its own memory
    rec_a, rec_b = PodDrain(), PodDrain()

    async def both() -> list[bool]:
        a = await first._evict("a", Step("evict", pod, "draining"), rec_a, NOW)
        b = await second._evict("a", Step("evict", pod, "draining"), rec_b, NOW)  # its cache is behind
        return [a, b]

    assert asyncio.run(both()) == [True, False]
    assert kube.evictions == ["p"]
    assert rec_a.get("evictedAt") and not rec_b.get("evictedAt") and not rec_b.get("retryAt")


def test_execution_updates_a_copy_never_the_plans_record_or_what_it_was_read_from() -> None:
    """The plan's record shares nothing with the record the steps update: a status read from the
    cache (``read_drain`` copies only the top level) must not change under the cache's feet."""
    import copy

    from gpuhealth.api.status import DrainRecord
    from gpuhealth.drain.plan import DrainPlan

    cached = DrainRecord(
        phase="Running",
        startedAt="2026-12-01T11:59:00Z",
        pods={"uid-p0": PodDrain(pod="ml/p0", node="a")},
        workloads={"ml/wl": {"workload": "ml/wl", "uid": "w1"}},
    )
    before = copy.deepcopy(cached)
    plan = DrainPlan(steps=[Step("evict", _pod("p0", "a"), "draining")], record=DrainRecord(**cached))
    record = asyncio.run(_drainer(_Kube()).execute("a", plan, NOW))
    assert record["pods"]["uid-p0"].get("evictedAt")
    assert cached == before and plan.record == before
    assert record["workloads"] == before["workloads"] and record["workloads"] is not cached["workloads"]
