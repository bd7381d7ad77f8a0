"""assess(), beyond the table of test_assess.py: what a finding carries (reason, GPU, UUID, since,
detail), the application-XID repeat window against a brute-force count, a temperature that must be
sustained across evaluations (carried in ``pending``), and the Assessment's summary (level, top
finding, GPU counts)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.api.names import Action, Signal
from gpuhealth.api.report import Report
from gpuhealth.evaluation.assess import Assessment, Finding
from tests.unit.builders import T0, at, gpu, iso, make_policy, make_report, xid_event
from tests.unit.evaluation._assess_support import assess_at, eight_gpus, signals


def test_xid79_finding_reason_and_details() -> None:
    a = assess_at(make_report(xids=[xid_event(79, 10, 2)]))
    (f,) = a.findings
    assert f.reason == "XID79"
    assert f.uuid == "GPU-0002"  # taken from the device when the event has none
    assert f.since == at(10)
    assert a.level == Action.DRAIN
    assert a.top == f
    assert f.describe().startswith("GPU 2 (GPU-0002): XID 79")
    assert a.last_xid == "79 (GPU 2)"
    assert (a.total_gpus, a.healthy_gpus) == (8, 7)


def test_app_xid_once_is_an_ignored_finding() -> None:
    a = assess_at(make_report(xids=[xid_event(13, 10, 0)]))
    assert [(f.signal, f.action, f.code) for f in a.findings] == [(Signal.XID, Action.IGNORE, 13)]
    assert a.level == Action.IGNORE
    assert a.actionable() == ()
    assert a.healthy_gpus == 8


def test_repeated_app_xid_finding_reason_and_since() -> None:
    a = assess_at(make_report(xids=[xid_event(13, s, 4) for s in (1, 20, 40)]))
    (rep,) = [f for f in a.findings if f.signal == Signal.APP_XID_REPEATED]
    assert rep.reason == "RepeatedAppXID"
    assert rep.since == at(40)  # the occurrence that completed the count
    assert "3 times" in rep.detail
    assert a.top == rep


def test_latest_occurrence_of_an_xid_on_a_gpu_wins() -> None:
    a = assess_at(make_report(xids=[xid_event(79, 30, 2), xid_event(79, 10, 2)]))
    (f,) = a.findings
    assert f.since == at(30)


def test_xid_without_gpu_is_attributed_to_the_node() -> None:
    obj_xid = {"xid": 79, "time": iso(5), "uuid": "GPU-zz"}
    a = assess_at(make_report(xids=[obj_xid]))
    (f,) = a.findings
    assert (f.gpu, f.uuid) == (None, "GPU-zz")
    assert f.describe().startswith("node: ")
    assert a.last_xid == "79"


def test_app_xid_repeated_on_different_gpus_known_only_by_uuid_does_not_escalate() -> None:
    evs = [{"xid": 13, "time": iso(s), "uuid": u} for s, u in ((1, "GPU-a"), (2, "GPU-b"), (3, "GPU-c"))]
    a = assess_at(make_report(xids=evs))
    assert [f for f in a.findings if f.signal == Signal.APP_XID_REPEATED] == []


@settings(max_examples=150, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.integers(min_value=0, max_value=2), st.integers(min_value=-3000, max_value=60)),
        max_size=12,
    ),
    count=st.integers(min_value=2, max_value=4),
    window_s=st.sampled_from([60, 300, 600]),
    cleared_s=st.one_of(st.none(), st.integers(min_value=-3000, max_value=60)),
)
def test_app_xid_repeat_matches_a_brute_force_window_count(
    events: list[tuple[int, int]], count: int, window_s: int, cleared_s: int | None
) -> None:
    policy = make_policy({"rules": {"xid": {"applicationRepeat": {"count": count, "window": f"{window_s}s"}}}})
    a = assess_at(make_report(xids=[xid_event(13, t, g) for g, t in events]), policy, cleared_s=cleared_s)
    escalated = {f.gpu for f in a.findings if f.signal == Signal.APP_XID_REPEATED}
    expected = set()
    for g in range(3):
        times = sorted(t for gg, t in events if gg == g and (cleared_s is None or t > cleared_s))
        if any(sum(1 for u in times if t <= u <= t + window_s) >= count for t in times):
            expected.add(g)
    assert escalated == expected
    assert all(f.action == Action.DRAIN for f in a.findings if f.signal == Signal.APP_XID_REPEATED)


# --- thermal: temperature needs sustainedFor, carried across evaluations in `pending` -----------


def _hot(now_s: float, temp: int = 95) -> Report:
    return make_report(devices=eight_gpus(g3={"temperature": {"currentC": temp, "slowdownC": 87}}), heartbeat=now_s)


def test_temperature_over_threshold_is_pending_then_a_finding_after_sustained_for() -> None:
    policy = make_policy({"rules": {"thermal": {"temperatureThresholdC": 90, "sustainedFor": "5m"}}})
    a1 = assess_at(_hot(0), policy, now_s=0)
    assert signals(a1) == []
    assert dict(a1.pending) == {"temp/3": iso(0)}

    a2 = assess_at(_hot(299), policy, now_s=299, prior_pending=dict(a1.pending))
    assert signals(a2) == []
    assert dict(a2.pending) == {"temp/3": iso(0)}  # first-seen is kept, not refreshed

    a3 = assess_at(_hot(300), policy, now_s=300, prior_pending=dict(a2.pending))
    assert signals(a3) == [(Signal.THERMAL, Action.CORDON, 3, None)]
    assert a3.findings[0].since == T0
    assert dict(a3.pending) == {"temp/3": iso(0)}


def test_temperature_at_threshold_counts_and_below_clears_pending() -> None:
    policy = make_policy({"rules": {"thermal": {"temperatureThresholdC": 90, "sustainedFor": "1m"}}})
    a1 = assess_at(_hot(0, temp=90), policy, now_s=0)
    assert "temp/3" in a1.pending
    cool = assess_at(_hot(30, temp=89), policy, now_s=30, prior_pending=dict(a1.pending))
    assert dict(cool.pending) == {}
    hot_again = assess_at(_hot(100, temp=95), policy, now_s=100, prior_pending=dict(cool.pending))
    assert signals(hot_again) == []  # the clock restarted when it cooled down
    assert dict(hot_again.pending) == {"temp/3": iso(100)}


def test_temperature_without_prior_pending_never_fires_at_once() -> None:
    a = assess_at(_hot(10_000), now_s=10_000)
    assert signals(a) == []


def test_temperature_uses_the_policy_action() -> None:
    policy = make_policy({"rules": {"thermal": {"sustainedFor": "30s", "action": "drain"}}})
    a = assess_at(_hot(60), policy, now_s=60, prior_pending={"temp/3": iso(0)})
    assert signals(a) == [(Signal.THERMAL, Action.DRAIN, 3, None)]


# --- Assessment helpers --------------------------------------------------------------------------


def test_level_top_and_actionable() -> None:
    cordon = Finding(Signal.THERMAL, Action.CORDON, "hot", 1, since=at(5))
    drain_late = Finding(Signal.ECC, Action.DRAIN, "ecc", 2, since=at(9))
    drain_early = Finding(Signal.PENDING_REMAP, Action.DRAIN, "pending", 3, since=at(1))
    ignored = Finding(Signal.XID, Action.IGNORE, "x", 0, code=13, since=at(0))
    a = Assessment(findings=(cordon, drain_late, drain_early, ignored))
    assert a.level == Action.DRAIN
    assert a.top == drain_early  # the most severe; the earliest among equals
    assert a.actionable() == (cordon, drain_late, drain_early)
    assert Assessment().level == Action.IGNORE
    assert Assessment().top is None


def test_healthy_gpus_counts_only_quarantine_level_findings_and_lost() -> None:
    report = make_report(
        devices=eight_gpus(g0={"lost": True}, g1={"ecc": {"volatileUncorrected": 1}}),
        xids=[xid_event(92, 1, 2)],  # observe: still healthy
    )
    a = assess_at(report)
    assert (a.total_gpus, a.healthy_gpus) == (8, 6)


def test_total_gpus_uses_the_expected_count_when_gpus_are_missing() -> None:
    a = assess_at(make_report(devices=[gpu(i) for i in range(6)]))
    assert (a.total_gpus, a.healthy_gpus) == (8, 6)
