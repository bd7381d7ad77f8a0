"""The start-up's queue: the freshest reports first, and workers that let the loop in between passes
(a fleet-wide backlog of passes that write nothing must not hold up the watches' events)."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuhealth.controller.process.runtime import Runtime
from gpuhealth.controller.state.store import Store
from gpuhealth.evaluation.freshness import WRITTEN_AT
from tests.unit.builders import at, report_obj
from tests.unit.fake_kube import FakeKube


def test_the_nodes_whose_agents_wrote_last_come_first() -> None:
    store = Store()
    written = {"a": "2026-12-02T10:00:00Z", "b": "2026-12-02T10:05:00Z", "c": None, "d": "2026-12-02T10:01:00Z"}
    for name, when in written.items():
        store.put_node(name, {"metadata": {"name": name, "labels": {}}})
        meta: dict[str, Any] = {"name": name, "uid": f"u-{name}", "generation": 1}
        if when:
            meta[WRITTEN_AT] = when
        store.put_report(name, {"metadata": meta, "spec": {}})
    assert store.freshest_first() == ["b", "d", "a", "c"]  # no time known: last


def test_a_backlog_of_passes_lets_the_loop_run_between_them() -> None:
    kube = FakeKube()
    kube.add_policy("p", {"mode": "Paused"})  # every pass returns at once, writing nothing
    for i in range(200):
        kube.add_node(f"n{i}")
        kube.add_report(report_obj(name=f"n{i}"))

    async def body() -> None:
        rt = Runtime(kube, clock=lambda: at(10), workers=1)
        await rt._load()  # queues all 200
        await rt._list_pods()
        rt.leadership.hold()
        assert rt.leadership.act()
        passes: list[str] = []
        real = rt.reconciler.reconcile

        async def counting(name: str) -> float | None:
            passes.append(name)
            return await real(name)

        rt.reconciler.reconcile = counting  # type: ignore[method-assign]
        worker = asyncio.create_task(rt._worker(0))
        for _ in range(3):
            await asyncio.sleep(0)  # another callback on the loop gets its turn ...
        assert 0 < len(passes) < 20  # ... long before the backlog is through
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)

    asyncio.run(body())


def test_caching_the_start_up_pod_list_lets_the_loop_run_between_batches() -> None:
    kube = FakeKube()
    kube.add_policy("p", {})
    kube.add_node("n1")
    for k in range(2500):
        kube.add_pod("ml", f"p{k}", "n1")

    async def body() -> None:
        rt = Runtime(kube, clock=lambda: at(10), workers=1)
        rt.store.pods.expect()
        await rt._load()
        cached: list[int] = []

        async def watcher() -> None:  # another task on the loop: it sees the pods arrive in batches
            while rt.store.pods.pending:
                cached.append(len(rt.store.pods.on("n1")))
                await asyncio.sleep(0)

        seen = asyncio.create_task(watcher())
        await rt._list_pods()
        await seen
        assert any(0 < n < 2500 for n in cached)  # the loop ran while the list was being cached
        assert len(rt.store.pods.on("n1")) == 2500 and not rt.store.pods.pending

    asyncio.run(body())
