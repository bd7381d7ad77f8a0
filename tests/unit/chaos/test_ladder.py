"""The ladder_kills invariants fire on a violating history and stay quiet on a clean one."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hack.chaos.ladder import (
    Holding,
    JobCreate,
    LadderSample,
    duplicate_reset_jobs,
    job_creates,
    ladder_regressions,
    parse_job_name,
    resets_while_held,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
J1 = "gpuhealth-reset-n1-3-1-0123abcd"
J1_OTHER_EPISODE_NAME = "gpuhealth-reset-n1-3-1-89abcdef"
J2 = "gpuhealth-reset-n1-3-2-fedcba98"


def at(s: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def rec(step: str, attempt: int, phase: str, since: str = "e1", history: int = 0) -> dict[str, Any]:
    return {"step": step, "attempt": attempt, "phase": phase, "since": since, "history": [{}] * history}


def sample(s: float, record: dict[str, Any] | None, state: str = "Quarantined") -> LadderSample:
    return LadderSample(at(s), "n1", 3, record, state)


def test_job_names_parse_to_node_gpu_and_attempt() -> None:
    assert parse_job_name(J1) == ("n1", 3, 1)
    assert parse_job_name("gpuhealth-reset-a-b-12-7-2-0123abcd") == ("a-b-12", 7, 2)
    assert parse_job_name("someone-elses-job") is None


def test_job_creates_are_read_from_the_audit_log() -> None:
    audit = [
        {
            "verb": "create",
            "objectRef": {"resource": "jobs", "namespace": "gpuhealth-remediation", "name": J1},
            "responseStatus": {"code": 201},
            "requestReceivedTimestamp": "2026-01-01T00:00:05.000000Z",
        },
        {"verb": "get", "objectRef": {"resource": "jobs", "namespace": "gpuhealth-remediation", "name": J1}},
        {"verb": "create", "objectRef": {"resource": "jobs", "namespace": "other", "name": J2}},
    ]
    assert job_creates(audit, "gpuhealth-remediation") == [JobCreate(J1, at(5), 201)]


def test_one_job_per_attempt_and_conflicting_repeats_are_clean() -> None:
    creates = [JobCreate(J1, at(1), 201), JobCreate(J1, at(2), 409), JobCreate(J2, at(9), 201)]
    live = [{"metadata": {"name": J1, "uid": "u1"}}, {"metadata": {"name": J2, "uid": "u2"}}]
    assert duplicate_reset_jobs(creates, live) == []


def test_two_jobs_for_one_gpu_attempt_fire() -> None:
    twice = [JobCreate(J1, at(1), 201), JobCreate(J1, at(5), 201)]  # deleted and made again
    assert "2 reset Jobs created for n1 GPU 3 attempt 1" in duplicate_reset_jobs(twice)[0]
    other = [JobCreate(J1, at(1), 201), JobCreate(J1_OTHER_EPISODE_NAME, at(5), 201)]  # a second reset
    assert duplicate_reset_jobs(other)
    live = [{"metadata": {"name": J1, "uid": "u1"}}, {"metadata": {"name": J1_OTHER_EPISODE_NAME, "uid": "u2"}}]
    assert "2 reset Jobs exist for n1 GPU 3 attempt 1" in duplicate_reset_jobs([], live)[0]


def test_a_climbing_ladder_and_a_new_episode_after_service_are_clean() -> None:
    seq = [
        sample(0, rec("GPUReset", 1, "Pending")),
        sample(1, rec("GPUReset", 1, "Running")),
        sample(2, rec("GPUReset", 2, "Ready", history=1)),
        sample(3, rec("GPUReset", 2, "Running", history=1)),
        sample(4, rec("NodeReboot", 1, "HandedOff", history=2)),
        sample(5, rec("NodeReboot", 1, "Succeeded", history=3), "Recovering"),
        sample(6, None, "InService"),
        sample(7, rec("GPUReset", 1, "Pending", since="e2")),
    ]
    assert ladder_regressions(seq) == []


def test_a_ladder_going_back_fires() -> None:
    seq = [sample(0, rec("GPUReset", 2, "Running", history=1)), sample(1, rec("GPUReset", 1, "Pending"))]
    assert "went back from GPUReset attempt 2 Running" in ladder_regressions(seq)[0]
    phase = [sample(0, rec("GPUReset", 1, "Verifying")), sample(1, rec("GPUReset", 1, "Running"))]
    assert ladder_regressions(phase)
    # The record vanished across a kill and came back lower, the GPU never in service in between.
    gap = [
        sample(0, rec("NodeReboot", 1, "HandedOff", history=2)),
        sample(1, None),
        sample(2, rec("GPUReset", 1, "Ready")),
    ]
    assert ladder_regressions(gap)


def test_an_episode_begun_again_without_service_fires() -> None:
    seq = [
        sample(0, rec("GPUReset", 2, "Running", history=1)),
        sample(1, None, "Quarantined"),
        sample(2, rec("GPUReset", 1, "Pending", since="e2")),
    ]
    assert "its ladder began again" in ladder_regressions(seq)[0]


def test_a_reset_after_the_pod_left_is_clean() -> None:
    holds = [Holding(at(1), "n1", 3, "ns/p"), Holding(at(2), "n1", 3, "ns/p"), Holding(at(9), "n1", 4, "ns/q")]
    assert resets_while_held([JobCreate(J1, at(3), 201)], holds) == []
    # A refused create made no Job.
    assert resets_while_held([JobCreate(J1, at(1.5), 409)], holds) == []


def test_a_reset_while_a_pod_holds_the_gpu_fires() -> None:
    holds = [Holding(at(1), "n1", 3, "ns/p"), Holding(at(4), "n1", 3, "ns/p")]
    found = resets_while_held([JobCreate(J1, at(3), 201)], holds)
    assert len(found) == 1 and "while pod ns/p held the GPU" in found[0]
