"""The decision scenarios' invariants (hack/chaos/decisions.py) fire on a violating history and stay quiet
on a clean one."""

from __future__ import annotations

import datetime as dt

from hack.chaos import decisions as d
from hack.chaos.ladder import JobCreate

T0 = dt.datetime(2026, 12, 6, 1, 0, tzinfo=dt.UTC)
NODE = "dk-0"


def at(s: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def dom(t: float, *out: bool) -> d.DomainSample:
    return d.DomainSample(t, "clique.1", {f"m{i}": o for i, o in enumerate(out)})


# -- domains ------------------------------------------------------------------------------------------


def test_a_domain_left_half_out_past_the_settling_time_fires() -> None:
    samples = [
        dom(0, False, False, False),
        dom(1, True, False, False),
        dom(9, True, True, False),
        dom(20, True, True, False),
    ]
    (p,) = d.half_domains(samples, settle_s=15)
    assert "half out for 19.0 s" in p and "['m2'] not" in p


def test_a_domain_half_out_only_while_its_decision_is_written_or_returning_is_clean() -> None:
    leave = [dom(0, False, False, False), dom(1, True, False, False), dom(5, True, True, True)]
    back = [dom(30, True, False, True), dom(34, False, False, False)]
    assert d.half_domains(leave + back, settle_s=15) == []


def test_a_half_stretch_still_open_at_the_last_sample_is_judged() -> None:
    (p,) = d.half_domains([dom(0, True, False), dom(40, True, False)], settle_s=15)
    assert "40.0 s" in p


def test_the_operators_restarts_are_not_held_against_a_half_domain_but_its_acting_time_is() -> None:
    """Killed during the decision, then killed again while it imported: 30 s half out, of which the
    operator acted 4 s (finishing the decision then); acting 20 s while half out is a decision left."""

    def half(t: float, acting: bool) -> d.DomainSample:
        return d.DomainSample(t, "clique.1", {"m0": True, "m1": False}, acting)

    restarts = [half(0, True), half(1, False), half(27, True), half(31, True), dom(32, True, True)]
    assert d.half_domains(restarts, settle_s=15) == []
    (h,) = d.half_stretches(restarts)
    assert (h.seconds, h.acting_s) == (31, 4)
    (p,) = d.half_domains([*restarts[:-1], half(51, True)], settle_s=15)
    assert "half out for 24.0 s of the operator's acting time (51.0 s in all" in p


def test_a_settled_domain_is_all_out_or_all_back() -> None:
    assert d.settled_domain_problems("c", {"a": True, "b": True}, want_out=True) == []
    assert d.settled_domain_problems("c", {"a": False, "b": False}, want_out=False) == []
    (p,) = d.settled_domain_problems("c", {"a": True, "b": False}, want_out=True)
    assert "['b'] are not tainted" in p
    (p,) = d.settled_domain_problems("c", {"a": True, "b": False}, want_out=False)
    assert "['a'] are still tainted" in p


# -- racks -----------------------------------------------------------------------------------------------


def rack(t: float, braked: set[str], **own: str) -> d.RackSample:
    return d.RackSample(t, "r1", frozenset(braked), own)


def test_a_rack_node_held_alone_while_the_others_still_brake_fires() -> None:
    samples = [
        rack(0, set()),
        rack(1, {"a", "b", "c"}),
        rack(20, {"b", "c"}),  # a's brake lifted: the episode goes on
        rack(22, {"b", "c"}, b=d.own_brake("PowerBrake", None)),
        rack(23, {"b", "c"}, b="status.reason PowerBrake", c=d.own_brake(None, "PowerBrake")),
        rack(30, set()),
    ]
    problems = d.rack_nodes_alone(samples, min_nodes=3)
    assert len(problems) == 2, problems  # once per node and episode
    assert "b held alone" in problems[0] and "2 of the rack's nodes" in problems[0]
    assert "taint value PowerBrake" in problems[1]


def test_a_nodes_own_brake_outside_a_rack_episode_is_its_own_finding() -> None:
    samples = [
        rack(0, {"a"}, a="status.reason PowerBrake"),  # one node's brake: its own finding is right
        rack(1, {"a", "b"}, a="status.reason PowerBrake"),  # under minNodes
        rack(2, {"a", "b", "c"}),
        rack(9, set()),
        rack(10, {"c"}, c="status.reason PowerBrake"),  # a later brake of one node, the episode over
    ]
    assert d.rack_nodes_alone(samples, min_nodes=3) == []


def test_a_second_episode_is_judged_on_its_own() -> None:
    samples = [rack(0, {"a", "b", "c"}), rack(5, set()), rack(6, {"a", "b", "c"}), rack(7, {"a"}, a="x")]
    (p,) = d.rack_nodes_alone(samples, min_nodes=3)
    assert "episode 2" in p


def test_own_brake_says_how_the_node_is_held() -> None:
    assert d.own_brake("RackPowerBrake", None) == ""
    assert d.own_brake("PowerBrake", "PowerBrake") == "status.reason PowerBrake, taint value PowerBrake"


# -- node validations ----------------------------------------------------------------------------------------


def create(name: str, s: float, code: int = 201) -> JobCreate:
    return JobCreate(name, at(s), code)


V1 = f"gpuhealth-validate-{NODE}-node-0123abcd"
V2 = f"gpuhealth-validate-{NODE}-node-89abcdef"


def test_node_validation_names_are_told_from_gpu_ones() -> None:
    assert d.parse_node_validation(V1) == NODE
    assert d.parse_node_validation(f"gpuhealth-validate-{NODE}-3-1-0123abcd") is None
    assert d.parse_node_validation(f"gpuhealth-reset-{NODE}-3-1-0123abcd") is None


def test_a_second_job_for_one_validation_fires() -> None:
    assert d.duplicate_node_validations([create(V1, 0), create(V1, 1, 409)], {NODE: 1}, {NODE: {V1}}) == []
    (again,) = d.duplicate_node_validations([create(V1, 0), create(V1, 5)], {NODE: 1})
    assert "created 2 times" in again
    (second,) = d.duplicate_node_validations([create(V1, 0), create(V2, 5)], {NODE: 1})
    assert "2 node validation Jobs for 1 validation(s)" in second
    assert d.duplicate_node_validations([create(V1, 0), create(V2, 5)], {NODE: 2}) == []
    (live,) = d.duplicate_node_validations([], {NODE: 1}, {NODE: {V1, V2}})
    assert "2 node validation Jobs for 1" in live


def test_a_job_the_audit_log_missed_still_counts_against_the_validations_started() -> None:
    # The API server SIGKILLed after storing V2 and before logging it: the audit holds V1 only.
    (second,) = d.duplicate_node_validations([create(V1, 0)], {NODE: 1}, {NODE: {V2}})
    assert V1 in second and V2 in second
    assert d.duplicate_node_validations([create(V1, 0)], {NODE: 2}, {NODE: {V1, V2}}) == []
    assert d.unaudited([create(V1, 0), create(V2, 1, 409)], {NODE: {V1, V2}}) == [V2]
    assert d.unaudited([create(V1, 0), create(V2, 1)], {NODE: {V1, V2}}) == []


def hold(t: float, held: bool, *passed: str) -> d.HoldSample:
    return d.HoldSample(t, NODE, held, frozenset(passed))


def test_a_node_freed_before_its_validation_job_succeeded_fires() -> None:
    (p,) = d.returned_unvalidated([hold(0, False), hold(1, True), hold(5, True), hold(6, False)])
    assert "free at 6.0 s" in p
    # an earlier round's pass does not validate this hold
    (p,) = d.returned_unvalidated([hold(0, False, V1), hold(1, True, V1), hold(6, False, V1)])
    assert "with no validation Job succeeded" in p


def test_a_node_freed_after_a_new_pass_is_clean() -> None:
    samples = [hold(0, True), hold(3, True, V1), hold(4, False, V1), hold(9, True, V1), hold(12, False, V1, V2)]
    assert d.returned_unvalidated(samples) == []


# -- approvals ------------------------------------------------------------------------------------------------


RESET = f"gpuhealth-reset-{NODE}-3-1-0123abcd"
VALIDATE = f"gpuhealth-validate-{NODE}-3-1-89abcdef"


def test_steps_are_read_from_job_names() -> None:
    assert d.step_of(RESET) == ("reset", NODE, 3)
    assert d.step_of(VALIDATE) == ("validation", NODE, 3)
    assert d.step_of(V1) is None


def test_each_approved_step_runs_once() -> None:
    creates = [create(RESET, 2), create(RESET, 2.5, 409), create(VALIDATE, 10)]
    assert d.approval_problems(creates, {(NODE, 3): [at(1), at(8)]}) == []


def test_a_step_run_twice_on_one_approval_fires() -> None:
    (p,) = d.approval_problems([create(RESET, 2), create(RESET, 3)], {(NODE, 3): [at(1)]})
    assert "no approval left" in p


def test_a_step_run_before_its_approval_fires() -> None:
    problems = d.approval_problems([create(RESET, 2)], {(NODE, 3): [at(5)]})
    assert any("no approval left" in p for p in problems) and any("no step's Job ran" in p for p in problems)


def test_an_approval_never_acted_on_fires_once_settled() -> None:
    (p,) = d.approval_problems([create(RESET, 2)], {(NODE, 3): [at(1), at(8)]})
    assert "approved at 01:00:08" in p
    assert d.approval_problems([create(RESET, 2)], {(NODE, 3): [at(1), at(8)]}, settled=False) == []


def test_a_step_job_the_audit_log_missed_still_spends_its_approval() -> None:
    # The API server SIGKILLed after storing VALIDATE (created at 01:00:10.x) and before logging it.
    audited = [create(RESET, 2)]
    missing = d.unaudited_creates(audited, {RESET: at(2), VALIDATE: at(10)})
    assert [(c.name, c.at, c.code) for c in missing] == [(VALIDATE, at(11), 201)]
    assert d.approval_problems(audited + missing, {(NODE, 3): [at(1), at(8)]}) == []
    # Without it the approval looked lost; and a Job seen created before its approval still fires.
    assert d.approval_problems(audited, {(NODE, 3): [at(1), at(8)]})
    late = d.unaudited_creates(audited, {VALIDATE: at(6)})
    assert any("no approval left" in p for p in d.approval_problems(audited + late, {(NODE, 3): [at(1), at(8)]}))


def test_a_settle_wait_counts_the_operators_acting_time_not_its_start_ups() -> None:
    """domain_kills, seed 32157: of a 120 s wall-clock wait the operator acted about 6 s (five restarts
    of 25-45 s each on a loaded machine); the wait ended before a restart that settled the round
    in 6 s. Counted in acting time, the start-ups do not spend the wait; the wall cap still ends it."""
    b = d.ActingBudget(budget_s=10.0, cap_s=40.0, start=0.0, acting=True)
    assert not b.look(5.0, True)  # 5 s acting
    assert not b.look(6.0, False)  # killed: 5..6 not counted (one end not acting)
    assert not b.look(30.0, False)  # starting up for 24 s: not counted
    assert not b.look(31.0, True)  # acting again (30..31 has one end not acting)
    assert b.acting_s == 5.0
    assert not b.look(35.0, True)
    assert b.look(36.0, True) and b.acting_s == 10.0
    # Never acting: the wall cap ends the wait.
    dead = d.ActingBudget(budget_s=10.0, cap_s=40.0, start=0.0, acting=False)
    assert not any(dead.look(float(t), False) for t in range(1, 40))
    assert dead.look(40.0, False)
