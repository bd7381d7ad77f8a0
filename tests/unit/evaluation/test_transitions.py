"""decide(), the per-node state machine, step by step from service: into quarantine, held back by the
circuit breaker, escalated to a drain, and a silent agent. The way back is in
test_transitions_recovery.py."""

from __future__ import annotations

import pytest

from gpuhealth.api.names import Action, Signal, State
from gpuhealth.evaluation.assess import Assessment
from gpuhealth.evaluation.transitions import Record
from tests.unit.builders import at, clean, faulty, finding, make_policy, unknown
from tests.unit.evaluation._transitions_support import PROBATION, decide_at, reasons, returned

# --- from service into quarantine --------------------------------------------------------------


def test_clean_healthy_stays_healthy_quietly() -> None:
    d = decide_at(Record(), clean(), 0)
    assert d.record == Record()
    assert (d.new_quarantine, d.events) == (False, ())


def test_cordon_level_fault_quarantines() -> None:
    d = decide_at(Record(), faulty(Action.CORDON, Signal.THERMAL), 5)
    r = d.record
    assert r.state == State.QUARANTINED
    assert r.reason == "Thermal"
    assert (r.since, r.quarantines, r.drain_action, r.held_by_breaker) == (at(5), (at(5),), "", False)
    assert d.new_quarantine and not returned(d)
    assert reasons(d) == ["Quarantined"]
    assert r.out_of_service


@pytest.mark.parametrize("level", [Action.DRAIN, Action.REPAIR])
def test_drain_or_repair_level_fault_goes_straight_to_draining(level: Action) -> None:
    d = decide_at(Record(), faulty(level), 5)
    assert d.record.state == State.DRAINING
    assert d.record.drain_action == str(level)
    assert d.new_quarantine
    assert reasons(d) == ["Quarantined"]


def test_xid_reason_is_the_code() -> None:
    a = Assessment(findings=(finding(Action.DRAIN, Signal.XID, 2, code=79),))
    assert decide_at(Record(), a, 0).record.reason == "XID79"


@pytest.mark.parametrize("action", [Action.IGNORE, Action.OBSERVE])
def test_below_cordon_never_quarantines(action: Action) -> None:
    d = decide_at(Record(), faulty(action), 0)
    assert not d.record.out_of_service
    assert not d.new_quarantine


def test_observe_findings_make_degraded_once() -> None:
    d1 = decide_at(Record(), faulty(Action.OBSERVE, Signal.XID), 0)
    assert d1.record.state == State.DEGRADED
    assert reasons(d1) == ["Degraded"]
    d2 = decide_at(d1.record, faulty(Action.OBSERVE, Signal.XID), 10)
    assert d2.record == d1.record and d2.events == ()
    d3 = decide_at(d2.record, clean(), 20)
    assert d3.record.state == State.HEALTHY
    assert reasons(d3) == ["Healthy"]


# --- circuit breaker ---------------------------------------------------------------------------


def test_breaker_refusal_holds_back_as_degraded_with_one_event() -> None:
    d1 = decide_at(Record(), faulty(Action.DRAIN), 0, breaker_allows=False)
    r1 = d1.record
    assert r1.state == State.DEGRADED
    assert r1.held_by_breaker
    assert not r1.out_of_service
    assert not d1.new_quarantine
    assert r1.quarantines == ()
    assert reasons(d1) == ["QuarantineHeldBack"]
    assert "breaker is open" in r1.message

    d2 = decide_at(r1, faulty(Action.DRAIN), 30, breaker_allows=False)
    assert d2.record.state == State.DEGRADED and d2.record.held_by_breaker
    assert d2.record.since == at(0)  # still the same hold
    assert d2.events == ()  # not repeated


def test_a_held_back_slow_node_names_the_slow_budget() -> None:
    slow = decide_at(Record(), faulty(Action.CORDON, Signal.POWER_BRAKE), 0, breaker_allows=False)
    assert "(maxSlow 10%)" in slow.events[0][2]
    broken = decide_at(Record(), faulty(Action.CORDON, Signal.XID), 0, breaker_allows=False)
    assert "(maxUnhealthy 10%)" in broken.events[0][2]


def test_held_node_quarantines_once_the_breaker_allows() -> None:
    held = decide_at(Record(), faulty(Action.CORDON), 0, breaker_allows=False).record
    d = decide_at(held, faulty(Action.CORDON), 60)
    assert d.record.state == State.QUARANTINED
    assert not d.record.held_by_breaker
    assert d.new_quarantine


def test_held_node_whose_fault_clears_is_healthy_again() -> None:
    held = decide_at(Record(), faulty(Action.CORDON), 0, breaker_allows=False).record
    d = decide_at(held, clean(), 60)
    assert d.record.state == State.HEALTHY
    assert not d.record.held_by_breaker


def test_breaker_is_not_consulted_for_nodes_already_out_of_service() -> None:
    q = decide_at(Record(), faulty(Action.CORDON), 0).record
    d = decide_at(q, faulty(Action.DRAIN), 10, breaker_allows=False)
    assert d.record.state == State.DRAINING


# --- escalation and drains ---------------------------------------------------------------------


@pytest.mark.parametrize("level", [Action.DRAIN, Action.REPAIR])
def test_quarantined_escalates_to_draining(level: Action) -> None:
    q = decide_at(Record(), faulty(Action.CORDON), 0).record
    d = decide_at(q, faulty(level), 10)
    assert d.record.state == State.DRAINING
    assert d.record.drain_action == str(level)
    assert not d.new_quarantine  # the same episode
    assert d.record.quarantines == (at(0),)
    assert reasons(d) == ["Draining"]


def test_quarantined_with_cordon_level_stays_quietly() -> None:
    q = decide_at(Record(), faulty(Action.CORDON), 0).record
    d = decide_at(q, faulty(Action.CORDON), 10)
    assert d.record.state == State.QUARANTINED
    assert d.events == ()


def test_draining_waits_for_the_drain() -> None:
    dr = decide_at(Record(), faulty(Action.DRAIN), 0).record
    d = decide_at(dr, faulty(Action.DRAIN), 10)
    assert d.record.state == State.DRAINING and d.events == ()


def test_drain_complete_returns_to_quarantined() -> None:
    dr = decide_at(Record(), faulty(Action.DRAIN), 0).record
    d = decide_at(dr, faulty(Action.DRAIN), 10, drain_complete=True)
    assert d.record.state == State.QUARANTINED
    assert d.record.since == at(10)
    assert reasons(d) == ["DrainComplete"]
    assert not returned(d)


def test_drain_complete_for_a_repair_awaits_repair() -> None:
    dr = decide_at(Record(), faulty(Action.REPAIR), 0).record
    d = decide_at(dr, faulty(Action.REPAIR), 10, drain_complete=True)
    assert d.record.state == State.AWAITING_REPAIR
    assert reasons(d) == ["DrainComplete"]


def test_a_release_during_a_repair_drain_counts_once_the_drain_is_done() -> None:
    """A remediator that rebooted a node early releases it while gpuhealth still drains it: the
    release is acknowledged at once, so the node must not then park in AwaitingRepair (found by the
    ladder_kills chaos scenario)."""
    dr = decide_at(Record(), faulty(Action.REPAIR), 0).record
    mid = decide_at(dr, clean(), 5, released=True)
    assert mid.record.state == State.DRAINING  # the pods still leave first
    done = decide_at(mid.record, clean(), 10, drain_complete=True)
    assert done.record.state == State.RECOVERING and done.record.drained
    assert reasons(done) == ["Released"]
    # A release from before this quarantine began does not count for it.
    early = decide_at(Record(cleared_before=at(-5)), faulty(Action.REPAIR), 0).record
    assert decide_at(early, faulty(Action.REPAIR), 10, drain_complete=True).record.state == State.AWAITING_REPAIR


def test_after_drain_complete_the_same_fault_does_not_drain_again() -> None:
    dr = decide_at(Record(), faulty(Action.DRAIN), 0).record
    q = decide_at(dr, faulty(Action.DRAIN), 10, drain_complete=True).record
    assert q.state == State.QUARANTINED
    d = decide_at(q, faulty(Action.DRAIN), 20, drain_complete=True)
    assert d.record.state == State.QUARANTINED
    assert d.events == ()


def test_escalation_to_repair_during_a_drain_awaits_repair() -> None:
    dr = decide_at(Record(), faulty(Action.DRAIN), 0).record
    mid = decide_at(dr, faulty(Action.REPAIR), 5).record
    d = decide_at(mid, faulty(Action.REPAIR), 10, drain_complete=True)
    assert d.record.state == State.AWAITING_REPAIR


# --- agent silence -----------------------------------------------------------------------------


def test_unknown_healthy_node_becomes_unknown_once() -> None:
    d1 = decide_at(Record(), unknown(), 0)
    assert d1.record.state == State.UNKNOWN
    assert d1.record.reason == "AgentSilent"
    assert not d1.record.out_of_service
    assert reasons(d1) == ["AgentSilent"]
    d2 = decide_at(d1.record, unknown(), 60)
    assert d2.record == d1.record and d2.events == ()
    d3 = decide_at(d2.record, clean(), 120)
    assert d3.record.state == State.HEALTHY
    assert not returned(d3)  # nothing of ours to lift


def test_agent_silence_cordon_quarantines_with_reason_agent_silent() -> None:
    policy = make_policy({"rules": {"agentSilence": {"action": "cordon"}}})
    d = decide_at(Record(), unknown(), 0, policy)
    assert d.record.state == State.QUARANTINED
    assert d.record.reason == "AgentSilent"
    assert d.new_quarantine


def test_agent_silence_cordon_respects_the_breaker() -> None:
    policy = make_policy({"rules": {"agentSilence": {"action": "cordon"}}})
    d = decide_at(Record(), unknown(), 0, policy, breaker_allows=False)
    assert d.record.state == State.DEGRADED and d.record.held_by_breaker
    assert d.record.reason == "AgentSilent"


def test_agent_silence_cordon_does_not_mask_a_worse_finding() -> None:
    policy = make_policy({"rules": {"agentSilence": {"action": "cordon"}}})
    d = decide_at(Record(), unknown(finding(Action.DRAIN, Signal.XID, 1, 79)), 0, policy)
    assert d.record.state == State.DRAINING
    assert d.record.reason == "XID79"


# --- taint-only mode (spec.actions.cordon: false) ------------------------------------------------

TAINT_ONLY = make_policy({"actions": {"cordon": False}})


@pytest.mark.parametrize("level", [Action.CORDON, Action.DRAIN, Action.REPAIR])
def test_taint_only_quarantine_says_the_taint_alone_holds_the_node(level: Action) -> None:
    (event,) = decide_at(Record(), faulty(level), 5, TAINT_ONLY).events
    assert "taint alone" in event[2] and "not cordoned" in event[2]
    assert "tainted and cordoned" not in event[2] and "tainted, cordoned" not in event[2]
    (default,) = decide_at(Record(), faulty(level), 5).events
    assert "cordoned" in default[2] and "taint alone" not in default[2]


def test_taint_only_return_to_service_lifts_the_taint_alone() -> None:
    policy = make_policy({"actions": {"cordon": False}, "safety": {"probation": "10m"}})
    q = decide_at(Record(), faulty(Action.CORDON), 0, policy).record
    on_probation = decide_at(q, clean(), 10, policy).record
    d = decide_at(on_probation, clean(), 10 + PROBATION + 1, policy)
    (msg,) = [m for _, reason, m in d.events if reason == "ReturnedToService"]
    assert msg.startswith("Healthy for the whole probation") and "lifting gpuhealth's taint" in msg
    assert "cordon" not in msg.replace("no cordon of gpuhealth's", "")
