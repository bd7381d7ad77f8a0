"""The end of a start-up (``controller/process/firstpass.py``): every GPU node passed once with its pods in,
said once (a log line and ``gpuhealth_startup_seconds``); a pass made before the pods were listed does
not count, and neither does one that failed."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gpuhealth.controller import metrics
from gpuhealth.controller.process.firstpass import LINE, FirstPass
from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import at, report_obj
from tests.unit.controller.process._clock import Clock
from tests.unit.fake_kube import FakeKube


def test_the_start_up_ends_with_the_last_node_owed_a_pass(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    first = FirstPass(clock)
    first.start()
    first.passed("a")  # before the pods are in: not a start-up's pass
    clock.t = 130.0
    first.expect(["a", "b"])
    first.passed("a")
    first.passed("z")  # a node that came after the list owes nothing
    assert first.seconds is None
    clock.t = 142.5
    with caplog.at_level(logging.INFO, logger="gpuhealth.controller.process.firstpass"):
        first.passed("b")
        first.passed("b")
        first.expect(["c"])  # said once: a later list changes nothing
    assert first.seconds == 42.5
    assert metrics.REGISTRY.get_sample_value("gpuhealth_startup_seconds") == 42.5
    assert [r.getMessage() for r in caplog.records] == [f"{LINE}: 2 nodes, 42.5s after start"]


def test_a_fleet_of_no_node_is_evaluated_when_its_pods_are_listed() -> None:
    first = FirstPass(Clock())
    first.start()
    first.expect([])
    assert first.seconds == 0.0


def test_only_passes_made_with_the_pods_and_that_succeeded_end_the_start_up() -> None:
    kube = FakeKube()
    kube.add_policy("p", {})
    for name in ("n1", "n2"):
        kube.add_node(name)
        kube.add_report(report_obj(name=name))

    async def body() -> None:
        rt = Runtime(kube, clock=lambda: at(10), workers=1)
        rt.store.pods.expect()
        rt.first_pass.start()
        await rt._load()  # queues both nodes
        rt.leadership.hold()
        assert rt.leadership.act()
        fail: set[str] = set()
        calls: list[tuple[str, bool]] = []  # (node, whether the pass raised)
        real = rt.reconciler.reconcile

        async def flaky(name: str) -> float | None:
            calls.append((name, name in fail))
            if name in fail:
                fail.discard(name)
                raise RuntimeError("the API server went away")
            return await real(name)

        rt.reconciler.reconcile = flaky  # type: ignore[method-assign]
        worker = asyncio.create_task(rt._worker(0))
        while len(calls) < 2:
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        assert rt.first_pass.seconds is None  # both passed, but without the pods
        fail.add("n2")  # its pass with the pods fails once: it is retried, and only then counts
        await rt._list_pods()
        for _ in range(200):
            if rt.first_pass.seconds is not None:
                break
            await asyncio.sleep(0.05)
        assert rt.first_pass.seconds is not None
        # Had the failed pass counted, the start-up would have ended before n2's retry.
        assert calls[2:] == [("n1", False), ("n2", True), ("n2", False)]
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await rt.events.flush()

    asyncio.run(body())
