"""decide(), the per-node state machine, on the way back to service: probation after clean facts,
relapses, flapping (too many quarantines in the window), and AwaitingRepair until a human releases
the node."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuhealth.api.names import Action, State
from gpuhealth.evaluation.assess import Assessment
from gpuhealth.evaluation.transitions import Record
from tests.unit.builders import at, clean, faulty, make_policy, unknown
from tests.unit.evaluation._transitions_support import PROBATION, decide_at, reasons, returned

# --- recovery and probation --------------------------------------------------------------------


def _quarantined(now_s: float = 0) -> Record:
    return decide_at(Record(), faulty(Action.CORDON), now_s).record


def test_clean_facts_start_probation_then_return_to_service() -> None:
    q = _quarantined(0)
    d1 = decide_at(q, clean(), 100)
    assert d1.record.state == State.RECOVERING
    assert d1.record.healthy_since == at(100)
    assert d1.record.out_of_service
    assert reasons(d1) == ["Recovering"]
    assert not returned(d1)

    d2 = decide_at(d1.record, clean(), 100 + PROBATION - 1)
    assert d2.record.state == State.RECOVERING and not returned(d2) and d2.events == ()

    d3 = decide_at(d2.record, clean(), 100 + PROBATION)
    assert d3.record.state == State.HEALTHY
    assert returned(d3)
    assert reasons(d3) == ["ReturnedToService"]
    assert (d3.record.reason, d3.record.healthy_since, d3.record.drain_action) == ("", None, "")
    assert not d3.record.out_of_service


def test_draining_node_whose_facts_clear_recovers() -> None:
    dr = decide_at(Record(), faulty(Action.DRAIN), 0).record
    assert decide_at(dr, clean(), 10).record.state == State.RECOVERING


def test_observe_findings_do_not_interrupt_probation() -> None:
    rec = decide_at(_quarantined(0), clean(), 10).record
    d = decide_at(rec, faulty(Action.OBSERVE), 10 + PROBATION)
    assert d.record.state == State.HEALTHY and returned(d)


def test_unknown_while_recovering_resets_probation_and_never_returns_to_service() -> None:
    rec = decide_at(_quarantined(0), clean(), 10).record
    d = decide_at(rec, unknown(), 10 + PROBATION)
    assert d.record.state == State.RECOVERING
    assert d.record.healthy_since is None
    assert not returned(d)
    d = decide_at(d.record, unknown(), 10 + 5 * PROBATION)
    assert d.record.state == State.RECOVERING and not returned(d)
    # Fresh facts restart the clock: a whole probation is needed from here.
    d = decide_at(d.record, clean(), 10_000)
    assert d.record.state == State.RECOVERING and d.record.healthy_since == at(10_000)
    assert decide_at(d.record, clean(), 10_000 + PROBATION - 1).record.state == State.RECOVERING
    assert decide_at(d.record, clean(), 10_000 + PROBATION).record.state == State.HEALTHY


def test_unknown_while_quarantined_stays_quarantined() -> None:
    d = decide_at(_quarantined(0), unknown(), 100)
    assert d.record.state == State.QUARANTINED
    assert not returned(d)


def test_relapse_during_recovering_quarantines_again_and_counts() -> None:
    rec = decide_at(_quarantined(0), clean(), 10).record
    d = decide_at(rec, faulty(Action.CORDON), 20)
    assert d.record.state == State.QUARANTINED
    assert d.new_quarantine
    assert d.record.quarantines == (at(0), at(20))
    assert d.record.healthy_since is None
    assert reasons(d) == ["Quarantined"]
    assert "Relapsed during probation" in d.events[0][2]


def test_relapse_with_drain_level_goes_to_draining() -> None:
    rec = decide_at(_quarantined(0), clean(), 10).record
    d = decide_at(rec, faulty(Action.DRAIN), 20, breaker_allows=False)  # already counted: no breaker
    assert d.record.state == State.DRAINING


# --- flapping ----------------------------------------------------------------------------------


def _cycle(rec: Record, start_s: float) -> Record:
    """Quarantine (or relapse) at start_s, then clean facts 10s later."""
    rec = decide_at(rec, faulty(Action.CORDON), start_s).record
    if rec.state == State.AWAITING_REPAIR:
        return rec
    return decide_at(rec, clean(), start_s + 10).record


def test_nth_quarantine_within_the_window_awaits_repair() -> None:
    rec = _cycle(Record(), 0)
    rec = _cycle(rec, 100)
    assert rec.state == State.RECOVERING and len(rec.quarantines) == 2
    d = decide_at(rec, faulty(Action.CORDON), 200)
    assert d.record.state == State.AWAITING_REPAIR
    assert d.record.reason == "Flapping"
    assert d.record.quarantines == (at(0), at(100), at(200))
    assert d.record.drain_action == "repair"
    assert d.new_quarantine
    assert reasons(d) == ["Flapping"]


def test_quarantines_outside_the_window_are_forgotten() -> None:
    day = 86400
    rec = _cycle(Record(), 0)
    rec = _cycle(rec, 100)
    rec = decide_at(rec, clean(), 100 + PROBATION + 20).record
    assert rec.state == State.HEALTHY
    d = decide_at(rec, faulty(Action.CORDON), day + 50)  # the first one is now older than 24h
    assert d.record.state == State.QUARANTINED
    assert d.record.quarantines == (at(100), at(day + 50))


def test_flapping_from_service_with_max_one() -> None:
    policy = make_policy({"safety": {"flapping": {"maxQuarantines": 1}}})
    d = decide_at(Record(), faulty(Action.CORDON), 0, policy)
    assert d.record.state == State.AWAITING_REPAIR and d.record.reason == "Flapping"


# --- awaiting repair and release ---------------------------------------------------------------


def _awaiting() -> Record:
    dr = decide_at(Record(), faulty(Action.REPAIR), 0).record
    rec = decide_at(dr, faulty(Action.REPAIR), 10, drain_complete=True).record
    assert rec.state == State.AWAITING_REPAIR
    return rec


@pytest.mark.parametrize("a", [clean(), unknown(), faulty(Action.CORDON), faulty(Action.REPAIR)])
def test_awaiting_repair_stays_without_a_release(a: Assessment) -> None:
    rec = _awaiting()
    for t in (100, 10_000, 10_000_000):
        d = decide_at(rec, a, t, drain_complete=True)
        assert d.record.state == State.AWAITING_REPAIR
        assert not returned(d) and not d.new_quarantine and d.events == ()
        rec = d.record


def test_release_moves_to_recovering_and_clears_history() -> None:
    rec = _awaiting()
    d = decide_at(rec, clean(), 1000, released=True)
    r = d.record
    assert r.state == State.RECOVERING
    assert r.quarantines == ()
    assert r.cleared_before == at(1000)
    assert r.reason == rec.reason, "the taint keeps naming the fault, not the release"
    assert "released by a human" in r.message
    assert r.healthy_since == at(1000)  # this clean report starts the probation
    assert reasons(d) == ["Released"]
    assert not returned(d)
    d2 = decide_at(r, clean(), 1000 + PROBATION)
    assert d2.record.state == State.HEALTHY and returned(d2)


def test_release_with_unknown_facts_does_not_start_probation() -> None:
    d = decide_at(_awaiting(), unknown(), 1000, released=True)
    assert d.record.state == State.RECOVERING
    assert d.record.healthy_since is None


def test_release_while_the_fault_persists_relapses() -> None:
    d = decide_at(_awaiting(), faulty(Action.CORDON), 1000, released=True)
    assert d.record.state == State.QUARANTINED
    assert d.record.quarantines == (at(1000),)  # history was cleared by the release
    assert reasons(d) == ["Released", "Quarantined"]


def test_release_of_a_healthy_node_only_clears_evidence() -> None:
    d = decide_at(Record(), clean(), 50, released=True)
    assert d.record.state == State.HEALTHY
    assert d.record.cleared_before == at(50)
    assert d.events == ()


def test_a_domain_member_through_its_probation_waits_for_the_members_still_out_for_the_domain() -> None:
    q = replace(_quarantined(0), reason="ImexDomain")
    d1 = decide_at(q, clean(), 100)
    waiting = decide_at(d1.record, clean(), 100 + PROBATION, domain_waits=("d3",))
    assert waiting.record.state == State.RECOVERING and not returned(waiting) and waiting.events == ()
    assert waiting.record.healthy_since == at(100)  # its own probation is over; it does not start again
    assert "NVLink domain" in waiting.record.message and "d3" in waiting.record.message
    back = decide_at(waiting.record, clean(), 100 + PROBATION + 3)
    assert back.record.state == State.HEALTHY and returned(back)
