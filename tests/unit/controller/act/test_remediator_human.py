"""The remediator's human side, with the in-memory fake API: the repair history by GPU UUID it writes
with each ladder record (``_repairs_patch``: only the attempts a move adds, bounded per GPU and per node,
the oldest GPUs dropped first), and ``approval: Manual`` through the node pipeline (no Job until the
Node's annotation, then one, the annotation removed only after the record; a kill in between neither
loses the approval nor runs the step twice)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from dataclasses import replace
from typing import Any

from gpuhealth.api.devices import DeviceRecord
from gpuhealth.api.remediation import StepKind
from gpuhealth.api.remediation_status import MAX_REPAIR_GPUS, MAX_REPAIRS, Attempt, LadderRecord, Phase, Repair, Result
from gpuhealth.controller.act.remediator import _repairs_patch
from gpuhealth.controller.process.runtime import Runtime
from gpuhealth.controller.state.slim import slim_node
from tests.unit.controller.act._device_support import Clock, ecc_on, runtime
from tests.unit.controller.act.test_remediator import POLICY, ladder, passes
from tests.unit.fake_kube import FakeKube

T = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
DEV = DeviceRecord(index=3, uuid="GPU-3")


def attempt(s: int, result: Result = Result.SUCCEEDED) -> Attempt:
    return Attempt(StepKind.GPU_RESET, 1, T + dt.timedelta(seconds=s), T + dt.timedelta(seconds=s + 1), result)


def test_only_the_attempts_a_move_adds_are_appended_with_reason_and_index() -> None:
    old = LadderRecord(3, StepKind.GPU_RESET, phase=Phase.RUNNING, reason="EccUncorrected", history=(attempt(0),))
    new = replace(old, phase=Phase.SUCCEEDED, history=(attempt(0), attempt(10)))
    repairs: dict[str, tuple[Repair, ...]] = {"GPU-3": (Repair(attempt(0), "EccUncorrected", 3),)}
    patch = _repairs_patch(repairs, DEV, old, new)
    assert patch == {
        "GPU-3": [
            Repair(attempt(0), "EccUncorrected", 3).to_status(),
            Repair(attempt(10), "EccUncorrected", 3).to_status(),
        ]
    }
    assert len(repairs["GPU-3"]) == 2
    assert _repairs_patch(repairs, DEV, new, new) is None  # nothing added: nothing written
    assert _repairs_patch(repairs, replace(DEV, uuid=""), old, new) is None  # no UUID: no key to keep it by
    assert _repairs_patch(repairs, DEV, old, None) is None
    # After a reboot that renumbered the GPUs, the attempt is the GPU's the ladder was for (its UUID).
    moved = _repairs_patch({}, DEV, old, replace(new, uuid="GPU-A"))
    assert moved is not None and list(moved) == ["GPU-A"]


def test_bounded_per_gpu_and_the_gpus_repaired_longest_ago_go_first() -> None:
    repairs: dict[str, tuple[Repair, ...]] = {
        f"GPU-old-{i}": (Repair(attempt(i), "X", i % 8),) for i in range(MAX_REPAIR_GPUS)
    }
    repairs["GPU-3"] = tuple(Repair(attempt(100 + i), "X", 3) for i in range(MAX_REPAIRS))
    new = LadderRecord(3, StepKind.GPU_RESET, phase=Phase.SUCCEEDED, reason="X", history=(attempt(500),))
    patch = _repairs_patch(repairs, DEV, None, new)
    assert patch is not None
    assert len(patch["GPU-3"]) == MAX_REPAIRS and patch["GPU-3"][-1]["finishedAt"] == "2026-01-01T12:08:21Z"
    assert patch["GPU-old-0"] is None and "GPU-old-0" not in repairs  # the oldest GPU is dropped
    assert len(repairs) == MAX_REPAIR_GPUS and "GPU-old-1" in repairs


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
