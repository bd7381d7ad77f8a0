"""``time_dependent``: which nodes the sweeper passes every tick.

The rule that matters at scale: a node that only holds GPUs out, each in a state no clock moves, is
left to its events (a fleet with many GPUs held out must not pass all of their nodes every tick),
while every state the clock can change still gets its pass.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from gpuhealth.api.names import Signal, State
from gpuhealth.api.status import Record
from gpuhealth.evaluation.rules import time_dependent
from tests.unit.builders import make_policy

NOW = dt.datetime(2026, 12, 2, 6, 0, tzinfo=dt.UTC)
FRESH = "2026-12-02T05:59:50Z"


def _report(devices: list[dict[str, Any]] | None = None, **status: Any) -> dict[str, Any]:
    return {
        "spec": {"heartbeatTime": FRESH, "devices": [{"index": i} for i in range(8)]},
        "status": {"devices": devices or [], **status},
    }


def _held(state: str = "Quarantined", **extra: Any) -> list[dict[str, Any]]:
    return [{"index": 0, "state": "InService"}, {"index": 3, "state": state, **extra}]


POLICY = make_policy()  # silence after the default agentSilence: a heartbeat 10 s old is fresh
DEGRADED = Record(state=State.DEGRADED, reason=Signal.DEVICE_QUARANTINED)


@pytest.mark.parametrize("state", ["Quarantined", "AwaitingRepair"])
def test_a_node_that_only_holds_gpus_out_waits_for_events(state: str) -> None:
    assert not time_dependent(DEGRADED, _report(_held(state)), POLICY, NOW)


@pytest.mark.parametrize("state", ["Recovering", "Draining"])
def test_a_gpu_on_probation_or_draining_keeps_its_node_on_the_clock(state: str) -> None:
    assert time_dependent(DEGRADED, _report(_held(state)), POLICY, NOW)


def test_a_gpu_waiting_for_the_breakers_budget_keeps_its_node_on_the_clock() -> None:
    devices = [{"index": 0, "state": "InService", "heldByBreaker": True}, {"index": 3, "state": "Quarantined"}]
    assert time_dependent(DEGRADED, _report(devices), POLICY, NOW)


@pytest.mark.parametrize("phase", ["Ready", "Pending", "Running", "Verifying"])
def test_a_ladder_step_under_way_keeps_its_node_on_the_clock(phase: str) -> None:
    report = _report(_held(), remediation={"3": {"phase": phase, "step": "GPUReset"}})
    assert time_dependent(DEGRADED, report, POLICY, NOW)


@pytest.mark.parametrize("phase", ["HandedOff", "Succeeded", "AwaitingRepair", "DryRun"])
def test_a_ladder_that_waits_on_someone_else_does_not(phase: str) -> None:
    report = _report(_held(), remediation={"3": {"phase": phase, "step": "GPUReset"}})
    assert not time_dependent(DEGRADED, report, POLICY, NOW)


def test_degraded_for_anything_but_held_out_gpus_keeps_its_windows_on_the_clock() -> None:
    rec = Record(state=State.DEGRADED, reason=str(Signal.XID))
    assert time_dependent(rec, _report(_held()), POLICY, NOW)


@pytest.mark.parametrize(
    "status",
    [{"devices": "garbage"}, {"devices": [7]}, {"devices": [], "remediation": ["x"]}, {"remediation": {"3": 1}}],
)
def test_an_unreadable_status_keeps_the_node_on_the_clock(status: dict[str, Any]) -> None:
    report = {"spec": {"heartbeatTime": FRESH}, "status": status}
    assert time_dependent(DEGRADED, report, POLICY, NOW)


def test_a_steady_hold_out_still_notices_a_silent_agent_and_sustained_heat() -> None:
    silent = _report(_held())
    silent["spec"]["heartbeatTime"] = "2026-12-02T05:00:00Z"
    assert time_dependent(DEGRADED, silent, POLICY, NOW)
    assert time_dependent(DEGRADED, _report(_held(), pending={"0/heat": FRESH}), POLICY, NOW)


def test_the_other_clock_states_are_unchanged() -> None:
    for state in (State.RECOVERING, State.DRAINING):
        assert time_dependent(Record(state=state), _report(), POLICY, NOW)
    assert time_dependent(Record(state=State.HEALTHY, held_by_breaker=True), _report(), POLICY, NOW)
    assert not time_dependent(Record(state=State.HEALTHY), _report(), POLICY, NOW)
    assert time_dependent(None, _report(), POLICY, NOW)


@pytest.mark.parametrize(("reasons", "timed"), [(0x80, True), (0x8, True), (0x40, True), (0x20, False), (0x1, False)])
def test_a_healthy_node_under_a_clock_reason_a_rule_times_is_on_the_clock(reasons: int, timed: bool) -> None:
    """Power brake, HW slowdown and HW thermal become findings once held for their sustainedFor."""
    report = _report()
    report["spec"]["devices"][2]["clockEventReasons"] = reasons
    assert time_dependent(Record(state=State.HEALTHY), report, POLICY, NOW) is timed


def test_a_counter_remembered_in_pending_is_memory_not_a_wait() -> None:
    """The fabric rules keep a counter's last value under ``count/...`` (evaluation/fabric_rules.py): no
    tick re-passes the node for it."""
    healthy = Record(state=State.HEALTHY)
    assert not time_dependent(healthy, _report(pending={"count/nic/mlx5_0/1/link_downed": "2"}), POLICY, NOW)
    assert time_dependent(
        healthy, _report(pending={"count/nic/mlx5_0/1/link_downed": "2", "0/heat": FRESH}), POLICY, NOW
    )
