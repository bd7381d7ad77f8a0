"""The remediator's human side, with the in-memory fake API: ``approval: Manual`` through the node
pipeline (no Job until the Node's annotation, then one, the annotation removed only after the record;
a kill in between neither loses the approval nor runs the step twice)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gpuhealth.controller.process.runtime import Runtime
from gpuhealth.controller.state.slim import slim_node
from tests.unit.controller.act._device_support import Clock, ecc_on, runtime
from tests.unit.controller.act.test_remediator import POLICY, ladder, passes
from tests.unit.fake_kube import FakeKube

MANUAL = {**POLICY, "remediation": {"enabled": True, "approval": "Manual"}}
APPROVE = "gpuhealth.dev/approve-gpu"


def _annotate(kube: FakeKube, rt: Runtime, annotations: dict[str, Any]) -> None:
    kube.patch_node("n1", {"metadata": {"annotations": annotations}})
    rt.on_node("MODIFIED", slim_node(kube.nodes["n1"]), enqueue=False)


def _annotations(kube: FakeKube) -> dict[str, str]:
    return dict(kube.nodes["n1"]["metadata"].get("annotations") or {})


def test_manual_no_job_until_the_annotation_then_one_and_the_annotation_goes() -> None:
    kube = FakeKube()
    kube.add_policy("p", MANUAL)
    kube.add_node("n1")
    kube.add_report(ecc_on(3))
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await passes(rt, clock, 6)
        assert ladder(kube)["phase"] == "PendingApproval" and not kube.jobs
        _annotate(kube, rt, {"gpuhealth.dev/approve-gpu": "5"})  # another GPU: nothing of GPU 3's runs
        await passes(rt, clock, 2)
        assert ladder(kube)["phase"] == "PendingApproval" and not kube.jobs
        assert APPROVE not in _annotations(kube), "acknowledged once the remediator has seen it"
        _annotate(kube, rt, {APPROVE: "3"})
        await passes(rt, clock, 4)
        await rt.events.flush()

    asyncio.run(body())
    assert len(kube.jobs) == 1 and ladder(kube)["phase"] == "Running" and "approved" not in ladder(kube)
    assert APPROVE not in _annotations(kube)
    assert kube.reasons("n1").count("ApprovalRequired") == 1 and "StepApproved" in kube.reasons("n1")


class KilledAck(FakeKube):
    """The process dies after the approved record and its Job, before the annotation is removed."""

    killed = False

    def patch_node(self, name: str, patch: Any) -> dict[str, Any]:
        annotations = (patch.get("metadata") or {}).get("annotations") or {}
        if not self.killed and annotations.get(APPROVE, "") is None:
            self.killed = True
            raise RuntimeError("SIGKILL")
        return super().patch_node(name, patch)


def test_a_kill_before_the_annotation_is_removed_runs_the_step_once() -> None:
    kube = KilledAck()
    kube.add_policy("p", MANUAL)
    kube.add_node("n1")
    kube.add_report(ecc_on(3))
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await passes(rt, clock, 6)
        assert ladder(kube)["phase"] == "PendingApproval"
        _annotate(kube, rt, {APPROVE: "3"})
        with contextlib.suppress(RuntimeError):
            await rt.reconciler.reconcile("n1")
        assert kube.killed and len(kube.jobs) == 1 and APPROVE in _annotations(kube)
        rt = await runtime(kube, clock)  # restarted: the annotation is still there, the record says Running
        await passes(rt, clock, 4)

    asyncio.run(body())
    assert len(kube.jobs) == 1 and ladder(kube)["phase"] == "Running"
    assert APPROVE not in _annotations(kube)
