"""``approval: TwoPerson`` through the node pipeline, with the in-memory fake API: a first approval is
recorded (its approver and time in status, the annotation removed) and runs nothing; the same person
again counts once; an approval that names nobody counts for nothing; a second person's runs exactly one
Job, across a kill between the record and the annotation's removal. (That the API server refuses an
approval naming someone else is the admission policy's, shown on the real control plane in
tests/integration/test_two_person_approval.py.)"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gpuhealth.api.remediation_status import approver_key
from gpuhealth.controller.process.runtime import Runtime
from tests.unit.controller.act._device_support import Clock, ecc_on, runtime
from tests.unit.controller.act.test_remediator import POLICY, ladder, passes
from tests.unit.controller.act.test_remediator_human import _annotate, _annotations
from tests.unit.fake_kube import FakeKube

TWO = {**POLICY, "remediation": {"enabled": True, "approval": "TwoPerson", "twoPersonSteps": ["GPUReset"]}}
ALICE, BOB = "alice@example.com", "bob@example.com"


def _setup(kube: FakeKube) -> FakeKube:
    kube.add_policy("p", TWO)
    kube.add_node("n1")
    kube.add_report(ecc_on(3))
    return kube


def _by(kube: FakeKube) -> list[str]:
    return [a["by"] for a in ladder(kube).get("approvers") or []]


async def _waiting(kube: FakeKube, clock: Clock) -> Runtime:
    rt = await runtime(kube, clock)
    await passes(rt, clock, 6)
    assert ladder(kube)["phase"] == "PendingApproval" and not kube.jobs
    assert "approvals of 2 different people" in ladder(kube)["message"]
    return rt


def test_one_person_runs_nothing_however_often_and_two_run_one_job() -> None:
    kube = _setup(FakeKube())
    clock = Clock()

    async def body() -> None:
        rt = await _waiting(kube, clock)
        _annotate(kube, rt, {approver_key(ALICE, 3): ALICE})
        await passes(rt, clock, 3)
        assert ladder(kube)["phase"] == "PendingApproval" and not kube.jobs and _by(kube) == [ALICE]
        assert "1 of 2 approvals" in ladder(kube)["message"]
        assert not any(k.startswith("gpuhealth.dev/approver") for k in _annotations(kube)), "recorded, then removed"
        # Alice again, node-wide this time and under another key: still one person.
        _annotate(kube, rt, {approver_key(ALICE): ALICE, "gpuhealth.dev/approver.second-slot": ALICE})
        await passes(rt, clock, 3)
        assert ladder(kube)["phase"] == "PendingApproval" and not kube.jobs and _by(kube) == [ALICE]
        # An approval that names nobody is no second person under TwoPerson (it is removed unused).
        _annotate(kube, rt, {"gpuhealth.dev/approve-gpu": "3"})
        await passes(rt, clock, 3)
        assert ladder(kube)["phase"] == "PendingApproval" and not kube.jobs
        assert "gpuhealth.dev/approve-gpu" not in _annotations(kube)
        _annotate(kube, rt, {approver_key(BOB, 3): BOB})
        await passes(rt, clock, 4)
        await rt.events.flush()

    asyncio.run(body())
    assert len(kube.jobs) == 1 and ladder(kube)["phase"] == "Running" and _by(kube) == [ALICE, BOB]
    assert not any(k.startswith("gpuhealth.dev/approver") for k in _annotations(kube))
    reasons = kube.reasons("n1")
    assert reasons.count("ApprovalRecorded") == 1 and reasons.count("StepApproved") == 1
    assert reasons.count("ApprovalRequired") == 1


class KilledAck(FakeKube):
    """The process dies after the record names Bob too (and the Job is created), before the annotation goes."""

    killed = False

    def patch_node(self, name: str, patch: Any) -> dict[str, Any]:
        annotations = (patch.get("metadata") or {}).get("annotations") or {}
        if not self.killed and approver_key(BOB, 3) in annotations and annotations[approver_key(BOB, 3)] is None:
            self.killed = True
            raise RuntimeError("SIGKILL")
        return super().patch_node(name, patch)


def test_a_kill_before_the_second_approval_is_removed_runs_the_step_once() -> None:
    kube = KilledAck()
    _setup(kube)
    clock = Clock()

    async def body() -> None:
        rt = await _waiting(kube, clock)
        _annotate(kube, rt, {approver_key(ALICE, 3): ALICE})
        await passes(rt, clock, 3)
        _annotate(kube, rt, {approver_key(BOB, 3): BOB})
        with contextlib.suppress(RuntimeError):
            await rt.reconciler.reconcile("n1")
        assert kube.killed and len(kube.jobs) == 1 and approver_key(BOB, 3) in _annotations(kube)
        rt = await runtime(kube, clock)  # restarted: Bob's annotation is still there, the record says Pending
        await passes(rt, clock, 4)

    asyncio.run(body())
    assert len(kube.jobs) == 1 and ladder(kube)["phase"] == "Running" and _by(kube) == [ALICE, BOB]
    assert approver_key(BOB, 3) not in _annotations(kube)
