"""Per-GPU verdicts (evaluation/devices.py) and the status.devices codec (api/devices.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.api.devices import DeviceRecord, DeviceState, devices_from_status, devices_to_status
from gpuhealth.api.names import Action, Scope, Signal
from gpuhealth.evaluation.assess import Finding
from gpuhealth.evaluation.devices import DeviceInputs, DeviceVerdict, decide_devices
from tests.unit.builders import T0, at, make_policy

UUIDS = {i: f"GPU-{i:04d}" for i in range(8)}
POLICY = make_policy({"safety": {"probation": "10m"}})


def dev(
    index: int, action: Action = Action.DRAIN, signal: Signal = Signal.ECC, scope: Scope = Scope.DEVICE, **kw: Any
) -> Finding:
    return Finding(signal, action, f"{signal} on {index}", index, UUIDS.get(index, ""), kw.get("code"), T0, scope)


def run(prior: dict[int, DeviceRecord], findings: list[Finding], now: float, **inputs: Any) -> DeviceVerdict:
    return decide_devices(prior, findings, inputs.pop("policy", POLICY), at(now), DeviceInputs(uuids=UUIDS, **inputs))


def by_index(v: DeviceVerdict) -> dict[int, DeviceRecord]:
    return {r.index: r for r in v.records}


# --- the codec ----------------------------------------------------------------------------------


def test_record_round_trips_through_status() -> None:
    rec = DeviceRecord(
        index=3,
        uuid="GPU-0003",
        state=DeviceState.DRAINING,
        reason="EccUncorrected",
        message="GPU 3: 2 uncorrected ECC errors",
        since=T0,
        rule="ecc",
        quarantines=(T0,),
        healthy_since=None,
        cleared_before=at(-60),
        held_by_breaker=False,
        drain_action="drain",
        drained=False,
    )
    status = {"devices": devices_to_status([rec, DeviceRecord(index=1, uuid="GPU-0001")])}
    assert [d["index"] for d in status["devices"]] == [1, 3]
    assert status["devices"][0] == {"index": 1, "uuid": "GPU-0001", "state": "InService"}
    assert status["devices"][1]["rule"] == "ecc" and status["devices"][1]["since"] == "2025-01-01T12:00:00Z"
    assert devices_from_status(status) == {1: DeviceRecord(index=1, uuid="GPU-0001"), 3: rec}


def test_codec_tolerates_junk() -> None:
    status = {"devices": [{"index": -1}, {"index": True}, "x", {"index": 2, "state": "Bogus", "quarantines": "no"}]}
    assert devices_from_status(status) == {2: DeviceRecord(index=2)}
    assert devices_from_status(None) == {} and devices_from_status({"devices": "x"}) == {}


# --- transitions --------------------------------------------------------------------------------


def test_ecc_on_gpu_3_takes_out_gpu_3_only() -> None:
    v = run({}, [dev(3)], 0)
    recs = by_index(v)
    assert recs[3].state == DeviceState.DRAINING and recs[3].reason == "EccUncorrected" and recs[3].rule == "ecc"
    assert recs[3].uuid == "GPU-0003" and recs[3].since == at(0) and recs[3].quarantines == (at(0),)
    assert all(r.state == DeviceState.IN_SERVICE for i, r in recs.items() if i != 3)
    assert v.new_quarantines == (3,) and not v.escalate
    assert [(e.reason, e.index) for e in v.events] == [("DeviceQuarantined", 3)]


def test_node_scope_and_observe_findings_are_not_the_devices_business() -> None:
    v = run({}, [dev(1, scope=Scope.NODE), dev(2, action=Action.OBSERVE)], 0)
    assert not v.out_of_service and not v.events


def test_cordon_level_is_quarantined_and_escalates_to_drain_later() -> None:
    v = run({}, [dev(2, Action.CORDON, Signal.THERMAL)], 0)
    assert by_index(v)[2].state == DeviceState.QUARANTINED and by_index(v)[2].rule == "thermal"
    v2 = run(by_index(v), [dev(2, Action.DRAIN)], 10)
    assert by_index(v2)[2].state == DeviceState.DRAINING and by_index(v2)[2].drain_action == "drain"
    assert v2.new_quarantines == ()


def test_drain_complete_then_recovery_after_probation_lifts() -> None:
    prior = by_index(run({}, [dev(3)], 0))
    v = run(prior, [dev(3)], 30, drained=frozenset({3}))
    assert by_index(v)[3].state == DeviceState.QUARANTINED and by_index(v)[3].drained
    v = run(by_index(v), [], 60)
    assert by_index(v)[3].state == DeviceState.RECOVERING and by_index(v)[3].healthy_since == at(60)
    v = run(by_index(v), [], 60 + 599)
    assert by_index(v)[3].state == DeviceState.RECOVERING and not v.lifted
    v = run(by_index(v), [], 60 + 600)
    assert by_index(v)[3].state == DeviceState.IN_SERVICE and v.lifted == (3,)
    assert by_index(v)[3].quarantines == (at(0),)  # kept for flapping


def test_stale_facts_never_advance_probation() -> None:
    prior = {3: DeviceRecord(3, state=DeviceState.RECOVERING, since=at(0), healthy_since=at(0))}
    v = run(prior, [], 700, fresh=False)
    assert by_index(v)[3].state == DeviceState.RECOVERING and by_index(v)[3].healthy_since is None
    v = run(by_index(v), [], 710)
    assert by_index(v)[3].healthy_since == at(710) and not v.lifted


def test_relapse_during_probation_goes_back_without_budget() -> None:
    prior = {3: DeviceRecord(3, state=DeviceState.RECOVERING, since=at(0), healthy_since=at(0), quarantines=(at(-10),))}
    v = run(prior, [dev(3)], 100, gpu_budget=0)
    assert by_index(v)[3].state == DeviceState.DRAINING and by_index(v)[3].quarantines == (at(-10), at(100))
    assert "Relapsed" in v.events[0].message


def test_repair_level_after_drain_waits_for_a_human() -> None:
    v = run({}, [dev(4, Action.REPAIR, Signal.ROW_REMAP_FAILURE)], 0)
    assert by_index(v)[4].drain_action == "repair"
    v = run(by_index(v), [], 10, drained=frozenset({4}))
    assert by_index(v)[4].state == DeviceState.AWAITING_REPAIR
    v = run(by_index(v), [], 100_000)
    assert by_index(v)[4].state == DeviceState.AWAITING_REPAIR
    v = run(by_index(v), [], 100_010, released=frozenset({4}))
    assert by_index(v)[4].state == DeviceState.RECOVERING and by_index(v)[4].cleared_before == at(100_010)
    assert [e.reason for e in v.events] == ["Released"]


def test_release_acknowledges_old_xids_but_not_live_counters() -> None:
    prior = {5: DeviceRecord(5, state=DeviceState.AWAITING_REPAIR, since=at(0), cleared_before=at(50))}
    old_xid = Finding(Signal.XID, Action.DRAIN, "XID 48", 5, "", 48, at(40), Scope.DEVICE)
    v = run(prior, [old_xid], 60, released=frozenset({5}))
    assert by_index(v)[5].state == DeviceState.RECOVERING
    v = run(by_index(v), [old_xid], 70)
    assert by_index(v)[5].state == DeviceState.RECOVERING  # before clearedBefore: acknowledged
    v = run(by_index(v), [dev(5)], 80)
    assert by_index(v)[5].state == DeviceState.DRAINING  # a live ECC counter is not


def test_flapping_gpu_awaits_repair_and_escalates_only_when_policy_says_node() -> None:
    qs = (at(-3000), at(-2000))
    prior = {6: DeviceRecord(6, state=DeviceState.RECOVERING, since=at(-100), healthy_since=at(-100), quarantines=qs)}
    v = run(prior, [dev(6)], 0)
    assert by_index(v)[6].state == DeviceState.AWAITING_REPAIR and by_index(v)[6].reason == "Flapping"
    assert not v.escalate
    node_policy = make_policy({"devices": {"onFlapping": "Node"}})
    v = run(prior, [dev(6)], 0, policy=node_policy)
    assert v.escalate and "onFlapping" in v.escalate_reason
    assert run(by_index(v), [], 10, policy=node_policy).escalate  # stays escalated while the GPU waits


def test_a_second_bad_gpu_escalates_by_default_not_with_a_higher_limit() -> None:
    v = run({}, [dev(1), dev(2)], 0)
    assert v.escalate and "maxBadGPUsPerNode 1" in v.escalate_reason
    v = run({}, [dev(1), dev(2)], 0, policy=make_policy({"devices": {"maxBadGPUsPerNode": 2}}))
    assert not v.escalate


def test_gpu_budget_admits_in_index_order_and_holds_the_rest() -> None:
    v = run({}, [dev(5), dev(2)], 0, gpu_budget=1)
    recs = by_index(v)
    assert recs[2].state == DeviceState.DRAINING
    assert recs[5].state == DeviceState.IN_SERVICE and recs[5].held_by_breaker
    assert [e.reason for e in v.events if e.index == 5] == ["QuarantineHeldBack"]
    v = run(recs, [dev(5), dev(2)], 10, gpu_budget=0)
    assert not [e for e in v.events if e.index == 5]  # held back once, not announced again
    v = run(by_index(v), [dev(5)], 20, gpu_budget=1)
    assert by_index(v)[5].state == DeviceState.DRAINING and not by_index(v)[5].held_by_breaker


def test_unplaced_device_finding_escalates() -> None:
    f = Finding(Signal.ECC, Action.DRAIN, "ecc", None, "GPU-unknown", None, T0, Scope.DEVICE)
    v = run({}, [f], 0)
    assert v.escalate and "cannot be told apart" in v.escalate_reason
    g = Finding(Signal.ECC, Action.DRAIN, "ecc", None, "GPU-0004", None, T0, Scope.DEVICE)
    assert by_index(run({}, [g], 0))[4].state == DeviceState.DRAINING  # found by UUID


def test_out_of_service_gpu_missing_from_report_is_kept() -> None:
    prior = {9: DeviceRecord(9, state=DeviceState.QUARANTINED, since=T0)}
    assert 9 in by_index(run(prior, [], 10))


# --- properties ---------------------------------------------------------------------------------

STATES = list(DeviceState)
_finding = st.builds(
    lambda i, a: dev(i, a),
    st.integers(0, 7),
    st.sampled_from([Action.OBSERVE, Action.CORDON, Action.DRAIN, Action.REPAIR]),
)
_record = st.builds(
    lambda i, s, h: DeviceRecord(i, state=s, since=at(-1000), healthy_since=None if h is None else at(-h)),
    st.integers(0, 7),
    st.sampled_from(STATES),
    st.one_of(st.none(), st.integers(0, 2000)),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_record, max_size=8),
    st.lists(_finding, max_size=6),
    st.integers(0, 4),
    st.booleans(),
    st.frozensets(st.integers(0, 7)),
    st.frozensets(st.integers(0, 7)),
)
def test_invariants(
    records: list[DeviceRecord],
    findings: list[Finding],
    budget: int,
    fresh: bool,
    drained: frozenset[int],
    released: frozenset[int],
) -> None:
    prior = {r.index: r for r in records}
    v = run(prior, findings, 0, gpu_budget=budget, fresh=fresh, drained=drained, released=released)
    after = by_index(v)
    entered = [i for i, r in after.items() if r.out_of_service and not (prior.get(i) or DeviceRecord(i)).out_of_service]
    assert len(entered) <= budget  # nothing leaves service past the GPU budget
    for i, r in after.items():
        before = prior.get(i) or DeviceRecord(i)
        if before.state == DeviceState.AWAITING_REPAIR and i not in released:
            assert r.state == DeviceState.AWAITING_REPAIR  # only a human lets it go
        if before.out_of_service and r.state == DeviceState.IN_SERVICE:
            assert i in v.lifted and fresh and before.state == DeviceState.RECOVERING
            assert before.healthy_since is not None and at(0) - before.healthy_since >= dt.timedelta(minutes=10)
    out = [r for r in v.records if r.out_of_service]
    assert v.escalate == (len(out) > 1)  # default maxBadGPUsPerNode 1; onFlapping AwaitingRepair
    assert set(v.lifted) <= {i for i, r in after.items() if r.state == DeviceState.IN_SERVICE}


# --- time between failures ----------------------------------------------------------------------


def test_a_gpu_back_in_service_taken_out_again_reports_the_time_since_its_previous_failure() -> None:
    # two days later: the previous quarantine is long out of the flapping window, lastFailures keeps it
    prior = {3: DeviceRecord(3, uuid="GPU-0003", last_failures=(at(-172_800),))}
    v = run(prior, [dev(3)], 0)
    assert v.intervals == ((3, 172_800.0),)
    assert by_index(v)[3].last_failures == (at(-172_800), at(0))
    assert devices_from_status({"devices": devices_to_status(v.records)})[3].last_failures == (at(-172_800), at(0))


def test_a_first_failure_and_a_relapse_on_probation_report_no_interval() -> None:
    v = run({}, [dev(3)], 0)
    assert v.intervals == () and by_index(v)[3].last_failures == (at(0),)
    recovering = DeviceRecord(
        3, state=DeviceState.RECOVERING, since=at(0), healthy_since=at(0), last_failures=(at(-10),)
    )
    v = run({3: recovering}, [dev(3)], 100)
    assert v.intervals == () and by_index(v)[3].last_failures == (at(-10), at(100))


def test_a_record_from_before_last_failures_falls_back_to_its_newest_quarantine() -> None:
    v = run({3: DeviceRecord(3, quarantines=(at(-3600),))}, [dev(3)], 0)
    assert v.intervals == ((3, 3600.0),)
