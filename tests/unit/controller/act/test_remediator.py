"""The remediator room through the node pipeline, with the in-memory fake API: the ladder's record is
written before the Job, a restart finds the Job by name, a pod the API shows on the GPU blocks it,
a Paused policy starts nothing, and the fleet limit holds."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
from typing import Any

from kubernetes.client.rest import ApiException

from gpuhealth.actions.slices import slim_slice
from gpuhealth.controller.act.remediator import HANDOVER_S, POLL_S
from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import gpu, report_obj
from tests.unit.controller.act._device_support import Clock, claim, ecc_on, runtime, slice_of
from tests.unit.fake_kube import FakeKube

NS = "gpuhealth-remediation"
POLICY = {"safety": {"maxUnhealthyGPUs": 4, "probation": "2s"}, "remediation": {"enabled": True}}


def setup(policy: dict[str, Any] | None = None) -> FakeKube:
    kube = FakeKube()
    kube.add_policy("p", policy or POLICY)
    kube.add_node("n1")
    kube.add_report(ecc_on(3))
    return kube


def ladder(kube: FakeKube, index: int = 3) -> dict[str, Any]:
    return dict((kube.reports["n1"].get("status") or {}).get("remediation", {}).get(str(index)) or {})


async def passes(rt: Runtime, clock: Clock, n: int, step_s: float = 1.0) -> None:
    for _ in range(n):
        await rt.reconciler.reconcile("n1")
        clock.t += dt.timedelta(seconds=step_s)


def test_the_record_is_written_before_the_job_and_a_clean_gpu_returns() -> None:
    kube = setup()
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await passes(rt, clock, 4)
        assert len(kube.jobs) == 1
        ((ns, name),) = kube.jobs
        assert ns == NS and ladder(kube)["job"] == f"{NS}/{name}" and ladder(kube)["phase"] == "Running"
        kube.finish_job(ns, name, "Complete")
        await passes(rt, clock, 1)
        assert ladder(kube)["phase"] == "Verifying"
        clean = report_obj(
            name="n1", devices=[gpu(i) for i in range(8)], heartbeat=(clock.t - Clock().t).total_seconds()
        )
        kube.reports["n1"]["spec"] = clean["spec"]
        rt.on_report("MODIFIED", copy.deepcopy(kube.reports["n1"]), enqueue=False)
        await passes(rt, clock, 5)
        await rt.events.flush()

    asyncio.run(body())
    writes = [w for w in kube.writes if w[1] == "report/n1/status" or w[1].startswith("job/")]
    create = writes.index(next(w for w in writes if w[0] == "create"))
    assert create > 0 and writes[create - 1] == ("patch", "report/n1/status")  # write-ahead
    dev3 = next(d for d in kube.reports["n1"]["status"]["devices"] if d["index"] == 3)
    assert dev3["state"] == "InService" and not ladder(kube)
    assert [r for r in kube.reasons("n1") if r.startswith(("GPUReset", "Remediation"))] == [
        "GPUReset",
        "RemediationSucceeded",
    ]


class KilledCreate(FakeKube):
    """The process dies right after the record is written: the first create never reaches the API."""

    killed = False

    def create_job(self, namespace: str, body: Any) -> dict[str, Any]:
        if not self.killed:
            self.killed = True
            raise RuntimeError("SIGKILL")
        return super().create_job(namespace, body)


def test_a_restart_creates_the_recorded_job_once_and_never_a_second() -> None:
    kube = KilledCreate()
    kube.add_policy("p", POLICY)
    kube.add_node("n1")
    kube.add_report(ecc_on(3))
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        for _ in range(4):
            try:
                await rt.reconciler.reconcile("n1")
            except RuntimeError:
                break
            clock.t += dt.timedelta(seconds=1)
        assert ladder(kube)["phase"] == "Pending" and not kube.jobs
        for _ in range(2):  # two restarts: the first creates the recorded Job, the second finds it
            rt = await runtime(kube, clock)
            await passes(rt, clock, 2)

    asyncio.run(body())
    assert len(kube.jobs) == 1 and f"{NS}/{next(iter(kube.jobs))[1]}" == ladder(kube)["job"]
    assert ladder(kube)["attempt"] == 1 and ladder(kube)["phase"] == "Running"


def test_a_pod_the_api_shows_on_the_gpu_blocks_the_reset_even_if_the_cache_missed_it() -> None:
    kube = setup()
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await passes(rt, clock, 3)  # drained (nobody held it): the reset would start now...
        kube.jobs.clear()
        kube.writes.clear()
        report = kube.reports["n1"]["status"].pop("remediation", None)
        assert report is not None
        rt.on_report("MODIFIED", copy.deepcopy(kube.reports["n1"]), enqueue=False)
        kube.add_pod("ml", "late", "n1")  # ...but a pod grabbed it: in the API, not yet in the cache
        kube.claims = [claim("c3", "gpu-3", "late")]
        await passes(rt, clock, 5)
        await rt.events.flush()

    asyncio.run(body())
    assert not kube.jobs and not [w for w in kube.writes if w[1].startswith("job/")]
    blocked = [e["message"] for e in kube.events if e["reason"] == "RemediationBlocked"]
    assert len(blocked) == 1 and "ml/late" in blocked[0], "one wait, one announcement, however many passes"


def test_paused_starts_nothing_and_the_fleet_limit_holds() -> None:
    paused = setup({**POLICY, "mode": "Paused"})
    clock = Clock()

    async def body(kube: FakeKube, nodes: tuple[str, ...]) -> None:
        rt = Runtime(kube, clock=clock, workers=1)
        rt.slice_watch.cache.replace([slim_slice(slice_of(n)) for n in nodes])
        await rt._load()
        await rt._list_pods()
        for _ in range(4):
            for n in nodes:
                await rt.reconciler.reconcile(n)
            clock.t += dt.timedelta(seconds=1)
        await rt.events.flush()

    asyncio.run(body(paused, ("n1",)))
    assert not paused.jobs
    two = setup()
    two.add_node("n2")
    two.add_report({**ecc_on(3), "metadata": {"name": "n2"}, "spec": {**ecc_on(3)["spec"], "nodeName": "n2"}})
    asyncio.run(body(two, ("n1", "n2")))
    assert len(two.jobs) == 1, "maxConcurrent 1: one reset in flight across the policy"
    blocked = [e["message"] for e in two.events if e["reason"] == "RemediationBlocked"]
    assert any("maxConcurrent (1)" in m for m in blocked), blocked


def test_api_errors_on_create_surface_and_are_retried() -> None:
    class Forbidden(FakeKube):
        def create_job(self, namespace: str, body: Any) -> dict[str, Any]:
            raise ApiException(status=403, reason="Forbidden")

    kube = Forbidden()
    kube.add_policy("p", POLICY)
    kube.add_node("n1")
    kube.add_report(ecc_on(3))
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        for _ in range(4):
            with contextlib.suppress(ApiException):  # the forbidden create fails the pass
                await rt.reconciler.reconcile("n1")
            clock.t += dt.timedelta(seconds=1)
        await rt.events.flush()

    asyncio.run(body())
    assert ladder(kube)["phase"] == "Pending"  # kept: the next pass creates it under the same name
    assert any("403" in e["message"] for e in kube.events if e["reason"] == "RemediationBlocked")


def test_a_gpu_waiting_for_its_holder_is_announced_once_however_many_passes() -> None:
    kube = setup()
    kube.add_pod("kube-system", "holder", "n1")  # never drained (a system namespace), holds GPU 3
    kube.claims = [claim("c3", "gpu-3", "holder", namespace="kube-system")]
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await passes(rt, clock, 8)
        await rt.events.flush()

    asyncio.run(body())
    assert not kube.jobs
    blocked = [e["message"] for e in kube.events if e["reason"] == "RemediationBlocked"]
    assert len(blocked) == 1 and "kube-system/holder" in blocked[0], blocked


def test_a_claim_still_reserved_for_a_pod_that_left_is_looked_at_again_until_it_is_released() -> None:
    """The pod left and the claim controller has yet to clear ``reservedFor``: that change brings no
    event gpuhealth watches, so the pass asks for the node again (sooner than any sweep, later while
    it lasts), and the pass after the release starts the reset. A holder on the node asks nothing:
    its leaving is a pod event."""
    kube = setup()
    kube.add_pod("kube-system", "holder", "n1")
    kube.claims = [claim("c3", "gpu-3", "holder", namespace="kube-system")]
    clock = Clock()
    agains: list[float | None] = []

    async def body() -> None:
        rt = await runtime(kube, clock)
        await passes(rt, clock, 4)
        assert await rt.reconciler.reconcile("n1") is None, "a holder on the node: its pod event is enough"
        kube.pods.pop(("kube-system", "holder"))  # it left; its claim is still reserved for it
        for _ in range(3):
            agains.append(await rt.reconciler.reconcile("n1"))
        assert not kube.jobs
        kube.claims = []  # the claim controller released it
        agains.append(await rt.reconciler.reconcile("n1"))
        await rt.events.flush()

    asyncio.run(body())
    assert agains[:3] == [HANDOVER_S, 2 * HANDOVER_S, 4 * HANDOVER_S]
    assert len(kube.jobs) == 1 and ladder(kube)["phase"] == "Running"
    assert agains[3] == POLL_S, "the reset in flight is polled as before; the look-again is over"
