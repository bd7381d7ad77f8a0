"""Proof before return: the ladder's Validating phase (evaluation/ladder.py) and the device gate."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

from gpuhealth.api.devices import DeviceRecord, DeviceState
from gpuhealth.api.policy import parse_policy
from gpuhealth.api.remediation import Step, StepKind
from gpuhealth.api.remediation_status import LadderRecord, Phase, Result
from gpuhealth.api.validation import Outcome, ValidationSettings
from gpuhealth.evaluation.devices import DeviceInputs, decide_devices
from gpuhealth.evaluation.ladder import GPU, Observed, advance, holds

T = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
UUID = "GPU-00000003-0000-0000-0000-000000000000"
STEPS = (Step(StepKind.GPU_RESET, 60.0, 2), Step(StepKind.NODE_REBOOT, 600.0, 1), Step(StepKind.REPLACE))
ON = ValidationSettings(enabled=True, level=2, timeout_s=300.0)


def gpu(**kw: Any) -> GPU:
    base: dict[str, Any] = dict(
        index=3,
        uuid=UUID,
        state=DeviceState.RECOVERING,
        reason="EccUncorrected",
        since=T,
        drained=True,
        taint_rule="gpuhealth-n-gpu-3",
        facts_clean=True,
    )
    base.update(kw)
    return GPU(**base)


def verifying(attempt: int = 1) -> LadderRecord:
    return LadderRecord(
        index=3,
        step=StepKind.GPU_RESET,
        attempt=attempt,
        phase=Phase.VERIFYING,
        reason="EccUncorrected",
        uuid=UUID,
        since=T,
        started=T,
        finished=T,
        job="ns/reset",
    )


def at(s: float) -> dt.datetime:
    return T + dt.timedelta(seconds=s)


def _running(now: dt.datetime) -> LadderRecord:
    """Verifying -> Validating (pending) -> started -> created, as the remediator would write it."""
    m = advance(verifying(), gpu(), STEPS, Observed(), now, ON)
    assert m.record is not None and m.record.phase == Phase.VALIDATING and not m.start_validation
    assert [e[1] for e in m.events] == ["ValidationPending"]
    m = advance(m.record, gpu(), STEPS, Observed(may_validate=True), now, ON)
    assert m.start_validation and m.record is not None and m.record.validation is not None
    v = m.record.validation
    assert v.outcome == Outcome.RUNNING and v.level == 2 and not v.created
    return replace(m.record, validation=replace(v, job="ns/validate", created=True))


def test_without_validation_a_clean_reset_succeeds_at_once() -> None:
    m = advance(verifying(), gpu(), STEPS, Observed(), at(5))
    assert m.record is not None and m.record.phase == Phase.SUCCEEDED
    m = advance(verifying(), gpu(), STEPS, Observed(), at(5), ValidationSettings())
    assert m.record is not None and m.record.phase == Phase.SUCCEEDED


def test_a_pass_is_the_steps_success() -> None:
    rec = _running(at(5))
    assert advance(rec, gpu(), STEPS, Observed(validation=(Outcome.RUNNING, "")), at(30), ON).record == rec
    m = advance(rec, gpu(), STEPS, Observed(validation=(Outcome.PASSED, "")), at(130), ON)
    assert m.record is not None and m.record.phase == Phase.SUCCEEDED
    assert m.record.validation is not None and m.record.validation.outcome == Outcome.PASSED
    assert m.record.history[-1].result == Result.SUCCEEDED
    assert m.validated == ("Passed", 125.0) and ("GPUReset", "Succeeded") in m.finished
    assert [e[1] for e in m.events] == ["ValidationPassed"]


def test_a_failure_takes_the_next_attempt_with_the_findings() -> None:
    rec = _running(at(5))
    findings = "GPU 3 memory Fail (DCGM error 12)"
    m = advance(rec, gpu(), STEPS, Observed(validation=(Outcome.FAILED, findings)), at(130), ON)
    nxt = m.record
    assert nxt is not None and nxt.phase == Phase.READY and nxt.step == StepKind.GPU_RESET and nxt.attempt == 2
    assert nxt.history[-1].result == Result.VALIDATION_FAILED
    assert nxt.validation is not None and nxt.validation.findings == findings
    assert holds(nxt, ON) and m.validated == ("Failed", 125.0)
    assert any(e[1] == "ValidationFailed" and findings in e[2] for e in m.events)


def test_the_last_attempt_failing_goes_to_the_next_step_and_replace_keeps_the_findings() -> None:
    rec = replace(_running(at(5)), attempt=2)
    m = advance(rec, gpu(), STEPS, Observed(validation=(Outcome.FAILED, "pcie")), at(130), ON)
    assert m.record is not None and m.record.step == StepKind.NODE_REBOOT and m.record.phase == Phase.HANDED_OFF
    only = (Step(StepKind.GPU_RESET, 60.0, 1), Step(StepKind.REPLACE))
    m = advance(_running(at(5)), gpu(), only, Observed(validation=(Outcome.FAILED, "pcie x8")), at(130), ON)
    assert m.record is not None and m.record.phase == Phase.AWAITING_REPAIR and "pcie x8" in m.record.message


def test_timeout_lost_and_a_fault_during_the_run_have_their_own_reasons() -> None:
    rec = _running(at(5))
    m = advance(rec, gpu(), STEPS, Observed(validation=(Outcome.RUNNING, "")), at(400), ON)
    assert m.record is not None and m.record.history[-1].result == Result.VALIDATION_TIMED_OUT
    assert m.stop_job == "ns/validate" and m.validated is not None and m.validated[0] == "TimedOut"
    m = advance(rec, gpu(), STEPS, Observed(validation=(Outcome.LOST, "gone")), at(40), ON)
    assert m.record is not None and m.record.history[-1].result == Result.VALIDATION_LOST
    faulted = gpu(state=DeviceState.QUARANTINED, since=at(20), facts_clean=False)
    m = advance(rec, faulted, STEPS, Observed(validation=(Outcome.RUNNING, "")), at(30), ON)
    assert m.record is not None and m.record.history[-1].result == Result.RELAPSED and m.stop_job == "ns/validate"


def test_killed_between_the_record_and_the_create_creates_it_once_more() -> None:
    rec = _running(at(5))
    uncreated = replace(rec, validation=replace(rec.validation, created=False)) if rec.validation else rec
    m = advance(uncreated, gpu(), STEPS, Observed(), at(6), ON)
    assert m.start_validation and m.record == uncreated


def test_waits_for_its_preconditions() -> None:
    m = advance(verifying(), gpu(), STEPS, Observed(), at(5), ON)
    again = advance(m.record, gpu(), STEPS, Observed(may_validate=False), at(50), ON)
    assert not again.start_validation and again.record == m.record


def _policy() -> Any:
    return parse_policy(
        {"metadata": {"name": "p"}, "spec": {"safety": {"probation": "30s"}, "validation": {"enabled": True}}}
    )


def test_the_device_gate_holds_a_gpu_on_probation_until_it_passes_and_requarantines_on_failure() -> None:
    rec = DeviceRecord(
        index=3, uuid=UUID, state=DeviceState.RECOVERING, since=T, healthy_since=T, drained=True, reason="Ecc"
    )
    base = DeviceInputs(uuids={3: UUID})
    late = at(600)
    free = decide_devices({3: rec}, [], _policy(), late, base)
    assert free.records[0].state == DeviceState.IN_SERVICE
    held = decide_devices({3: rec}, [], _policy(), late, replace(base, validating=frozenset({3})))
    assert held.records[0].state == DeviceState.RECOVERING
    failed = decide_devices({3: rec}, [], _policy(), late, replace(base, validation_failed={3: "pcie"}))
    out = failed.records[0]
    assert out.state == DeviceState.QUARANTINED and out.reason == "ValidationFailed" and out.drained
    assert any(e.reason == "ValidationFailed" for e in failed.events)


def test_the_pass_that_finds_clean_facts_starts_the_validation_at_once() -> None:
    m = advance(verifying(), gpu(), STEPS, Observed(may_validate=True), at(5), ON)
    assert m.start_validation and m.record is not None and m.record.phase == Phase.VALIDATING
    assert [e[1] for e in m.events] == ["ValidationPending", "ValidationStarted"]
