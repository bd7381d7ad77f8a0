"""Proof before return at node scope (evaluation/node_validation.py): a repair's release waits for a
validation of all the node's GPUs, and a new node's burn-in holds it until its validation passes;
with the state machine (transitions.py) reading ``hold`` and ``failed``."""

from __future__ import annotations

from dataclasses import replace

from gpuhealth.api.names import Action, State
from gpuhealth.api.status import Record
from gpuhealth.api.validation import NewNodes, NodeValidation, Outcome, Trigger, ValidationSettings
from gpuhealth.evaluation.node_validation import NodeMove, NodeObserved, node_move, wants_release_validation
from tests.unit.builders import at, clean, faulty
from tests.unit.evaluation._transitions_support import PROBATION, decide_at, reasons, returned

ON = ValidationSettings(enabled=True, level=2, timeout_s=300.0, new_nodes=NewNodes(enabled=True, batch_size=2))
AWAITING = Record(state=State.AWAITING_REPAIR, reason="NodeRebootRequested", since=at(0), drained=True)
RECOVERING = Record(state=State.RECOVERING, reason="NodeRebootRequested", since=at(10), healthy_since=at(10))


def _names(m: NodeMove) -> list[str]:
    return [r for _, r, _ in m.events]


def _released(now: float = 10) -> NodeValidation:
    m = node_move(AWAITING, None, NodeObserved(released=True), at(now), ON)
    assert m.record is not None and m.hold and not m.start
    assert m.record.trigger == Trigger.RELEASE and m.record.validation.outcome == Outcome.PENDING
    assert _names(m) == ["ValidationPending"]
    return m.record


def _running(now: float = 20) -> NodeValidation:
    m = node_move(RECOVERING, _released(), NodeObserved(may_validate=True), at(now), ON)
    assert m.start and m.hold and m.record is not None and m.record.validation.outcome == Outcome.RUNNING
    assert _names(m) == ["ValidationStarted"]
    rec = m.record
    return replace(rec, validation=replace(rec.validation, job="ns/j", created=True))


def test_a_release_of_a_drained_node_asks_for_a_node_validation_and_holds_its_return() -> None:
    assert wants_release_validation(AWAITING)
    assert wants_release_validation(Record(state=State.DRAINING, drain_action=str(Action.REPAIR)))
    # a cordon-only quarantine was never drained: its workloads still run, a diagnostic would fail them
    assert not wants_release_validation(Record(state=State.QUARANTINED))
    assert not wants_release_validation(Record(state=State.DRAINING, drain_action=str(Action.DRAIN)))
    assert wants_release_validation(Record(state=State.QUARANTINED, drained=True))
    rec = _released()
    assert rec.episode == at(10)


def test_the_validation_waits_for_the_node_to_be_recovering_and_for_its_limits() -> None:
    rec = _released()
    m = node_move(AWAITING, rec, NodeObserved(may_validate=True), at(11), ON)
    assert not m.start and m.hold, "not before the release moved it to Recovering"
    m = node_move(RECOVERING, rec, NodeObserved(may_validate=False), at(12), ON)
    assert not m.start and m.hold and m.events == ()


def test_a_pass_lets_the_node_finish_its_probation() -> None:
    m = node_move(RECOVERING, _running(), NodeObserved(verdict=(Outcome.PASSED, "")), at(60), ON)
    assert not m.hold and not m.failed and m.record is not None and m.record.validation.outcome == Outcome.PASSED
    assert _names(m) == ["ValidationPassed"] and m.validated == ("Passed", 40.0)
    again = node_move(RECOVERING, m.record, NodeObserved(), at(61), ON)
    assert again.record == m.record and not again.hold and again.events == ()


def test_a_failure_sends_the_node_to_awaiting_repair_with_the_findings() -> None:
    findings = "GPU 5 pcie Fail (DCGM error 46)"
    m = node_move(RECOVERING, _running(), NodeObserved(verdict=(Outcome.FAILED, findings)), at(60), ON)
    assert m.failed == f"node validation Failed: {findings}" and not m.hold
    assert m.record is not None and m.record.validation.findings == findings
    assert _names(m) == ["ValidationFailed"] and m.validated == ("Failed", 40.0)
    d = decide_at(RECOVERING, clean(), 60, validation_failed=m.failed)
    assert d.record.state == State.AWAITING_REPAIR and findings in d.record.message
    assert reasons(d) == ["AwaitingRepair"]


def test_a_timeout_and_a_lost_pod_are_failures_with_their_own_reasons() -> None:
    run = _running()
    m = node_move(RECOVERING, run, NodeObserved(verdict=(Outcome.RUNNING, "")), at(20 + 301), ON)
    assert m.record is not None and m.record.validation.outcome == Outcome.TIMED_OUT
    assert m.stop_job == "ns/j" and "spec.validation.timeout" in m.failed
    lost = "the validation pod ended without a result (deleted, or its node was lost)"
    m = node_move(RECOVERING, run, NodeObserved(verdict=(Outcome.LOST, lost)), at(30), ON)
    assert m.record is not None and m.record.validation.outcome == Outcome.LOST and lost in m.failed
    assert m.stop_job == ""


def test_running_holds_and_a_fault_during_the_run_ends_it() -> None:
    run = _running()
    m = node_move(RECOVERING, run, NodeObserved(verdict=(Outcome.RUNNING, "")), at(30), ON)
    assert m.hold and m.record == run and m.events == ()
    relapsed = Record(state=State.DRAINING, reason="EccUncorrected", since=at(25))
    m = node_move(relapsed, run, NodeObserved(), at(30), ON)
    assert m.record is not None and m.record.validation.outcome == Outcome.FAILED and m.stop_job == "ns/j"
    assert "a fault during the run" in m.record.validation.findings and not m.failed


def test_killed_before_the_create_creates_the_recorded_job_once() -> None:
    run = _running()
    recorded = replace(run, validation=replace(run.validation, created=False))
    m = node_move(RECOVERING, recorded, NodeObserved(), at(30), ON)
    assert m.start and m.record == recorded and m.events == ()


def test_the_state_machine_does_not_return_a_node_whose_validation_holds() -> None:
    d = decide_at(RECOVERING, clean(), 10 + PROBATION, validating=True)
    assert d.record.state == State.RECOVERING and not returned(d)
    d = decide_at(d.record, clean(), 10 + 2 * PROBATION)
    assert d.record.state == State.HEALTHY and returned(d), "the pass that finds it passed returns it"


def test_a_failure_after_a_new_release_does_not_count() -> None:
    """A release supersedes the last record (its Job stopped); the old failure does not re-apply."""
    run = _running()
    m = node_move(AWAITING, run, NodeObserved(released=True), at(100), ON)
    assert m.stop_job == "ns/j" and m.record is not None and m.record.episode == at(100)
    assert m.record.validation.outcome == Outcome.PENDING and not m.failed


def test_off_or_dry_run_a_release_asks_for_nothing() -> None:
    off = ValidationSettings()
    assert node_move(AWAITING, None, NodeObserved(released=True), at(10), off) == NodeMove(None)
    assert node_move(AWAITING, None, NodeObserved(released=True, dry_run=True), at(10), ON).record is None


# --- new-node burn-in --------------------------------------------------------------------------


def test_a_new_node_is_held_by_gpuhealths_taint_until_its_burn_in_passes() -> None:
    m = node_move(Record(), None, NodeObserved(new_node=True), at(0), ON)
    assert m.taint is True and m.record is not None and m.record.held and m.record.trigger == Trigger.BURN_IN
    assert _names(m) == ["BurnInHeld"] and not m.start and not m.hold
    m = node_move(Record(), m.record, NodeObserved(may_validate=True), at(5), ON)
    assert m.start and m.record is not None and m.record.validation.outcome == Outcome.RUNNING
    run = replace(m.record, validation=replace(m.record.validation, job="ns/b", created=True))
    m = node_move(Record(), run, NodeObserved(verdict=(Outcome.RUNNING, "")), at(6), ON)
    assert m.record == run and m.taint is None
    m = node_move(Record(), run, NodeObserved(verdict=(Outcome.PASSED, "")), at(65), ON)
    assert m.taint is False and m.record is not None and not m.record.held
    assert _names(m) == ["BurnInPassed"] and m.validated == ("Passed", 60.0)


def test_a_failed_burn_in_stays_held_until_a_human_releases_it() -> None:
    held = node_move(Record(), None, NodeObserved(new_node=True), at(0), ON).record
    assert held is not None
    run = node_move(Record(), held, NodeObserved(may_validate=True), at(5), ON).record
    assert run is not None
    run = replace(run, validation=replace(run.validation, job="ns/b", created=True))
    m = node_move(Record(), run, NodeObserved(verdict=(Outcome.FAILED, "GPU 2 memory Fail")), at(60), ON)
    assert m.taint is None and m.record is not None and m.record.held and m.record.done
    assert _names(m) == ["BurnInFailed"] and "GPU 2 memory Fail" in m.events[0][2]
    # it is not retried, nor lifted, until a human releases it
    still = node_move(Record(), m.record, NodeObserved(new_node=True, may_validate=True), at(70), ON)
    assert still.record == m.record and still.taint is None and not still.start
    m = node_move(Record(), m.record, NodeObserved(released=True), at(80), ON)
    assert m.taint is False and m.record is not None and not m.record.held
    assert _names(m) == ["BurnInReleased"]


def test_a_node_already_judged_is_burned_in_only_when_labelled() -> None:
    # the reconciler says new_node only for no verdict yet or the label; without it, nothing
    assert node_move(Record(), None, NodeObserved(), at(0), ON) == NodeMove(None)
    passed = NodeValidation(Trigger.RELEASE, at(0), _running().validation)
    passed = replace(passed, validation=replace(passed.validation, outcome=Outcome.PASSED))
    m = node_move(Record(), passed, NodeObserved(new_node=True), at(10), ON)
    assert m.taint is True and m.record is not None and m.record.trigger == Trigger.BURN_IN


def test_burn_in_off_by_default_and_dry_run_announces_only() -> None:
    default = ValidationSettings(enabled=True)
    assert not default.new_nodes.enabled
    assert node_move(Record(), None, NodeObserved(new_node=True), at(0), default) == NodeMove(None)
    m = node_move(Record(), None, NodeObserved(new_node=True, dry_run=True), at(0), ON)
    assert m.taint is None and m.record is not None and m.record.dry_run and not m.record.held
    assert _names(m) == ["BurnInDryRun"]
    again = node_move(Record(), m.record, NodeObserved(new_node=True, dry_run=True, may_validate=True), at(5), ON)
    assert again.record == m.record and not again.start and again.events == ()
    enforced = node_move(Record(), m.record, NodeObserved(), at(10), ON)
    assert enforced == NodeMove(None), "a DryRun record is forgotten once the policy enforces"


def test_validation_switched_off_lifts_gpuhealths_hold() -> None:
    held = node_move(Record(), None, NodeObserved(new_node=True), at(0), ON).record
    assert held is not None
    m = node_move(Record(), held, NodeObserved(), at(10), ValidationSettings())
    assert m.taint is False and m.record is not None and not m.record.held


def test_the_record_round_trips_through_status() -> None:
    run = _running()
    assert NodeValidation.from_status(run.to_status()) == run
    held = node_move(Record(), None, NodeObserved(new_node=True), at(0), ON).record
    assert held is not None and NodeValidation.from_status(held.to_status()) == held
    assert NodeValidation.from_status({"trigger": "Nope", "episode": "2026-01-01T00:00:00Z"}) is None


def test_the_state_machine_quarantines_a_faulty_recovering_node_even_while_validating() -> None:
    d = decide_at(RECOVERING, faulty(Action.DRAIN), 30, validating=True)
    assert d.record.state == State.DRAINING


def test_a_release_seen_again_while_the_validation_runs_changes_nothing() -> None:
    run = _running()
    m = node_move(RECOVERING, run, NodeObserved(released=True, verdict=(Outcome.RUNNING, "")), at(30), ON)
    assert m.record == run and m.hold and not m.stop_job and m.events == ()
