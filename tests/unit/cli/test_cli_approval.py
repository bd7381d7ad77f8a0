"""`kubectl gpuhealth approve|reject` (the annotation only, refused when nothing waits) and what
`describe` shows of a waiting step and of a GPU's repairs by UUID."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.api.remediation_status import approver_key
from gpuhealth.cli.changes import plan_approval
from gpuhealth.cli.describe_text import render_describe
from gpuhealth.cli.errors import Refused
from gpuhealth.cli.nodeview import describe_node
from tests.unit.cli.objects import NOW, ago, node, policy, report

WAITING: dict[str, Any] = {
    "step": "GPUReset",
    "attempt": 1,
    "phase": "PendingApproval",
    "reason": "EccUncorrected",
    "uuid": "GPU-3",
    "startedAt": ago(300),
    "message": "GPU 3 (GPU-3) (EccUncorrected): GPUReset (attempt 1) waits for a human's approval",
}
VALIDATION_WAITING: dict[str, Any] = {**WAITING, "uuid": "GPU-5", "validation": {"level": 2, "result": "Pending"}}
RUNNING = {"step": "GPUReset", "attempt": 1, "phase": "Running", "reason": "EccUncorrected"}
REPAIRS = {
    "GPU-3": [
        {
            "step": "GPUReset",
            "attempt": 1,
            "result": "Succeeded",
            "startedAt": ago(90_000),
            "finishedAt": ago(89_000),
            "reason": "EccUncorrected",
            "gpu": 2,
        }
    ]
}


def _report(**remediation: Any) -> dict[str, Any]:
    return report("a", "Degraded", remediation=remediation)


def test_approve_one_gpu_writes_only_its_annotation() -> None:
    plan = plan_approval("a", _report(**{"3": WAITING, "5": VALIDATION_WAITING}), 3, NOW)
    assert plan.patch == {"metadata": {"annotations": {"gpuhealth.dev/approve-gpu": "3"}}}
    assert any("GPU 3: GPUReset (attempt 1, for EccUncorrected)" in ln for ln in plan.lines)


def test_approve_or_reject_the_whole_node_names_every_waiting_step() -> None:
    plan = plan_approval("a", _report(**{"3": WAITING, "5": VALIDATION_WAITING, "6": RUNNING}), None, NOW)
    assert plan.patch == {"metadata": {"annotations": {"gpuhealth.dev/approve": "2025-06-01T12:00:00Z"}}}
    assert [ln for ln in plan.lines if ln.startswith("GPU ")] == [
        "GPU 3: GPUReset (attempt 1, for EccUncorrected)",
        "GPU 5: level-2 validation (attempt 1, for EccUncorrected)",
    ]
    rejected = plan_approval("a", _report(**{"3": WAITING}), 3, NOW, reject=True)
    assert rejected.patch == {"metadata": {"annotations": {"gpuhealth.dev/reject-gpu": "3"}}}
    assert any("AwaitingRepair" in ln for ln in rejected.lines)


def test_nothing_waiting_is_refused_with_why() -> None:
    with pytest.raises(Refused, match=r"GPU 6 of node a has no step waiting for approval \(its ladder is at GPUReset"):
        plan_approval("a", _report(**{"3": WAITING, "6": RUNNING}), 6, NOW)
    with pytest.raises(Refused, match="node a has no repair or validation step waiting for approval"):
        plan_approval("a", _report(**{"6": RUNNING}), None, NOW, reject=True)
    with pytest.raises(Refused, match="it has no repair ladder"):
        plan_approval("a", None, 1, NOW)


def test_describe_shows_the_waiting_step_and_the_repairs_by_uuid() -> None:
    rep = report("a", "Degraded", remediation={"3": WAITING}, repairs=REPAIRS)
    m = describe_node("a", node("a"), rep, policy(remediation={"enabled": True}), [], NOW)
    (lad,) = m["remediation"]
    assert lad["phase"] == "PendingApproval" and lad["standing"] == "awaitingApproval"
    assert m["repairs"] == [
        {
            "uuid": "GPU-3",
            "gpu": 2,
            "attempts": [
                {
                    "step": "GPUReset",
                    "attempt": 1,
                    "result": "Succeeded",
                    "reason": "EccUncorrected",
                    "gpu": 2,
                    "startedAt": ago(90_000),
                    "finishedAt": ago(89_000),
                }
            ],
        }
    ]
    text = render_describe(m)
    assert "GPU 3 (GPU-3): EccUncorrected, step GPUReset 1/2 PendingApproval for 5m" in text
    assert "Repairs by GPU UUID (status.repairs, what makes a repeat offender):" in text
    row = next(ln for ln in text.splitlines() if ln.strip().startswith("GPU-3 "))
    assert row.split()[:6] == ["GPU-3", "2", "GPUReset", "1", "Succeeded", "EccUncorrected"]


def test_an_approval_by_a_known_user_records_its_approver_and_the_same_person_is_refused_again() -> None:
    alice = "alice@example.com"
    plan = plan_approval("a", _report(**{"3": WAITING}), 3, NOW, user=alice)
    assert plan.patch == {"metadata": {"annotations": {approver_key(alice, 3): alice}}}
    assert plan.lines[0] == f"node/a annotated {approver_key(alice, 3)}={alice}."
    node_wide = plan_approval("a", _report(**{"3": WAITING, "5": VALIDATION_WAITING}), None, NOW, user=alice)
    assert node_wide.patch == {"metadata": {"annotations": {approver_key(alice): alice}}}
    once = {**WAITING, "approvers": [{"by": alice, "at": ago(60)}]}
    with pytest.raises(Refused, match=r"alice@example.com already approved GPU 3's waiting step: the same person"):
        plan_approval("a", _report(**{"3": once}), 3, NOW, user=alice)
    bob = plan_approval("a", _report(**{"3": once}), 3, NOW, user="bob")
    assert any("approved so far by alice@example.com" in ln for ln in bob.lines)
    # A rejection names nobody, whoever writes it.
    rejected = plan_approval("a", _report(**{"3": once}), 3, NOW, reject=True, user=None)
    assert rejected.patch == {"metadata": {"annotations": {"gpuhealth.dev/reject-gpu": "3"}}}


def test_describe_shows_who_approved_and_how_many_are_needed() -> None:
    once = {**WAITING, "step": "NodeReboot", "approvers": [{"by": "alice", "at": ago(60)}]}
    two = policy(remediation={"enabled": True, "approval": "TwoPerson"})
    m = describe_node("a", node("a"), report("a", "Degraded", remediation={"3": once}), two, [], NOW)
    (lad,) = m["remediation"]
    assert lad["approvers"] == [{"by": "alice", "at": ago(60)}] and lad["approvalsNeeded"] == 2
    assert f"Approvals: 1 of 2 approvals (alice at {ago(60)})" in render_describe(m)
    done = {**once, "phase": "HandedOff", "approvers": [{"by": "alice", "at": ago(60)}, {"by": "bob", "at": ago(9)}]}
    m = describe_node("a", node("a"), report("a", "Degraded", remediation={"3": done}), two, [], NOW)
    assert f"Approvals: approved by alice at {ago(60)}, bob at {ago(9)}" in render_describe(m)
