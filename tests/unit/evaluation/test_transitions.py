"""decide(): the per-node state machine, step by step."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.api.names import Action, Signal, State
from gpuhealth.api.policy import Policy
from gpuhealth.evaluation.assess import Assessment
from gpuhealth.evaluation.transitions import Decision, Inputs, Record, decide
from tests.unit.builders import at, clean, faulty, finding, make_policy, unknown


def returned(d: Decision) -> bool:
    """The decision returns the node to service (gpuhealth lifts its taint and cordon)."""
    return any(reason == "ReturnedToService" for _, reason, _ in d.events)


POLICY = make_policy({"safety": {"probation": "10m", "flapping": {"maxQuarantines": 3, "window": "24h"}}})
PROBATION = 600


def _decide(prior: Record, a: Assessment, now_s: float, policy: Policy = POLICY, **inputs: Any) -> Decision:
    return decide(prior, a, policy, at(now_s), Inputs(**inputs))


def _reasons(d: Decision) -> list[str]:
    return [reason for _, reason, _ in d.events]


# --- from service into quarantine --------------------------------------------------------------


def test_clean_healthy_stays_healthy_quietly() -> None:
    d = _decide(Record(), clean(), 0)
    assert d.record == Record()
    assert (d.new_quarantine, d.events) == (False, ())


def test_cordon_level_fault_quarantines() -> None:
    d = _decide(Record(), faulty(Action.CORDON, Signal.THERMAL), 5)
    r = d.record
    assert r.state == State.QUARANTINED
    assert r.reason == "Thermal"
    assert (r.since, r.quarantines, r.drain_action, r.held_by_breaker) == (at(5), (at(5),), "", False)
    assert d.new_quarantine and not returned(d)
    assert _reasons(d) == ["Quarantined"]
    assert r.out_of_service


@pytest.mark.parametrize("level", [Action.DRAIN, Action.REPAIR])
def test_drain_or_repair_level_fault_goes_straight_to_draining(level: Action) -> None:
    d = _decide(Record(), faulty(level), 5)
    assert d.record.state == State.DRAINING
    assert d.record.drain_action == str(level)
    assert d.new_quarantine
    assert _reasons(d) == ["Quarantined"]


def test_xid_reason_is_the_code() -> None:
    a = Assessment(findings=(finding(Action.DRAIN, Signal.XID, 2, code=79),))
    assert _decide(Record(), a, 0).record.reason == "XID79"


@pytest.mark.parametrize("action", [Action.IGNORE, Action.OBSERVE])
def test_below_cordon_never_quarantines(action: Action) -> None:
    d = _decide(Record(), faulty(action), 0)
    assert not d.record.out_of_service
    assert not d.new_quarantine


def test_observe_findings_make_degraded_once() -> None:
    d1 = _decide(Record(), faulty(Action.OBSERVE, Signal.XID), 0)
    assert d1.record.state == State.DEGRADED
    assert _reasons(d1) == ["Degraded"]
    d2 = _decide(d1.record, faulty(Action.OBSERVE, Signal.XID), 10)
    assert d2.record == d1.record and d2.events == ()
    d3 = _decide(d2.record, clean(), 20)
    assert d3.record.state == State.HEALTHY
    assert _reasons(d3) == ["Healthy"]


# --- circuit breaker ---------------------------------------------------------------------------


def test_breaker_refusal_holds_back_as_degraded_with_one_event() -> None:
    d1 = _decide(Record(), faulty(Action.DRAIN), 0, breaker_allows=False)
    r1 = d1.record
    assert r1.state == State.DEGRADED
    assert r1.held_by_breaker
    assert not r1.out_of_service
    assert not d1.new_quarantine
    assert r1.quarantines == ()
    assert _reasons(d1) == ["QuarantineHeldBack"]
    assert "breaker is open" in r1.message

    d2 = _decide(r1, faulty(Action.DRAIN), 30, breaker_allows=False)
    assert d2.record.state == State.DEGRADED and d2.record.held_by_breaker
    assert d2.record.since == at(0)  # still the same hold
    assert d2.events == ()  # not repeated


def test_held_node_quarantines_once_the_breaker_allows() -> None:
    held = _decide(Record(), faulty(Action.CORDON), 0, breaker_allows=False).record
    d = _decide(held, faulty(Action.CORDON), 60)
    assert d.record.state == State.QUARANTINED
    assert not d.record.held_by_breaker
    assert d.new_quarantine


def test_held_node_whose_fault_clears_is_healthy_again() -> None:
    held = _decide(Record(), faulty(Action.CORDON), 0, breaker_allows=False).record
    d = _decide(held, clean(), 60)
    assert d.record.state == State.HEALTHY
    assert not d.record.held_by_breaker


def test_breaker_is_not_consulted_for_nodes_already_out_of_service() -> None:
    q = _decide(Record(), faulty(Action.CORDON), 0).record
    d = _decide(q, faulty(Action.DRAIN), 10, breaker_allows=False)
    assert d.record.state == State.DRAINING


# --- escalation and drains ---------------------------------------------------------------------


@pytest.mark.parametrize("level", [Action.DRAIN, Action.REPAIR])
def test_quarantined_escalates_to_draining(level: Action) -> None:
    q = _decide(Record(), faulty(Action.CORDON), 0).record
    d = _decide(q, faulty(level), 10)
    assert d.record.state == State.DRAINING
    assert d.record.drain_action == str(level)
    assert not d.new_quarantine  # the same episode
    assert d.record.quarantines == (at(0),)
    assert _reasons(d) == ["Draining"]


def test_quarantined_with_cordon_level_stays_quietly() -> None:
    q = _decide(Record(), faulty(Action.CORDON), 0).record
    d = _decide(q, faulty(Action.CORDON), 10)
    assert d.record.state == State.QUARANTINED
    assert d.events == ()


def test_draining_waits_for_the_drain() -> None:
    dr = _decide(Record(), faulty(Action.DRAIN), 0).record
    d = _decide(dr, faulty(Action.DRAIN), 10)
    assert d.record.state == State.DRAINING and d.events == ()


def test_drain_complete_returns_to_quarantined() -> None:
    dr = _decide(Record(), faulty(Action.DRAIN), 0).record
    d = _decide(dr, faulty(Action.DRAIN), 10, drain_complete=True)
    assert d.record.state == State.QUARANTINED
    assert d.record.since == at(10)
    assert _reasons(d) == ["DrainComplete"]
    assert not returned(d)


def test_drain_complete_for_a_repair_awaits_repair() -> None:
    dr = _decide(Record(), faulty(Action.REPAIR), 0).record
    d = _decide(dr, faulty(Action.REPAIR), 10, drain_complete=True)
    assert d.record.state == State.AWAITING_REPAIR
    assert _reasons(d) == ["DrainComplete"]


def test_a_release_during_a_repair_drain_counts_once_the_drain_is_done() -> None:
    """A remediator that rebooted a node early releases it while gpuhealth still drains it: the
    release is acknowledged at once, so the node must not then park in AwaitingRepair (found by the
    ladder_kills chaos scenario)."""
    dr = _decide(Record(), faulty(Action.REPAIR), 0).record
    mid = _decide(dr, clean(), 5, released=True)
    assert mid.record.state == State.DRAINING  # the pods still leave first
    done = _decide(mid.record, clean(), 10, drain_complete=True)
    assert done.record.state == State.RECOVERING and done.record.drained
    assert _reasons(done) == ["Released"]
    # A release from before this quarantine began does not count for it.
    early = _decide(Record(cleared_before=at(-5)), faulty(Action.REPAIR), 0).record
    assert _decide(early, faulty(Action.REPAIR), 10, drain_complete=True).record.state == State.AWAITING_REPAIR


def test_after_drain_complete_the_same_fault_does_not_drain_again() -> None:
    dr = _decide(Record(), faulty(Action.DRAIN), 0).record
    q = _decide(dr, faulty(Action.DRAIN), 10, drain_complete=True).record
    assert q.state == State.QUARANTINED
    d = _decide(q, faulty(Action.DRAIN), 20, drain_complete=True)
    assert d.record.state == State.QUARANTINED
    assert d.events == ()


def test_escalation_to_repair_during_a_drain_awaits_repair() -> None:
    dr = _decide(Record(), faulty(Action.DRAIN), 0).record
    mid = _decide(dr, faulty(Action.REPAIR), 5).record
    d = _decide(mid, faulty(Action.REPAIR), 10, drain_complete=True)
    assert d.record.state == State.AWAITING_REPAIR


# --- recovery and probation --------------------------------------------------------------------


def _quarantined(now_s: float = 0) -> Record:
    return _decide(Record(), faulty(Action.CORDON), now_s).record


def test_clean_facts_start_probation_then_return_to_service() -> None:
    q = _quarantined(0)
    d1 = _decide(q, clean(), 100)
    assert d1.record.state == State.RECOVERING
    assert d1.record.healthy_since == at(100)
    assert d1.record.out_of_service
    assert _reasons(d1) == ["Recovering"]
    assert not returned(d1)

    d2 = _decide(d1.record, clean(), 100 + PROBATION - 1)
    assert d2.record.state == State.RECOVERING and not returned(d2) and d2.events == ()

    d3 = _decide(d2.record, clean(), 100 + PROBATION)
    assert d3.record.state == State.HEALTHY
    assert returned(d3)
    assert _reasons(d3) == ["ReturnedToService"]
    assert (d3.record.reason, d3.record.healthy_since, d3.record.drain_action) == ("", None, "")
    assert not d3.record.out_of_service


def test_draining_node_whose_facts_clear_recovers() -> None:
    dr = _decide(Record(), faulty(Action.DRAIN), 0).record
    assert _decide(dr, clean(), 10).record.state == State.RECOVERING


def test_observe_findings_do_not_interrupt_probation() -> None:
    rec = _decide(_quarantined(0), clean(), 10).record
    d = _decide(rec, faulty(Action.OBSERVE), 10 + PROBATION)
    assert d.record.state == State.HEALTHY and returned(d)


def test_unknown_while_recovering_resets_probation_and_never_returns_to_service() -> None:
    rec = _decide(_quarantined(0), clean(), 10).record
    d = _decide(rec, unknown(), 10 + PROBATION)
    assert d.record.state == State.RECOVERING
    assert d.record.healthy_since is None
    assert not returned(d)
    d = _decide(d.record, unknown(), 10 + 5 * PROBATION)
    assert d.record.state == State.RECOVERING and not returned(d)
    # Fresh facts restart the clock: a whole probation is needed from here.
    d = _decide(d.record, clean(), 10_000)
    assert d.record.state == State.RECOVERING and d.record.healthy_since == at(10_000)
    assert _decide(d.record, clean(), 10_000 + PROBATION - 1).record.state == State.RECOVERING
    assert _decide(d.record, clean(), 10_000 + PROBATION).record.state == State.HEALTHY


def test_unknown_while_quarantined_stays_quarantined() -> None:
    d = _decide(_quarantined(0), unknown(), 100)
    assert d.record.state == State.QUARANTINED
    assert not returned(d)


def test_relapse_during_recovering_quarantines_again_and_counts() -> None:
    rec = _decide(_quarantined(0), clean(), 10).record
    d = _decide(rec, faulty(Action.CORDON), 20)
    assert d.record.state == State.QUARANTINED
    assert d.new_quarantine
    assert d.record.quarantines == (at(0), at(20))
    assert d.record.healthy_since is None
    assert _reasons(d) == ["Quarantined"]
    assert "Relapsed during probation" in d.events[0][2]


def test_relapse_with_drain_level_goes_to_draining() -> None:
    rec = _decide(_quarantined(0), clean(), 10).record
    d = _decide(rec, faulty(Action.DRAIN), 20, breaker_allows=False)  # already counted: no breaker
    assert d.record.state == State.DRAINING


# --- flapping ----------------------------------------------------------------------------------


def _cycle(rec: Record, start_s: float) -> Record:
    """Quarantine (or relapse) at start_s, then clean facts 10s later."""
    rec = _decide(rec, faulty(Action.CORDON), start_s).record
    if rec.state == State.AWAITING_REPAIR:
        return rec
    return _decide(rec, clean(), start_s + 10).record


def test_nth_quarantine_within_the_window_awaits_repair() -> None:
    rec = _cycle(Record(), 0)
    rec = _cycle(rec, 100)
    assert rec.state == State.RECOVERING and len(rec.quarantines) == 2
    d = _decide(rec, faulty(Action.CORDON), 200)
    assert d.record.state == State.AWAITING_REPAIR
    assert d.record.reason == "Flapping"
    assert d.record.quarantines == (at(0), at(100), at(200))
    assert d.record.drain_action == "repair"
    assert d.new_quarantine
    assert _reasons(d) == ["Flapping"]


def test_quarantines_outside_the_window_are_forgotten() -> None:
    day = 86400
    rec = _cycle(Record(), 0)
    rec = _cycle(rec, 100)
    rec = _decide(rec, clean(), 100 + PROBATION + 20).record
    assert rec.state == State.HEALTHY
    d = _decide(rec, faulty(Action.CORDON), day + 50)  # the first one is now older than 24h
    assert d.record.state == State.QUARANTINED
    assert d.record.quarantines == (at(100), at(day + 50))


def test_flapping_from_service_with_max_one() -> None:
    policy = make_policy({"safety": {"flapping": {"maxQuarantines": 1}}})
    d = _decide(Record(), faulty(Action.CORDON), 0, policy)
    assert d.record.state == State.AWAITING_REPAIR and d.record.reason == "Flapping"


# --- awaiting repair and release ---------------------------------------------------------------


def _awaiting() -> Record:
    dr = _decide(Record(), faulty(Action.REPAIR), 0).record
    rec = _decide(dr, faulty(Action.REPAIR), 10, drain_complete=True).record
    assert rec.state == State.AWAITING_REPAIR
    return rec


@pytest.mark.parametrize("a", [clean(), unknown(), faulty(Action.CORDON), faulty(Action.REPAIR)])
def test_awaiting_repair_stays_without_a_release(a: Assessment) -> None:
    rec = _awaiting()
    for t in (100, 10_000, 10_000_000):
        d = _decide(rec, a, t, drain_complete=True)
        assert d.record.state == State.AWAITING_REPAIR
        assert not returned(d) and not d.new_quarantine and d.events == ()
        rec = d.record


def test_release_moves_to_recovering_and_clears_history() -> None:
    rec = _awaiting()
    d = _decide(rec, clean(), 1000, released=True)
    r = d.record
    assert r.state == State.RECOVERING
    assert r.quarantines == ()
    assert r.cleared_before == at(1000)
    assert r.reason == rec.reason, "the taint keeps naming the fault, not the release"
    assert "released by a human" in r.message
    assert r.healthy_since == at(1000)  # this clean report starts the probation
    assert _reasons(d) == ["Released"]
    assert not returned(d)
    d2 = _decide(r, clean(), 1000 + PROBATION)
    assert d2.record.state == State.HEALTHY and returned(d2)


def test_release_with_unknown_facts_does_not_start_probation() -> None:
    d = _decide(_awaiting(), unknown(), 1000, released=True)
    assert d.record.state == State.RECOVERING
    assert d.record.healthy_since is None


def test_release_while_the_fault_persists_relapses() -> None:
    d = _decide(_awaiting(), faulty(Action.CORDON), 1000, released=True)
    assert d.record.state == State.QUARANTINED
    assert d.record.quarantines == (at(1000),)  # history was cleared by the release
    assert _reasons(d) == ["Released", "Quarantined"]


def test_release_of_a_healthy_node_only_clears_evidence() -> None:
    d = _decide(Record(), clean(), 50, released=True)
    assert d.record.state == State.HEALTHY
    assert d.record.cleared_before == at(50)
    assert d.events == ()


# --- agent silence -----------------------------------------------------------------------------


def test_unknown_healthy_node_becomes_unknown_once() -> None:
    d1 = _decide(Record(), unknown(), 0)
    assert d1.record.state == State.UNKNOWN
    assert d1.record.reason == "AgentSilent"
    assert not d1.record.out_of_service
    assert _reasons(d1) == ["AgentSilent"]
    d2 = _decide(d1.record, unknown(), 60)
    assert d2.record == d1.record and d2.events == ()
    d3 = _decide(d2.record, clean(), 120)
    assert d3.record.state == State.HEALTHY
    assert not returned(d3)  # nothing of ours to lift


def test_agent_silence_cordon_quarantines_with_reason_agent_silent() -> None:
    policy = make_policy({"rules": {"agentSilence": {"action": "cordon"}}})
    d = _decide(Record(), unknown(), 0, policy)
    assert d.record.state == State.QUARANTINED
    assert d.record.reason == "AgentSilent"
    assert d.new_quarantine


def test_agent_silence_cordon_respects_the_breaker() -> None:
    policy = make_policy({"rules": {"agentSilence": {"action": "cordon"}}})
    d = _decide(Record(), unknown(), 0, policy, breaker_allows=False)
    assert d.record.state == State.DEGRADED and d.record.held_by_breaker
    assert d.record.reason == "AgentSilent"


def test_agent_silence_cordon_does_not_mask_a_worse_finding() -> None:
    policy = make_policy({"rules": {"agentSilence": {"action": "cordon"}}})
    d = _decide(Record(), unknown(finding(Action.DRAIN, Signal.XID, 1, 79)), 0, policy)
    assert d.record.state == State.DRAINING
    assert d.record.reason == "XID79"


# --- Record <-> status -------------------------------------------------------------------------


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
