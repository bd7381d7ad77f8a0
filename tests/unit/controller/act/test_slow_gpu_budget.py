"""A GPU held out one by one for a slow, not broken, finding (a degraded NVLink here) spends the slow
budget (``safety.maxSlow`` in GPUs), never the budget meant for dead GPUs (``maxUnhealthyGPUs``), through
the node pipeline against the in-memory fake API."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import gpu, report_obj
from tests.unit.controller.act._device_support import RULE, Clock, runtime, setup
from tests.unit.fake_kube import FakeKube


def _nvlink_down_on(kube: FakeKube, index: int = 3) -> None:
    devices = [gpu(i, nvlink={"links": 18, "active": 17 if i == index else 18}) for i in range(8)]
    kube.reports["n1"] = report_obj(name="n1", devices=devices)


def _pass(kube: FakeKube) -> Runtime:
    async def body() -> Runtime:
        rt = await runtime(kube, Clock())
        await rt.reconciler.reconcile("n1")
        await rt.events.flush()
        return rt

    return asyncio.run(body())


def _gpu3(kube: FakeKube) -> dict[str, Any]:
    return next(d for d in kube.reports["n1"]["status"]["devices"] if d["index"] == 3)


def test_a_slow_gpu_leaves_under_max_slow_when_the_dead_gpu_budget_is_spent() -> None:
    kube = setup({"safety": {"maxUnhealthyGPUs": 0}})
    _nvlink_down_on(kube)
    rt = _pass(kube)
    assert kube.rules[RULE]["spec"]["taint"]["effect"] == "NoSchedule"  # new work kept off GPU 3
    assert _gpu3(kube)["state"] == "Quarantined" and _gpu3(kube)["reason"] == "NVLinkDegraded"
    assert not _gpu3(kube).get("heldByBreaker")
    assert not [w for w in kube.writes if w[1].startswith("pod/")]  # running work untouched
    tally = rt.store.tally(rt.store.policies["p"])
    assert (tally.gpus_out, tally.gpus_slow) == (1, 1)  # degraded capacity, counted apart from broken


def test_a_slow_gpu_is_held_back_by_max_slow_not_by_the_gpu_budget() -> None:
    kube = setup({"safety": {"maxUnhealthyGPUs": 8, "maxSlow": 0}})
    _nvlink_down_on(kube)
    _pass(kube)
    assert not kube.rules
    assert _gpu3(kube)["state"] == "InService" and _gpu3(kube).get("heldByBreaker")
    assert "QuarantineHeldBack" in kube.reasons("n1")
