"""Two people for disruptive steps (``approval: TwoPerson``, issue #54): the settings
(api/remediation.py), the approvals that name their approver (api/remediation_status.py) and the pure
ladder's wait (evaluation/ladder.py): one approval records its approver and runs nothing, the same
person again counts once, a second person lets the step run and the Event names both."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpuhealth.api.policy import PolicyError, parse_policy
from gpuhealth.api.remediation import TWO_PERSON_STEPS, Approval, ApprovalStep, StepKind
from gpuhealth.api.remediation_status import (
    MAX_APPROVER_LEN,
    Approvals,
    Approver,
    LadderRecord,
    Phase,
    approver_key,
    merge_approvers,
)
from gpuhealth.api.validation import Validation
from gpuhealth.evaluation.ladder import Observed, advance
from tests.unit.evaluation.test_ladder_repeat import STEPS, T, at, gpu

ALICE, BOB = "alice@example.com", "system:serviceaccount:ops:bob"
RESET_TWO = frozenset({ApprovalStep.GPU_RESET})


def policy(**remediation: Any) -> Any:
    return parse_policy({"metadata": {"name": "p"}, "spec": {"remediation": remediation}})


# -- settings ----------------------------------------------------------------------------------------


def test_two_person_needs_two_for_its_steps_and_one_for_the_others() -> None:
    s = policy(enabled=True, approval="TwoPerson").remediation
    assert s.approval == Approval.TWO_PERSON and s.two_person_steps == TWO_PERSON_STEPS
    assert s.approvals_needed(ApprovalStep.NODE_REBOOT) == 2  # the default: the reboot hand-off
    assert s.approvals_needed(ApprovalStep.GPU_RESET) == 1 and s.approvals_needed(ApprovalStep.VALIDATION) == 1
    mine = policy(approval="TwoPerson", twoPersonSteps=["GPUReset", "Validation"]).remediation
    assert [mine.approvals_needed(k) for k in ApprovalStep] == [2, 1, 2]
    assert (
        policy(approval="Manual", twoPersonSteps=["GPUReset"]).remediation.approvals_needed(ApprovalStep.GPU_RESET) == 1
    ), "twoPersonSteps matters under TwoPerson only"
    assert policy(approval="Automatic").remediation.approvals_needed(ApprovalStep.NODE_REBOOT) == 0


@pytest.mark.parametrize(
    ("remediation", "field"),
    [
        ({"approval": "ThreePerson"}, r"spec\.remediation\.approval: must be Automatic, Manual or TwoPerson"),
        ({"twoPersonSteps": "NodeReboot"}, r"spec\.remediation\.twoPersonSteps: must be a list"),
        ({"twoPersonSteps": ["Replace"]}, r"spec\.remediation\.twoPersonSteps\[0\]: unknown step 'Replace'"),
    ],
)
def test_refusals_name_the_field(remediation: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError, match=field):
        policy(**remediation)


# -- the approvals that name their approver ------------------------------------------------------------


def test_an_approval_key_is_the_approvers_own_and_valid() -> None:
    a, b = approver_key(ALICE, 3), approver_key(BOB)
    assert a.startswith("gpuhealth.dev/approver-gpu-3.alice-example-com-") and b.startswith("gpuhealth.dev/approver.")
    assert approver_key(ALICE, 3) == a and approver_key("Alice@example.com", 3) != a, "one slot per user name"
    long = approver_key("x" * 300, 1234)
    name = long.split("/", 1)[1]
    assert len(name) <= 63 and name[0].isalnum() and name[-1].isalnum()  # a valid annotation key's name
    assert approver_key("@@@", 1).rsplit(".", 1)[1].isalnum(), "a name of no letters is its digest"


def test_the_node_annotations_name_who_approved_what() -> None:
    ann = {
        approver_key(ALICE, 3): ALICE,
        approver_key(BOB): BOB,
        approver_key("carol", 5): "carol",
        "gpuhealth.dev/reject-gpu": "5",
        "gpuhealth.dev/approver.": "nobody",  # not a key the CLI writes: not an approval, left alone
        approver_key("empty", 3): "",
        approver_key("long", 3): "l" * (MAX_APPROVER_LEN + 1),
    }
    a = Approvals.from_annotations(ann)
    assert a.approvers(3) == {ALICE, BOB} and a.approvers(4) == {BOB}
    assert a.approvers(5) == frozenset(), "a rejection wins over an approval of the same GPU"
    assert not a.approves(3), "an approval that names someone is not an anonymous one"
    assert a.any and a.keys == set(ann) - {"gpuhealth.dev/approver."}, "every approval read is removed once acted on"


def test_the_same_person_counts_once_with_the_first_time() -> None:
    have = (Approver(ALICE, T),)
    assert merge_approvers(have, [ALICE], at(60)) == have
    assert merge_approvers(have, [BOB, ALICE], at(60)) == (Approver(ALICE, T), Approver(BOB, at(60)))
    assert merge_approvers((), [], T) == ()


def test_a_record_round_trips_its_approvers() -> None:
    rec = LadderRecord(3, StepKind.NODE_REBOOT, phase=Phase.PENDING_APPROVAL, approvers=(Approver(ALICE, T),))
    assert rec.to_status()["approvers"] == [{"by": ALICE, "at": "2026-01-01T12:00:00Z"}]
    assert LadderRecord.from_status(3, rec.to_status()) == rec
    assert "approvers" not in replace(rec, approvers=()).to_status()
    assert rec.approval_step == ApprovalStep.NODE_REBOOT
    assert (
        replace(rec, step=StepKind.GPU_RESET, validation=Validation(level=2)).approval_step == ApprovalStep.VALIDATION
    )


# -- the ladder's wait ---------------------------------------------------------------------------------

TWO = Observed(may_start=True, manual=True, two_person=RESET_TWO)


def _waiting() -> LadderRecord:
    asked = advance(None, gpu(), STEPS, TWO, T)
    assert asked.record is not None and asked.record.phase == Phase.PENDING_APPROVAL
    assert "waits for approvals of 2 different people (spec.remediation.approval: TwoPerson)" in asked.record.message
    return asked.record


def test_one_approval_is_recorded_and_runs_nothing() -> None:
    first = advance(_waiting(), gpu(), STEPS, replace(TWO, approvers=(Approver(ALICE, at(5)),)), at(5))
    assert first.start is None and first.record is not None and first.record.phase == Phase.PENDING_APPROVAL
    assert first.record.approvers == (Approver(ALICE, at(5)),) and not first.record.approved
    assert "has 1 of 2 approvals (alice@example.com (at 2026-01-01T12:00:05Z))" in first.record.message
    assert [(e[1], e[2]) for e in first.events] == [
        (
            "ApprovalRecorded",
            f"GPU 3 (GPU-00000003-0000-0000-0000-000000000000): GPUReset (attempt 1) approved by "
            f"{ALICE}; 1 of 2 approvals, it still waits",
        )
    ]
    again = advance(first.record, gpu(), STEPS, replace(TWO, approvers=first.record.approvers), at(9))
    assert again.record == first.record and not again.events and again.start is None, "nothing new: no write"


def test_two_people_run_the_step_once_and_the_event_names_both() -> None:
    both = (Approver(ALICE, at(5)), Approver(BOB, at(9)))
    go = advance(_waiting(), gpu(), STEPS, replace(TWO, approved=True, approvers=both), at(9))
    assert go.start == StepKind.GPU_RESET and go.record is not None and go.record.phase == Phase.PENDING
    assert go.record.approvers == both, "who approved stays in status while the step runs"
    (approved,) = [e[2] for e in go.events if e[1] == "StepApproved"]
    assert f"approved by {ALICE} (at 2026-01-01T12:00:05Z) and {BOB} (at 2026-01-01T12:00:09Z)" in approved
    assert "(2 of 2 approvals)" in approved
    # The next wait (here: the reboot after the reset failed) starts with nobody's approval.
    failed = advance(
        replace(go.record, phase=Phase.RUNNING, attempt=2), gpu(), STEPS, replace(TWO, job="Failed"), at(20)
    )
    assert failed.record is not None and failed.record.step == StepKind.NODE_REBOOT
    assert failed.record.phase == Phase.PENDING_APPROVAL and failed.record.approvers == ()
    assert "waits for a human's approval (spec.remediation.approval: Manual)" in failed.record.message, (
        "NodeReboot is not of this policy's twoPersonSteps: one approval"
    )
