"""Property-based tests of the safety rules: breaker, cordon ownership, Unknown never heals a node."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from gpuhealth.actions.nodes import Marks, Ownership, plan_node
from gpuhealth.api.names import OUT_OF_SERVICE, QUARANTINE_ANNOTATION, TAINT_KEY, Action, Signal, State
from gpuhealth.evaluation.assess import Assessment
from gpuhealth.evaluation.transitions import Decision, Inputs, Record, decide
from tests.unit.builders import T0, clean, faulty, finding, make_policy, merge_patch, unknown


def returned(d: Decision) -> bool:
    """The decision returns the node to service (gpuhealth lifts its taint and cordon)."""
    return any(reason == "ReturnedToService" for _, reason, _ in d.events)


PROPS = settings(max_examples=150, deadline=None)

KINDS = ["clean", "unknown", "unknown+drain", "observe", "cordon", "drain", "repair"]


def assessment(kind: str) -> Assessment:
    if kind == "clean":
        return clean()
    if kind == "unknown":
        return unknown()
    if kind == "unknown+drain":
        return unknown(finding(Action.DRAIN, Signal.XID, 0, 79))
    return faulty(Action(kind), Signal.THERMAL if kind == "cordon" else Signal.ECC)


def fresh_and_clean(a: Assessment) -> bool:
    return not a.unknown and not a.level.quarantines


policies = st.builds(
    lambda probation, max_q, silence: make_policy(
        {
            "rules": {"agentSilence": {"action": silence}},
            "safety": {"probation": probation, "flapping": {"maxQuarantines": max_q, "window": "6h"}},
        }
    ),
    st.sampled_from(["0s", "1m", "5m", "10m"]),
    st.integers(min_value=1, max_value=5),
    st.sampled_from(["observe", "cordon"]),
)


# --- 1. the circuit breaker holds across a fleet -----------------------------------------------

max_unhealthy = st.one_of(
    st.integers(min_value=0, max_value=45), st.integers(min_value=0, max_value=100).map(lambda p: f"{p}%")
)
fleet_event = st.tuples(
    st.integers(min_value=0, max_value=39),  # node (mod fleet size)
    st.sampled_from(KINDS),
    st.booleans(),  # drain complete
    st.integers(min_value=0, max_value=9).map(lambda x: x == 0),  # released (rarely)
)
fleet_step = st.tuples(st.integers(min_value=0, max_value=900), st.lists(fleet_event, min_size=1, max_size=12))


@PROPS
@given(
    n=st.integers(min_value=1, max_value=40),
    limit_spec=max_unhealthy,
    probation=st.sampled_from(["0s", "1m", "10m"]),
    silence=st.sampled_from(["observe", "cordon"]),
    steps=st.lists(fleet_step, min_size=1, max_size=25),
)
def test_breaker_never_lets_more_than_the_limit_out_of_service(
    n: int,
    limit_spec: int | str,
    probation: str,
    silence: str,
    steps: list[tuple[int, list[tuple[int, str, bool, bool]]]],
) -> None:
    policy = make_policy(
        {
            "rules": {"agentSilence": {"action": silence}},
            "safety": {"maxUnhealthy": limit_spec, "probation": probation, "flapping": {"window": "2h"}},
        }
    )
    limit = policy.breaker_limit(n)
    records = [Record() for _ in range(n)]
    now = T0
    for gap, events in steps:
        now += dt.timedelta(seconds=gap)
        for raw_node, kind, drain_complete, released in events:
            i = raw_node % n
            others_out = sum(1 for j, r in enumerate(records) if j != i and r.out_of_service)
            allows = others_out + 1 <= limit
            prior = records[i]
            d = decide(prior, assessment(kind), policy, now, Inputs(allows, drain_complete, released))
            records[i] = d.record
            out = sum(1 for r in records if r.out_of_service)
            assert out <= limit, (limit, [r.state for r in records])
            if d.record.out_of_service and not prior.out_of_service:
                assert allows and d.new_quarantine
            if d.record.held_by_breaker:
                assert not allows and not d.record.out_of_service
            if not allows and d.record.held_by_breaker and not prior.held_by_breaker:
                event("breaker held a quarantine back")
            if out == limit > 0:
                event("fleet at the breaker limit")


# --- 2. cordon ownership and foreign taints ----------------------------------------------------

foreign_taint = st.fixed_dictionaries(
    {
        "key": st.sampled_from(
            ["nvidia.com/gpu", "team/dedicated", "node.kubernetes.io/unreachable", "gpuhealth.dev/other"]
        ),
        "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"]),
    },
    optional={"value": st.sampled_from(["", "a", "XID79"])},
)
annotation = st.one_of(
    st.none(),
    st.sampled_from(["{garbage", "[]", "null"]),
    st.builds(
        lambda r, t, c, lifted, only: Ownership(r, t, c, "2025-01-01T00:00:00Z", lifted, only).to_json(),
        st.sampled_from(["", "XID79", "Thermal"]),
        st.booleans(),
        st.booleans(),
        st.sampled_from([(), ("taint",), ("cordon",)]),
        st.booleans(),
    ),
)
marks = st.builds(
    lambda q, reason, cordon, effect: Marks(
        State.QUARANTINED if q else State.HEALTHY,
        q,
        reason if q else "",
        effect,
        cordon,
        "2025-01-01T12:00:00Z",
    ),
    st.booleans(),
    st.sampled_from(["XID79", "Thermal", "EccUncorrected", "R" * 70]),
    st.booleans(),
    st.sampled_from(["NoSchedule", "NoExecute"]),
)
# Something a human (or another controller) does between two plans.
human = st.one_of(
    st.none(),
    st.just("remove-our-taint"),
    foreign_taint.map(lambda t: ("add-foreign-taint", t)),
)


def _taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list(node.get("spec", {}).get("taints") or [])


def _foreign(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in _taints(node) if t.get("key") != TAINT_KEY]


@PROPS
@given(
    foreign=st.lists(foreign_taint, max_size=4),
    our_taint=st.booleans(),
    unschedulable=st.booleans(),
    ann=annotation,
    sequence=st.lists(st.tuples(marks, human), min_size=1, max_size=12),
)
def test_foreign_taints_survive_and_a_prior_cordon_is_never_lifted(
    foreign: list[dict[str, Any]],
    our_taint: bool,
    unschedulable: bool,
    ann: str | None,
    sequence: list[tuple[Marks, Any]],
) -> None:
    taints = list(foreign) + ([{"key": TAINT_KEY, "value": "old", "effect": "NoSchedule"}] if our_taint else [])
    node: dict[str, Any] = {
        "metadata": {
            "name": "n",
            "resourceVersion": "1",
            "labels": {},
            "annotations": {} if ann is None else {QUARANTINE_ANNOTATION: ann},
        },
        "spec": {"taints": taints, **({"unschedulable": True} if unschedulable else {})},
    }
    prior_owned = Ownership.parse(ann)
    # A cordon that was there before gpuhealth ever claimed one belongs to someone else.
    human_cordon = unschedulable and (prior_owned is None or not prior_owned.cordon)

    for m, action in sequence:
        before = _foreign(node)
        was_cordoned = bool(node["spec"].get("unschedulable"))
        plan = plan_node(node, m)
        if plan.patch is not None:
            assert plan.patch["metadata"]["resourceVersion"] == node["metadata"]["resourceVersion"]
            node = merge_patch(node, plan.patch)
        after = _foreign(node)
        assert after == before, "a foreign taint was dropped or changed"
        if not m.cordon:  # taint-only mode: never a cordon, whatever the annotation said
            assert "cordon" not in plan.actions
            assert bool(node["spec"].get("unschedulable")) <= was_cordoned
        if human_cordon:
            assert node["spec"].get("unschedulable") is True
            assert "uncordon" not in plan.actions
            if not m.quarantine and "untaint" in plan.actions:
                event("lifted our taint, kept a human's cordon")
        if "uncordon" in plan.actions:
            event("lifted our own cordon")
        if not m.quarantine:
            assert not any(t.get("key") == TAINT_KEY for t in _taints(node))
            assert QUARANTINE_ANNOTATION not in node["metadata"].get("annotations", {})
        # The human moves.
        if action == "remove-our-taint":
            node["spec"]["taints"] = _foreign(node)
        elif action is not None:
            node["spec"]["taints"] = [*_taints(node), action[1]]
        node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)


# --- 3. Unknown never returns a node to service ------------------------------------------------

step = st.tuples(
    st.integers(min_value=0, max_value=400),  # seconds since the previous decision
    st.sampled_from(["clean"] * 4 + ["unknown"] * 2 + KINDS),  # enough clean runs to finish probations
    st.booleans(),  # drain complete
    st.integers(min_value=0, max_value=7).map(lambda x: x == 0),  # released (rarely)
    st.integers(min_value=0, max_value=3).map(lambda x: x != 0),  # breaker allows (mostly)
)


@PROPS
@given(
    policy=policies,
    start=st.sampled_from(list(State)),
    steps=st.lists(step, min_size=1, max_size=40),
)
def test_unknown_never_leads_to_healthy_and_probation_needs_consecutive_fresh_clean_facts(
    policy: Any, start: State, steps: list[tuple[int, str, bool, bool, bool]]
) -> None:
    rec = Record(state=start, since=T0)
    now = T0
    streak_start: dt.datetime | None = None  # first of the current run of fresh, clean assessments
    for gap, kind, drain_complete, released, allows in steps:
        now += dt.timedelta(seconds=gap)
        a = assessment(kind)
        streak_start = (streak_start or now) if fresh_and_clean(a) else None
        prior = rec
        d = decide(prior, a, policy, now, Inputs(allows, drain_complete, released))
        rec = d.record

        if a.unknown:
            assert not (rec.state == State.HEALTHY and prior.state != State.HEALTHY), "Unknown healed a node"
            assert not returned(d)
            if rec.state == State.RECOVERING:
                assert rec.healthy_since is None, "Unknown advanced probation"
                event("unknown while recovering")
        # The only way back into service is a completed probation (a release starts one; with a 0s
        # probation it completes in the same decision).
        on_probation = prior.state == State.RECOVERING or (prior.state == State.AWAITING_REPAIR and released)
        if returned(d):
            assert on_probation and rec.state == State.HEALTHY
        if prior.state in OUT_OF_SERVICE and rec.state not in OUT_OF_SERVICE:
            assert on_probation and rec.state == State.HEALTHY and returned(d)
            assert streak_start is not None
            assert (now - streak_start).total_seconds() >= policy.probation_s
            event("returned to service after probation")
        if prior.state == State.AWAITING_REPAIR and not released:
            assert rec.state == State.AWAITING_REPAIR
        if prior.state not in OUT_OF_SERVICE and rec.state in OUT_OF_SERVICE:
            assert allows and d.new_quarantine
