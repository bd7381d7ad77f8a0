"""The repair ladder: settings parsed (refusals name the field), the pure next move, the reset Job."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest

from gpuhealth.actions.remediation_jobs import build_reset_job, job_name, job_outcome, pinned_to
from gpuhealth.api.devices import DeviceState
from gpuhealth.api.policy import PolicyError, parse_policy
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.remediation import RemediationSettings, Step, StepKind
from gpuhealth.api.remediation_status import LadderRecord, Phase, Result
from gpuhealth.evaluation.ladder import GPU, REBOOT_STEPS, RESET_STEPS, Observed, advance, steps_for

T = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
UUID = "GPU-00000003-0000-0000-0000-000000000000"
STEPS = (Step(StepKind.GPU_RESET, 60.0, 2), Step(StepKind.NODE_REBOOT, 600.0, 1), Step(StepKind.REPLACE))


def policy(**remediation: Any) -> Any:
    return parse_policy({"metadata": {"name": "p"}, "spec": {"remediation": remediation}})


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


# -- settings ----------------------------------------------------------------------------------------


def test_remediation_is_off_by_default_and_defaults_match_the_crd() -> None:
    s = parse_policy({"metadata": {"name": "p"}, "spec": {}}).remediation
    assert s == RemediationSettings()
    assert not s.enabled and s.namespace == "gpuhealth-remediation" and s.max_concurrent == 1


@pytest.mark.parametrize(
    ("remediation", "field"),
    [
        ({"ladders": [{"steps": [{"type": "GPUReset"}]}]}, r"spec\.remediation\.ladders\[0\]"),
        ({"ladders": [{"reasons": ["X"], "steps": []}]}, r"spec\.remediation\.ladders\[0\]\.steps"),
        ({"ladders": [{"reasons": ["X"], "steps": [{"type": "Reboot"}]}]}, r"ladders\[0\]\.steps\[0\]\.type"),
        (
            {"ladders": [{"reasons": ["X"], "steps": [{"type": "NodeReboot"}, {"type": "GPUReset"}]}]},
            r"ladders\[0\]\.steps\[1\]\.type",
        ),
        ({"ladders": [{"reasons": ["X"], "steps": [{"type": "Replace"}, {"type": "NodeReboot"}]}]}, r"steps\[1\]"),
        ({"ladders": [{"xids": [0], "steps": [{"type": "Replace"}]}]}, r"ladders\[0\]\.xids\[0\]"),
        ({"ladders": [{"reasons": ["X"], "steps": [{"type": "GPUReset", "attempts": 9}]}]}, r"steps\[0\]\.attempts"),
        ({"ladders": [{"reasons": ["X"], "steps": [{"type": "GPUReset", "timeout": "soon"}]}]}, r"steps\[0\]\.timeout"),
        ({"maxConcurrent": 0}, r"spec\.remediation\.maxConcurrent"),
        ({"jobTemplate": {"spec": {"template": {"spec": {"containers": []}}}}}, r"jobTemplate\.spec\.template"),
    ],
)
def test_refusals_name_the_field(remediation: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError, match=field):
        policy(**remediation)


def _template(pod: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"template": {"spec": pod}}}


def test_a_template_not_pinned_to_the_node_or_not_naming_the_gpu_is_refused_at_parse() -> None:
    container = {"name": "r", "image": "i", "command": ["nvidia-smi", "-r", "-i", "${GPU_UUID}"]}
    with pytest.raises(PolicyError, match=r"jobTemplate\.spec\.template\.spec: must be pinned"):
        policy(jobTemplate=_template({"containers": [container]}))
    with pytest.raises(PolicyError, match=r"must name the GPU by \$\{GPU_UUID\}"):
        policy(jobTemplate=_template({"nodeName": "${NODE_NAME}", "containers": [{"name": "r", "image": "i"}]}))
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["${NODE_NAME}"]}
                        ]
                    }
                ]
            }
        }
    }
    ok = policy(jobTemplate=_template({"affinity": affinity, "containers": [container]})).remediation
    job, why = build_reset_job(ok, "node-a", 3, UUID, "j", 60)
    assert job is not None and not why
    assert pinned_to(job["spec"]["template"]["spec"], "node-a") and not pinned_to(job["spec"]["template"]["spec"], "b")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][-1] == UUID


def test_catalog_ladders_and_peer_draining_recovery_skips_the_reset() -> None:
    s = RemediationSettings(enabled=True)
    assert steps_for(s, "EccUncorrected") == RESET_STEPS
    assert steps_for(s, "PendingRemap") == RESET_STEPS
    assert steps_for(s, "XID48") == RESET_STEPS
    assert steps_for(s, "XID79") == REBOOT_STEPS
    assert steps_for(s, "XID154", RecoveryAction.GPU_RESET) == RESET_STEPS
    assert steps_for(s, "RowRemapFailure") == ()  # a failed remap needs a new GPU: held for a human
    assert [x.kind for x in steps_for(s, "XID154", RecoveryAction.DRAIN_AND_RESET)] == [
        StepKind.NODE_REBOOT,
        StepKind.REPLACE,
    ]
    mine = policy(enabled=True, ladders=[{"xids": [48], "steps": [{"type": "Replace"}]}]).remediation
    assert [x.kind for x in steps_for(mine, "XID48")] == [StepKind.REPLACE]
    assert steps_for(mine, "EccUncorrected") == RESET_STEPS  # no ladder names it: the catalog's


# -- the pure ladder ---------------------------------------------------------------------------------


def test_a_reset_starts_only_when_drained_held_out_and_admitted() -> None:
    assert advance(None, gpu(drained=False), STEPS, Observed(may_start=True), T).record is None
    assert advance(None, gpu(taint_rule=""), STEPS, Observed(may_start=True), T).record is None
    assert advance(None, gpu(), STEPS, Observed(may_start=False), T).record is None
    move = advance(None, gpu(), STEPS, Observed(may_start=True), T)
    assert move.start == StepKind.GPU_RESET
    assert move.record is not None and move.record.phase == Phase.PENDING and move.record.attempt == 1
    assert move.record.fault_since == T and move.record.since == T


def test_success_needs_the_job_and_clean_facts() -> None:
    rec = advance(None, gpu(), STEPS, Observed(may_start=True), T).record
    assert rec is not None
    running = advance(rec, gpu(), STEPS, Observed(job="Running"), T + dt.timedelta(seconds=5))
    assert running.record is not None and running.record.phase == Phase.RUNNING and running.start is None
    done = advance(running.record, gpu(), STEPS, Observed(job="Succeeded"), T + dt.timedelta(seconds=10))
    assert done.record is not None and done.record.phase == Phase.VERIFYING
    clean = advance(done.record, gpu(facts_clean=True), STEPS, Observed(), T + dt.timedelta(seconds=12))
    assert clean.record is not None and clean.record.phase == Phase.SUCCEEDED
    assert clean.finished == (("GPUReset", "Succeeded"),)
    # Back in service (after probation): the record goes, the MTTR is measured from the fault.
    back = advance(clean.record, gpu(state=DeviceState.IN_SERVICE), STEPS, Observed(), T + dt.timedelta(seconds=40))
    assert back.record is None and back.back_in_service == 40.0


def test_a_job_that_succeeds_but_leaves_the_fault_fails_after_the_timeout() -> None:
    rec = LadderRecord(3, StepKind.GPU_RESET, phase=Phase.VERIFYING, started=T, finished=T, since=T)
    assert advance(rec, gpu(), STEPS, Observed(), T + dt.timedelta(seconds=30)).record == rec
    move = advance(rec, gpu(), STEPS, Observed(), T + dt.timedelta(seconds=61))
    assert move.record is not None and move.record.attempt == 2 and move.record.phase == Phase.READY
    assert move.record.history[-1].result == Result.NOT_CLEAN


def test_failures_climb_reset_twice_then_reboot_then_replace() -> None:
    rec = LadderRecord(3, StepKind.GPU_RESET, phase=Phase.RUNNING, started=T, since=T, job="ns/j1")
    first = advance(rec, gpu(), STEPS, Observed(job="Failed"), T)
    assert first.record is not None and (first.record.step, first.record.attempt) == (StepKind.GPU_RESET, 2)
    assert first.record.job == "" and first.start is None  # the retry waits for its preconditions
    again = advance(first.record, gpu(), STEPS, Observed(may_start=True), T)
    assert again.start == StepKind.GPU_RESET
    assert again.record is not None
    timed = advance(
        replace(again.record, phase=Phase.RUNNING, job="ns/j2"),
        gpu(),
        STEPS,
        Observed(job="Running"),
        T + dt.timedelta(seconds=61),
    )
    assert timed.stop_job == "ns/j2"  # an attempt past its timeout is stopped
    assert timed.record is not None and timed.record.step == StepKind.NODE_REBOOT
    assert timed.record.phase == Phase.HANDED_OFF
    assert [e[1] for e in timed.events] == ["RemediationFailed", "NodeRebootRequested"]
    # The node was released after the hand-off, but the fault is still there: Replace.
    handed = timed.record
    later = T + dt.timedelta(seconds=120)
    still = advance(handed, gpu(), STEPS, Observed(node_cleared=later), later)
    assert still.record is not None and still.record.step == StepKind.REPLACE
    assert still.record.phase == Phase.AWAITING_REPAIR
    assert [(a.step, a.result) for a in still.record.history] == [
        (StepKind.GPU_RESET, Result.FAILED),
        (StepKind.GPU_RESET, Result.TIMED_OUT),
        (StepKind.NODE_REBOOT, Result.NOT_CLEAN),
    ]
    assert ("Replace", "HandedOff") in still.finished
    # A release of the GPU by a human ends the ladder.
    assert (
        advance(still.record, gpu(state=DeviceState.AWAITING_REPAIR), STEPS, Observed(released=True), later).record
        is None
    )


def test_a_reboot_hand_off_that_worked_succeeds_from_the_release() -> None:
    rec = LadderRecord(3, StepKind.NODE_REBOOT, phase=Phase.HANDED_OFF, started=T, since=T)
    assert advance(rec, gpu(facts_clean=True), STEPS, Observed(), T).record == rec  # not released yet
    released = T + dt.timedelta(seconds=5)
    move = advance(rec, gpu(facts_clean=True), STEPS, Observed(node_cleared=released), released)
    assert move.record is not None and move.record.phase == Phase.SUCCEEDED and move.record.finished == released


def test_a_relapse_after_a_successful_reset_is_that_reset_failing() -> None:
    rec = LadderRecord(3, StepKind.GPU_RESET, phase=Phase.SUCCEEDED, started=T, finished=T, since=T)
    relapsed = gpu(state=DeviceState.DRAINING, since=T + dt.timedelta(seconds=3))
    move = advance(rec, relapsed, STEPS, Observed(), T + dt.timedelta(seconds=3))
    assert move.record is not None and move.record.attempt == 2 and move.record.history[-1].result == Result.RELAPSED


def test_a_killed_create_is_retried_once_and_a_lost_job_is_a_failure() -> None:
    pending = LadderRecord(3, StepKind.GPU_RESET, phase=Phase.PENDING, started=T, since=T, job="ns/j")
    assert advance(pending, gpu(), STEPS, Observed(job="Absent"), T).start == StepKind.GPU_RESET
    found = advance(pending, gpu(), STEPS, Observed(job="Running"), T)
    assert found.start is None and found.record is not None and found.record.phase == Phase.RUNNING
    lost = advance(replace(pending, phase=Phase.RUNNING), gpu(), STEPS, Observed(job="Absent"), T)
    assert lost.record is not None and lost.record.history[-1].result == Result.LOST


def test_dry_run_records_what_it_would_do_once() -> None:
    move = advance(None, gpu(state=DeviceState.DRAINING, drained=False), STEPS, Observed(dry_run=True), T)
    assert move.record is not None and move.record.phase == Phase.DRY_RUN and move.start is None
    assert [e[1] for e in move.events] == ["RemediationDryRun"]
    again = advance(move.record, gpu(), STEPS, Observed(dry_run=True), T)
    assert again.record == move.record and not again.events


# -- the Job -----------------------------------------------------------------------------------------


def test_the_default_job_resets_that_gpu_on_that_node_only() -> None:
    s = RemediationSettings(enabled=True)
    name = job_name("node-a", 3, UUID, "2026-01-01T12:00:00Z", 1)
    assert name == job_name("node-a", 3, UUID, "2026-01-01T12:00:00Z", 1)  # deterministic
    assert name != job_name("node-a", 3, UUID, "2026-01-01T12:00:00Z", 2)
    assert name != job_name("node-a", 3, UUID, "2026-01-02T12:00:00Z", 1)  # another ladder
    assert len(job_name("n" * 253, 63, UUID, "e", 5)) <= 63
    job, why = build_reset_job(s, "node-a", 3, UUID, name, 600)
    assert job is not None and not why
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeName"] == "node-a"
    (c,) = pod["containers"]
    assert c["command"] == ["nvidia-smi", "-r", "-i", UUID]
    assert {e["name"]: e["value"] for e in c["env"]} == {
        "NVIDIA_VISIBLE_DEVICES": UUID,
        "NVIDIA_DRIVER_CAPABILITIES": "utility",
    }
    assert {"key": "gpuhealth.dev/unhealthy", "operator": "Exists"} in pod["tolerations"]
    assert pod["serviceAccountName"] == "gpuhealth-remediation" and pod["automountServiceAccountToken"] is False
    assert job["metadata"]["namespace"] == "gpuhealth-remediation"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 600
    assert job["spec"]["template"]["metadata"]["labels"]["gpuhealth.dev/remediation-step"] == "GPUReset"
    assert build_reset_job(s, "node-a", 3, "", name, 600)[0] is None  # no UUID, no reset


def test_a_rendered_template_that_loses_the_pinning_gets_no_job() -> None:
    """A template may pass parsing and still render wrong (a hard-coded node): no Job, a reason."""
    s = RemediationSettings(
        enabled=True,
        job_template=_template(
            {
                "nodeName": "${NODE_NAME}-other",
                "containers": [{"name": "r", "image": "i", "args": ["${GPU_UUID}"]}],
            }
        ),
    )
    job, why = build_reset_job(s, "node-a", 3, UUID, "j", 60)
    assert job is None and "not pinned to node node-a" in why


def test_job_outcome_reads_the_conditions() -> None:
    assert job_outcome(None) == "Absent"
    assert job_outcome({"status": {}}) == "Running"
    assert job_outcome({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}) == "Succeeded"
    assert job_outcome({"status": {"conditions": [{"type": "Failed", "status": "True"}]}}) == "Failed"
    assert job_outcome({"status": {"conditions": [{"type": "Failed", "status": "False"}]}}) == "Running"
