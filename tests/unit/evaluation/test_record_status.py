"""The node's Record through its report's status: every field written and read back, a missing or
unreadable status read as Healthy, and every record ``decide()`` makes surviving the round trip
(the status is the state machine's only memory across restarts)."""

from __future__ import annotations

import pytest

from gpuhealth.api.names import Action, State
from gpuhealth.evaluation.assess import Assessment
from gpuhealth.evaluation.transitions import Inputs, Record, decide
from tests.unit.builders import at, clean, faulty
from tests.unit.evaluation._transitions_support import POLICY


def test_record_status_round_trip() -> None:
    rec = Record(
        state=State.DRAINING,
        reason="XID79",
        message="GPU 2: XID 79",
        since=at(10),
        quarantines=(at(0), at(10)),
        healthy_since=at(5),
        cleared_before=at(-100),
        held_by_breaker=True,
        drain_action="repair",
        drained=True,
    )
    status = rec.to_status()
    assert status == {
        "state": "Draining",
        "reason": "XID79",
        "message": "GPU 2: XID 79",
        "since": "2025-01-01T12:00:10Z",
        "quarantines": ["2025-01-01T12:00:00Z", "2025-01-01T12:00:10Z"],
        "healthySince": "2025-01-01T12:00:05Z",
        "clearedBefore": "2025-01-01T11:58:20Z",
        "heldByBreaker": True,
        "drainAction": "repair",
        "drained": True,
    }
    assert Record.from_status(status) == rec


def test_default_record_round_trip() -> None:
    status = Record().to_status()
    assert status["since"] is None and status["drainAction"] is None
    assert Record.from_status(status) == Record()


@pytest.mark.parametrize("status", [None, {}, {"state": "Bogus"}, {"state": None}])
def test_from_status_defaults_to_healthy(status: dict[str, object] | None) -> None:
    assert Record.from_status(status) == Record()


def test_from_status_drops_unreadable_quarantine_times() -> None:
    rec = Record.from_status({"state": "Quarantined", "quarantines": ["2025-01-01T12:00:00Z", "garbage", None]})
    assert rec.quarantines == (at(0),)


def test_every_decision_round_trips_through_status() -> None:
    steps: list[tuple[Assessment, Inputs]] = [
        (faulty(Action.CORDON), Inputs()),
        (faulty(Action.REPAIR), Inputs()),
        (faulty(Action.REPAIR), Inputs(drain_complete=True)),
        (clean(), Inputs(released=True)),
        (clean(), Inputs()),
    ]
    rec = Record()
    for i, (a, inputs) in enumerate(steps):
        rec = decide(rec, a, POLICY, at(i * 1000), inputs).record
        assert Record.from_status(rec.to_status()) == rec
    assert rec.state == State.HEALTHY
