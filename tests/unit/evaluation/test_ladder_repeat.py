"""Repeat offenders across repairs and human approval: the pure ladder (evaluation/ladder.py), the
settings (api/remediation.py) and the repair history kept by GPU UUID (api/remediation_status.py)."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest

from gpuhealth.api.devices import DeviceState
from gpuhealth.api.policy import PolicyError, parse_policy
from gpuhealth.api.remediation import Approval, RepeatSettings, Step, StepKind
from gpuhealth.api.remediation_status import (
    MAX_REPAIRS,
    Approvals,
    Attempt,
    LadderRecord,
    Phase,
    Repair,
    Result,
    ladders_from_status,
    repaired_within,
    repairs_from_status,
)
from gpuhealth.api.validation import Outcome, Validation, ValidationSettings
from gpuhealth.evaluation.ladder import GPU, Observed, advance, holds

T = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
UUID = "GPU-00000003-0000-0000-0000-000000000000"
STEPS = (Step(StepKind.GPU_RESET, 60.0, 2), Step(StepKind.NODE_REBOOT, 600.0, 1), Step(StepKind.REPLACE))
WEEK = 7 * 24 * 3600.0
REPEAT = RepeatSettings()
ON = ValidationSettings(enabled=True, level=2, timeout_s=300.0)


def at(s: float) -> dt.datetime:
    return T + dt.timedelta(seconds=s)


def gpu(**kw: Any) -> GPU:
    base: dict[str, Any] = dict(
        index=3,
        uuid=UUID,
        state=DeviceState.QUARANTINED,
        reason="EccUncorrected",
        since=T,
        drained=True,
        taint_rule="gpuhealth-n-gpu-3",
        facts_clean=False,
    )
    base.update(kw)
    return GPU(**base)


def fixed(finished: dt.datetime, step: StepKind = StepKind.GPU_RESET) -> Attempt:
    return Attempt(step, 1, finished - dt.timedelta(seconds=30), finished, Result.SUCCEEDED)


def policy(**remediation: Any) -> Any:
    return parse_policy({"metadata": {"name": "p"}, "spec": {"remediation": remediation}})


# -- settings ----------------------------------------------------------------------------------------


def test_defaults_are_automatic_and_one_repair_in_seven_days() -> None:
    s = policy(enabled=True).remediation
    assert s.approval == Approval.AUTOMATIC
    assert s.repeat == RepeatSettings(enabled=True, max_repairs=1, window_s=WEEK)
    mine = policy(approval="Manual", repeatOffenders={"maxRepairs": 2, "window": "24h"}).remediation
    assert mine.approval == Approval.MANUAL and mine.repeat == RepeatSettings(True, 2, 86400.0)
    assert not policy(repeatOffenders={"enabled": False}).remediation.repeat.enabled


@pytest.mark.parametrize(
    ("remediation", "field"),
    [
        ({"approval": "Sometimes"}, r"spec\.remediation\.approval"),
        ({"repeatOffenders": {"maxRepairs": 0}}, r"spec\.remediation\.repeatOffenders\.maxRepairs"),
        ({"repeatOffenders": {"window": "soon"}}, r"spec\.remediation\.repeatOffenders\.window"),
        ({"repeatOffenders": {"window": "0s"}}, r"spec\.remediation\.repeatOffenders\.window"),
        ({"repeatOffenders": []}, r"spec\.remediation\.repeatOffenders"),
    ],
)
def test_refusals_name_the_field(remediation: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError, match=field):
        policy(**remediation)


# -- the history by UUID -----------------------------------------------------------------------------


def test_only_repairs_that_fixed_the_gpu_within_the_window_count_each_once() -> None:
    reset, reboot = fixed(at(0)), fixed(at(100), StepKind.NODE_REBOOT)
    failed = Attempt(StepKind.GPU_RESET, 2, at(0), at(50), Result.FAILED)
    replaced = Attempt(StepKind.REPLACE, 1, at(0), at(60), Result.SUCCEEDED)
    history = (reset, reset, failed, replaced, reboot)
    assert repaired_within(history, at(200), WEEK) == (reset, reboot)
    assert repaired_within(history, at(WEEK + 50), WEEK) == (reboot,)  # the reset is older than the window


def test_the_history_codec_keeps_the_index_and_reason_and_is_bounded() -> None:
    r = Repair(fixed(at(0)), "EccUncorrected", 3)
    assert Repair.from_status(r.to_status()) == r
    many = [Repair(fixed(at(i)), "X", 3).to_status() for i in range(MAX_REPAIRS + 5)]
    got = repairs_from_status({"repairs": {UUID: [*many, {"step": "Nope"}], "GPU-other": "junk"}})
    assert list(got) == [UUID] and len(got[UUID]) == MAX_REPAIRS
    assert got[UUID][-1].attempt.finished == at(MAX_REPAIRS + 4)  # the newest are kept


def test_a_record_round_trips_its_approval() -> None:
    rec = LadderRecord(3, StepKind.GPU_RESET, phase=Phase.PENDING_APPROVAL, approved=True, since=T, started=T)
    assert ladders_from_status({"remediation": {"3": rec.to_status()}})[3] == rec
    assert "approved" not in replace(rec, approved=False).to_status()


# -- repeat offenders --------------------------------------------------------------------------------


def test_a_gpu_fixed_within_the_window_that_fails_again_goes_straight_to_replace() -> None:
    obs = Observed(may_start=True, repairs=(fixed(at(-3600)),), repeat=REPEAT)
    move = advance(None, gpu(), STEPS, obs, T)
    assert move.start is None and move.repeat_offender
    assert move.record is not None and move.record.step == StepKind.REPLACE
    assert move.record.phase == Phase.AWAITING_REPAIR
    assert [e[1] for e in move.events] == ["RepeatOffender"]
    assert "repaired 1 time(s) within 168h" in move.record.message and "GPUReset at 2026-01-01T11:00:00Z" in (
        move.record.message
    )


def test_not_an_offender_outside_the_window_below_the_count_or_when_off() -> None:
    old = Observed(may_start=True, repairs=(fixed(at(-WEEK - 1)),), repeat=REPEAT)
    assert advance(None, gpu(), STEPS, old, T).start == StepKind.GPU_RESET
    two = Observed(may_start=True, repairs=(fixed(at(-60)),), repeat=RepeatSettings(max_repairs=2))
    assert advance(None, gpu(), STEPS, two, T).start == StepKind.GPU_RESET
    off = Observed(may_start=True, repairs=(fixed(at(-60)),), repeat=RepeatSettings(enabled=False))
    assert advance(None, gpu(), STEPS, off, T).start == StepKind.GPU_RESET
    failed = Attempt(StepKind.GPU_RESET, 1, at(-90), at(-60), Result.FAILED)
    assert advance(None, gpu(), STEPS, Observed(may_start=True, repairs=(failed,), repeat=REPEAT), T).start


def test_an_offender_still_draining_waits_for_its_pods_to_leave() -> None:
    obs = Observed(repairs=(fixed(at(-60)),), repeat=REPEAT)
    assert advance(None, gpu(state=DeviceState.DRAINING, drained=False), STEPS, obs, T).record is None


def test_a_relapse_after_the_reset_that_fixed_it_is_a_repeat_offence() -> None:
    ok = Attempt(StepKind.GPU_RESET, 1, T, at(10), Result.SUCCEEDED)
    rec = LadderRecord(3, StepKind.GPU_RESET, phase=Phase.SUCCEEDED, started=T, finished=at(10), since=T, history=(ok,))
    move = advance(rec, gpu(since=at(60)), STEPS, Observed(repeat=REPEAT), at(60))
    assert move.record is not None and move.record.phase == Phase.AWAITING_REPAIR and move.repeat_offender
    assert [(a.step, a.result) for a in move.record.history] == [
        (StepKind.GPU_RESET, Result.SUCCEEDED),
        (StepKind.GPU_RESET, Result.RELAPSED),
    ]
    assert [e[1] for e in move.events] == ["RemediationFailed", "RepeatOffender"]


def test_a_failed_validation_of_a_gpu_repaired_before_is_a_repeat_offence() -> None:
    v = LadderRecord(3, StepKind.GPU_RESET, phase=Phase.VALIDATING, started=T, since=T, uuid=UUID)
    running = replace(v, validation=Validation(level=2, outcome=Outcome.RUNNING, job="ns/v", created=True, started=T))
    obs = Observed(validation=(Outcome.FAILED, "GPU 3 pcie Fail"), repairs=(fixed(at(-600)),), repeat=REPEAT)
    move = advance(running, gpu(state=DeviceState.RECOVERING, facts_clean=True), STEPS, obs, at(60), ON)
    assert move.record is not None and move.record.step == StepKind.REPLACE and move.repeat_offender
    assert move.validated == ("Failed", 60.0)
    # Without the earlier repair, the ladder takes its next attempt as before.
    first = advance(
        running, gpu(state=DeviceState.RECOVERING, facts_clean=True), STEPS, replace(obs, repairs=()), at(60), ON
    )
    assert first.record is not None and (first.record.step, first.record.attempt) == (StepKind.GPU_RESET, 2)


# -- human approval ----------------------------------------------------------------------------------

MANUAL = Observed(may_start=True, manual=True)


def test_manual_a_reset_waits_for_approval_then_starts_once() -> None:
    asked = advance(None, gpu(), STEPS, MANUAL, T)
    assert asked.start is None and asked.record is not None and asked.record.phase == Phase.PENDING_APPROVAL
    assert [e[1] for e in asked.events] == ["ApprovalRequired"]
    assert "kubectl gpuhealth approve NODE --gpu 3" in asked.record.message
    waiting = advance(asked.record, gpu(), STEPS, MANUAL, at(5))
    assert waiting.record == asked.record and not waiting.events and waiting.start is None  # one Event only
    go = advance(asked.record, gpu(), STEPS, replace(MANUAL, approved=True), at(10))
    assert go.start == StepKind.GPU_RESET and go.record is not None and go.record.phase == Phase.PENDING
    assert not go.record.approved and [e[1] for e in go.events] == ["StepApproved", "GPUReset"]


def test_an_approval_is_kept_until_the_step_may_start() -> None:
    asked = advance(None, gpu(), STEPS, MANUAL, T).record
    assert asked is not None
    held = advance(asked, gpu(), STEPS, Observed(manual=True, approved=True, may_start=False), at(5))
    assert held.start is None and held.record is not None and held.record.phase == Phase.READY
    assert held.record.approved  # recorded: the annotation may go, the approval stays
    later = advance(held.record, gpu(), STEPS, MANUAL, at(9))  # no annotation any more
    assert later.start == StepKind.GPU_RESET and later.record is not None and not later.record.approved


def test_a_rejection_sends_the_gpu_to_awaiting_repair() -> None:
    asked = advance(None, gpu(), STEPS, MANUAL, T).record
    assert asked is not None
    move = advance(asked, gpu(), STEPS, replace(MANUAL, rejected=True, approved=False), at(5))
    assert move.start is None and move.record is not None
    assert (move.record.step, move.record.phase) == (StepKind.REPLACE, Phase.AWAITING_REPAIR)
    assert [(a.step, a.result) for a in move.record.history] == [(StepKind.GPU_RESET, Result.REJECTED)]
    assert [e[1] for e in move.events] == ["StepRejected"] and move.finished == (("GPUReset", "Rejected"),)


def test_manual_the_validation_and_the_reboot_wait_too() -> None:
    verifying = LadderRecord(3, StepKind.GPU_RESET, phase=Phase.VERIFYING, started=T, finished=T, since=T)
    clean = gpu(state=DeviceState.RECOVERING, facts_clean=True)
    asked = advance(verifying, clean, STEPS, Observed(manual=True, may_validate=True), at(5), ON)
    assert not asked.start_validation and asked.record is not None
    assert asked.record.phase == Phase.PENDING_APPROVAL and asked.record.validation is not None
    assert holds(asked.record, ON), "a validation waiting for approval keeps the GPU from returning"
    assert (asked.record.started, asked.record.finished) == (T, T), "the reset's attempt keeps its times"
    go = advance(asked.record, clean, STEPS, Observed(manual=True, approved=True, may_validate=True), at(9), ON)
    assert go.start_validation and go.record is not None and go.record.phase == Phase.VALIDATING
    assert [e[1] for e in go.events] == ["StepApproved", "ValidationStarted"]
    # A reset that failed its last attempt: the node reboot hand-off waits as well.
    last = LadderRecord(3, StepKind.GPU_RESET, attempt=2, phase=Phase.RUNNING, started=T, since=T, job="ns/j")
    failed = advance(last, gpu(), STEPS, Observed(job="Failed", manual=True), at(20))
    assert failed.record is not None and failed.record.step == StepKind.NODE_REBOOT
    assert failed.record.phase == Phase.PENDING_APPROVAL
    handed = advance(failed.record, gpu(), STEPS, Observed(manual=True, approved=True), at(30))
    assert handed.record is not None and handed.record.phase == Phase.HANDED_OFF


def test_the_node_annotations_name_whom_they_approve_and_a_rejection_wins() -> None:
    a = Approvals.from_annotations({"gpuhealth.dev/approve-gpu": "3, 5", "gpuhealth.dev/reject-gpu": "5"})
    assert a.any and a.approves(3) and not a.approves(5) and a.rejects(5) and not a.approves(4)
    everything = Approvals.from_annotations({"gpuhealth.dev/approve": "2026-01-01T12:00:00Z"})
    assert everything.approves(0) and everything.approves(7) and not everything.rejects(0)
    assert not Approvals.from_annotations({"gpuhealth.dev/release": "now"}).any
