"""Helpers shared by the tests of ``decide()``, the per-node state machine: one policy (a 10m
probation, three quarantines a day before a node is flapping), a step at a time, and what a
decision said."""

from __future__ import annotations

from typing import Any

from gpuhealth.api.policy import Policy
from gpuhealth.evaluation.assess import Assessment
from gpuhealth.evaluation.transitions import Decision, Inputs, Record, decide
from tests.unit.builders import at, make_policy

POLICY = make_policy({"safety": {"probation": "10m", "flapping": {"maxQuarantines": 3, "window": "24h"}}})
PROBATION = 600


def returned(d: Decision) -> bool:
    """The decision returns the node to service (gpuhealth lifts its taint and cordon)."""
    return any(reason == "ReturnedToService" for _, reason, _ in d.events)


def decide_at(prior: Record, a: Assessment, now_s: float, policy: Policy = POLICY, **inputs: Any) -> Decision:
    """``decide()`` at T0 + ``now_s``, with ``inputs`` as the room's ``Inputs``."""
    return decide(prior, a, policy, at(now_s), Inputs(**inputs))


def reasons(d: Decision) -> list[str]:
    """The reasons of the decision's events, in order."""
    return [reason for _, reason, _ in d.events]
