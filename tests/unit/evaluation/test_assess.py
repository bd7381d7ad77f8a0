"""assess(): what the facts in a GPUNodeHealth report say under a policy. Reports are built as CRD dicts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.api.names import GPU_COUNT_LABEL, Action, Signal
from gpuhealth.api.policy import Policy
from gpuhealth.api.report import Report
from gpuhealth.evaluation.assess import Assessment, Finding, NodeView, assess
from tests.unit.builders import NODE, T0, at, gpu, iso, make_policy, make_report, xid_event

VIEW = NodeView(NODE, {GPU_COUNT_LABEL: "8"})


def _assess(
    report: Report | None,
    policy: Policy | None = None,
    now_s: float = 60,
    view: NodeView = VIEW,
    prior_pending: dict[str, str] | None = None,
    cleared_s: float | None = None,
) -> Assessment:
    return assess(
        policy or make_policy(),
        report,
        view,
        at(now_s),
        prior_pending,
        None if cleared_s is None else at(cleared_s),
    )


def _sig(a: Assessment) -> list[tuple[Signal, Action, int | None, int | None]]:
    """The actionable findings as (signal, action, gpu, code), sorted by key."""
    return [(f.signal, f.action, f.gpu, f.code) for f in a.actionable()]


def _devices(**by_index: dict[str, Any]) -> list[dict[str, Any]]:
    """Eight GPUs; ``g3={...}`` adds fields to GPU 3."""
    return [gpu(i, **by_index.get(f"g{i}", {})) for i in range(8)]


@dataclass(frozen=True)
class Case:
    id: str
    report: dict[str, Any]
    expect: list[tuple[Signal, Action, int | None, int | None]]
    policy: dict[str, Any] = field(default_factory=dict)
    cleared_s: float | None = None
    now_s: float = 60
    labels: dict[str, str] = field(default_factory=lambda: {GPU_COUNT_LABEL: "8"})
    capacity: int | None = None


X, R, E = Signal.XID, Signal.APP_XID_REPEATED, Signal.ECC
IGN, OBS, COR, DRN, REP = Action.IGNORE, Action.OBSERVE, Action.CORDON, Action.DRAIN, Action.REPAIR

CASES = [
    Case("clean", {}, []),
    Case("xid79-drain", {"xids": [xid_event(79, 10, 2)]}, [(X, DRN, 2, 79)]),
    Case("xid48-drain", {"xids": [xid_event(48, 10, 1)]}, [(X, DRN, 1, 48)]),
    Case("xid74-cordon", {"xids": [xid_event(74, 10, 0)]}, [(X, COR, 0, 74)]),
    Case("xid92-observe", {"xids": [xid_event(92, 10, 0)]}, [(X, OBS, 0, 92)]),
    Case("xid-unknown-code-observe", {"xids": [xid_event(1000, 10, 0)]}, [(X, OBS, 0, 1000)]),
    Case("app-xid13-once-ignored", {"xids": [xid_event(13, 10, 0)]}, []),
    Case("app-xid13-twice-ignored", {"xids": [xid_event(13, 10, 0), xid_event(13, 20, 0)]}, []),
    Case(
        "app-xid13-3x-one-gpu-escalates",
        {"xids": [xid_event(13, s, 4) for s in (1, 20, 40)]},
        [(R, DRN, 4, 13)],
    ),
    Case(
        "app-xid31-3x-uses-policy-action",
        {"xids": [xid_event(31, s, 4) for s in (1, 20, 40)]},
        [(R, COR, 4, 31)],
        policy={"rules": {"xid": {"applicationRepeat": {"action": "cordon"}}}},
    ),
    Case(
        "app-xid-repeat-count-from-policy",
        {"xids": [xid_event(13, s, 4) for s in (1, 20, 40)]},
        [],
        policy={"rules": {"xid": {"applicationRepeat": {"count": 4}}}},
    ),
    Case(
        "app-xid13-3x-across-gpus-no-escalation",
        {"xids": [xid_event(13, 1, 0), xid_event(13, 2, 1), xid_event(13, 3, 2)]},
        [],
    ),
    Case(
        "app-xid-different-codes-one-gpu-no-escalation",
        {"xids": [xid_event(13, 1, 0), xid_event(31, 2, 0), xid_event(43, 3, 0)]},
        [],
    ),
    Case(
        "app-xid13-3x-spread-beyond-window-no-escalation",
        {"xids": [xid_event(13, s, 0) for s in (-1200, -600, 1)]},
        [],
        policy={"rules": {"xid": {"applicationRepeat": {"window": "10m"}}}},
    ),
    Case(
        "app-xid13-3x-exactly-window-escalates",
        {"xids": [xid_event(13, s, 0) for s in (-540, -100, 60)]},
        [(R, DRN, 0, 13)],
        policy={"rules": {"xid": {"applicationRepeat": {"window": "10m"}}}},
    ),
    Case(
        "app-xid-3-of-5-inside-window-escalates",
        {"xids": [xid_event(13, s, 0) for s in (-3000, -2000, 0, 10, 20)]},
        [(R, DRN, 0, 13)],
    ),
    Case("xid-at-cleared-before-ignored", {"xids": [xid_event(79, 10, 2)]}, [], cleared_s=10),
    Case("xid-before-cleared-before-ignored", {"xids": [xid_event(79, 5, 2)]}, [], cleared_s=10),
    Case("xid-after-cleared-before-counts", {"xids": [xid_event(79, 11, 2)]}, [(X, DRN, 2, 79)], cleared_s=10),
    Case(
        "app-repeat-only-counts-after-cleared-before",
        {"xids": [xid_event(13, s, 0) for s in (1, 2, 30)]},
        [],
        cleared_s=2,
    ),
    Case(
        "override-wins-over-catalog",
        {"xids": [xid_event(79, 10, 2)]},
        [(X, COR, 2, 79)],
        policy={"rules": {"xid": {"overrides": [{"code": 79, "action": "cordon"}]}}},
    ),
    Case(
        "override-can-ignore",
        {"xids": [xid_event(79, 10, 2)]},
        [],
        policy={"rules": {"xid": {"overrides": [{"code": 79, "action": "ignore"}]}}},
    ),
    Case(
        "override-of-app-xid-applies-once-and-disables-repeat",
        {"xids": [xid_event(13, s, 1) for s in (1, 2, 3)]},
        [(X, OBS, 1, 13)],
        policy={"rules": {"xid": {"overrides": [{"code": 13, "action": "observe"}]}}},
    ),
    Case(
        "xid154-uses-device-recovery-reboot",
        {"xids": [xid_event(154, 10, 3)], "devices": _devices(g3={"recoveryAction": "Reboot"})},
        [(X, DRN, 3, 154)],
    ),
    Case(
        "xid154-uses-device-recovery-none",
        {"xids": [xid_event(154, 10, 3)], "devices": _devices(g3={"recoveryAction": "None"})},
        [(X, OBS, 3, 154)],
    ),
    Case(
        "xid154-uses-device-recovery-system-reboot",
        {"xids": [xid_event(154, 10, 3)], "devices": _devices(g3={"recoveryAction": "SystemReboot"})},
        [(X, DRN, 3, 154)],
    ),
    Case(
        "xid154-uses-device-recovery-bus-reset",
        {"xids": [xid_event(154, 10, 3)], "devices": _devices(g3={"recoveryAction": "BusReset"})},
        [(X, DRN, 3, 154)],
    ),
    Case(
        "xid154-uses-device-recovery-recover-imex-domain",
        {"xids": [xid_event(154, 10, 3)], "devices": _devices(g3={"recoveryAction": "RecoverImexDomain"})},
        [(X, DRN, 3, 154)],
    ),
    Case(
        "xid154-with-a-newer-recovery-action-uses-catalog",
        {"xids": [xid_event(154, 10, 3)], "devices": _devices(g3={"recoveryAction": "SomethingNew"})},
        [(X, OBS, 3, 154)],
    ),
    Case(
        "xid154-without-recovery-action-uses-catalog",
        {"xids": [xid_event(154, 10, 3)]},
        [(X, OBS, 3, 154)],
    ),
    Case(
        "xid154-without-gpu-index-uses-catalog",
        {"xids": [xid_event(154, 10, None)], "devices": _devices(g3={"recoveryAction": "Reboot"})},
        [(X, OBS, None, 154)],
    ),
    Case(
        "xid154-override-beats-recovery-action",
        {"xids": [xid_event(154, 10, 3)], "devices": _devices(g3={"recoveryAction": "Reboot"})},
        [(X, REP, 3, 154)],
        policy={"rules": {"xid": {"overrides": [{"code": 154, "action": "repair"}]}}},
    ),
    Case("ecc-at-threshold", {"devices": _devices(g5={"ecc": {"volatileUncorrected": 1}})}, [(E, DRN, 5, None)]),
    Case(
        "ecc-below-policy-threshold",
        {"devices": _devices(g5={"ecc": {"volatileUncorrected": 3}})},
        [],
        policy={"rules": {"ecc": {"uncorrectedThreshold": 4}}},
    ),
    Case(
        "ecc-at-policy-threshold-policy-action",
        {"devices": _devices(g5={"ecc": {"volatileUncorrected": 4}})},
        [(E, REP, 5, None)],
        policy={"rules": {"ecc": {"uncorrectedThreshold": 4, "action": "repair"}}},
    ),
    Case("ecc-aggregate-only-is-history", {"devices": _devices(g5={"ecc": {"aggregateUncorrected": 9}})}, []),
    Case(
        "row-remap-failure-repair",
        {"devices": _devices(g6={"remappedRows": {"failure": True}})},
        [(Signal.ROW_REMAP_FAILURE, REP, 6, None)],
    ),
    Case(
        "row-remap-pending",
        {"devices": _devices(g6={"remappedRows": {"pending": True}})},
        [(Signal.PENDING_REMAP, DRN, 6, None)],
    ),
    Case(
        "retired-pages-pending",
        {"devices": _devices(g2={"retiredPages": {"pending": True}})},
        [(Signal.PENDING_REMAP, DRN, 2, None)],
    ),
    Case(
        "pending-remap-policy-action",
        {"devices": _devices(g2={"retiredPages": {"pending": True}})},
        [(Signal.PENDING_REMAP, COR, 2, None)],
        policy={"rules": {"pendingRemap": {"action": "cordon"}}},
    ),
    Case(
        "hw-thermal-0x40-sustained",
        {"devices": _devices(g1={"clockEventReasons": 0x40, "clockEventsSince": iso(-240)})},
        [(Signal.THERMAL, COR, 1, None)],
    ),
    Case(
        "hw-slowdown-0x8-sustained",
        {"devices": _devices(g1={"clockEventReasons": 0x8 | 0x1, "clockEventsSince": iso(-600)})},
        [(Signal.THERMAL, COR, 1, None)],
    ),
    Case(
        "hw-thermal-not-yet-sustained",
        {"devices": _devices(g1={"clockEventReasons": 0x40, "clockEventsSince": iso(-239)})},
        [],
    ),
    Case(
        "hw-thermal-without-since",
        {"devices": _devices(g1={"clockEventReasons": 0x40})},
        [],
    ),
    Case(
        "sw-thermal-0x20-and-power-brake-0x80-are-not-hw-thermal",
        {"devices": _devices(g1={"clockEventReasons": 0x20 | 0x80, "clockEventsSince": iso(-3600)})},
        [],
    ),
    Case(
        "hw-thermal-slowdown-rule-disabled",
        {"devices": _devices(g1={"clockEventReasons": 0x40, "clockEventsSince": iso(-3600)})},
        [],
        policy={"rules": {"thermal": {"slowdown": False}}},
    ),
    Case(
        "gpu-lost",
        {"devices": _devices(g7={"lost": True, "ecc": {"volatileUncorrected": 9}})},
        [(Signal.GPU_LOST, DRN, 7, None)],  # a lost GPU reports nothing else
    ),
    Case(
        "gpu-count-below-label",
        {"devices": [gpu(i) for i in range(7)]},
        [(Signal.GPU_COUNT, COR, None, None)],
    ),
    Case(
        "gpu-count-policy-expected-beats-label",
        {"devices": [gpu(i) for i in range(4)]},
        [],
        policy={"rules": {"gpuCount": {"expected": 4}}},
    ),
    Case(
        "gpu-count-policy-expected-policy-action",
        {"devices": [gpu(i) for i in range(3)]},
        [(Signal.GPU_COUNT, DRN, None, None)],
        policy={"rules": {"gpuCount": {"expected": 4, "action": "drain"}}},
    ),
    Case(
        "gpu-count-falls-back-to-capacity",
        {"devices": [gpu(i) for i in range(3)]},
        [(Signal.GPU_COUNT, COR, None, None)],
        labels={},
        capacity=4,
    ),
    Case("gpu-count-unknown-expectation", {"devices": [gpu(0)]}, [], labels={GPU_COUNT_LABEL: "eight"}),
    Case("gpu-count-more-than-label-is-fine", {"devices": [gpu(i) for i in range(9)]}, []),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_assess_table(case: Case) -> None:
    report = make_report(**case.report)
    view = NodeView(NODE, case.labels, case.capacity)
    a = _assess(report, make_policy(case.policy), case.now_s, view, cleared_s=case.cleared_s)
    assert not a.unknown, a.unknown_reason
    assert sorted(_sig(a), key=str) == sorted(case.expect, key=str)


def test_xid79_finding_reason_and_details() -> None:
    a = _assess(make_report(xids=[xid_event(79, 10, 2)]))
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
    a = _assess(make_report(xids=[xid_event(13, 10, 0)]))
    assert [(f.signal, f.action, f.code) for f in a.findings] == [(Signal.XID, Action.IGNORE, 13)]
    assert a.level == Action.IGNORE
    assert a.actionable() == ()
    assert a.healthy_gpus == 8


def test_repeated_app_xid_finding_reason_and_since() -> None:
    a = _assess(make_report(xids=[xid_event(13, s, 4) for s in (1, 20, 40)]))
    (rep,) = [f for f in a.findings if f.signal == Signal.APP_XID_REPEATED]
    assert rep.reason == "RepeatedAppXID"
    assert rep.since == at(40)  # the occurrence that completed the count
    assert "3 times" in rep.detail
    assert a.top == rep


def test_latest_occurrence_of_an_xid_on_a_gpu_wins() -> None:
    a = _assess(make_report(xids=[xid_event(79, 30, 2), xid_event(79, 10, 2)]))
    (f,) = a.findings
    assert f.since == at(30)


def test_xid_without_gpu_is_attributed_to_the_node() -> None:
    obj_xid = {"xid": 79, "time": iso(5), "uuid": "GPU-zz"}
    a = _assess(make_report(xids=[obj_xid]))
    (f,) = a.findings
    assert (f.gpu, f.uuid) == (None, "GPU-zz")
    assert f.describe().startswith("node: ")
    assert a.last_xid == "79"


def test_app_xid_repeated_on_different_gpus_known_only_by_uuid_does_not_escalate() -> None:
    evs = [{"xid": 13, "time": iso(s), "uuid": u} for s, u in ((1, "GPU-a"), (2, "GPU-b"), (3, "GPU-c"))]
    a = _assess(make_report(xids=evs))
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
    a = _assess(make_report(xids=[xid_event(13, t, g) for g, t in events]), policy, cleared_s=cleared_s)
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
    return make_report(devices=_devices(g3={"temperature": {"currentC": temp, "slowdownC": 87}}), heartbeat=now_s)


def test_temperature_over_threshold_is_pending_then_a_finding_after_sustained_for() -> None:
    policy = make_policy({"rules": {"thermal": {"temperatureThresholdC": 90, "sustainedFor": "5m"}}})
    a1 = _assess(_hot(0), policy, now_s=0)
    assert _sig(a1) == []
    assert dict(a1.pending) == {"temp/3": iso(0)}

    a2 = _assess(_hot(299), policy, now_s=299, prior_pending=dict(a1.pending))
    assert _sig(a2) == []
    assert dict(a2.pending) == {"temp/3": iso(0)}  # first-seen is kept, not refreshed

    a3 = _assess(_hot(300), policy, now_s=300, prior_pending=dict(a2.pending))
    assert _sig(a3) == [(Signal.THERMAL, Action.CORDON, 3, None)]
    assert a3.findings[0].since == T0
    assert dict(a3.pending) == {"temp/3": iso(0)}


def test_temperature_at_threshold_counts_and_below_clears_pending() -> None:
    policy = make_policy({"rules": {"thermal": {"temperatureThresholdC": 90, "sustainedFor": "1m"}}})
    a1 = _assess(_hot(0, temp=90), policy, now_s=0)
    assert "temp/3" in a1.pending
    cool = _assess(_hot(30, temp=89), policy, now_s=30, prior_pending=dict(a1.pending))
    assert dict(cool.pending) == {}
    hot_again = _assess(_hot(100, temp=95), policy, now_s=100, prior_pending=dict(cool.pending))
    assert _sig(hot_again) == []  # the clock restarted when it cooled down
    assert dict(hot_again.pending) == {"temp/3": iso(100)}


def test_temperature_without_prior_pending_never_fires_at_once() -> None:
    a = _assess(_hot(10_000), now_s=10_000)
    assert _sig(a) == []


def test_temperature_uses_the_policy_action() -> None:
    policy = make_policy({"rules": {"thermal": {"sustainedFor": "30s", "action": "drain"}}})
    a = _assess(_hot(60), policy, now_s=60, prior_pending={"temp/3": iso(0)})
    assert _sig(a) == [(Signal.THERMAL, Action.DRAIN, 3, None)]


# --- unknown facts -----------------------------------------------------------------------------


def test_no_report_is_unknown() -> None:
    a = _assess(None)
    assert a.unknown
    assert "no GPUNodeHealth report" in a.unknown_reason
    assert a.findings == ()


def test_heartbeat_older_than_agent_silence_is_unknown() -> None:
    report = make_report(heartbeat=0)
    assert not _assess(report, now_s=120).unknown  # exactly at the limit is still fresh
    a = _assess(report, now_s=121)
    assert a.unknown
    assert "no heartbeat from the agent for 121s (limit 120s)" in a.unknown_reason


def test_agent_silence_after_comes_from_the_policy() -> None:
    policy = make_policy({"rules": {"agentSilence": {"after": "30s"}}})
    assert _assess(make_report(heartbeat=0), policy, now_s=31).unknown


def test_missing_heartbeat_is_unknown() -> None:
    a = _assess(make_report(heartbeat=None))
    assert a.unknown
    assert "never sent a heartbeat" in a.unknown_reason


def test_nvml_unavailable_is_unknown_and_not_a_count_mismatch() -> None:
    report = make_report(devices=[], nvml={"available": False, "error": "Driver Not Loaded"})
    a = _assess(report)
    assert a.unknown
    assert "Driver Not Loaded" in a.unknown_reason
    assert _sig(a) == []


def test_unknown_still_reports_the_evidence_it_has() -> None:
    a = _assess(make_report(heartbeat=0, xids=[xid_event(79, 1, 0)]), now_s=1000)
    assert a.unknown
    assert _sig(a) == [(Signal.XID, Action.DRAIN, 0, 79)]


def test_fresh_report_has_no_unknown_reason() -> None:
    a = _assess(make_report())
    assert not a.unknown and a.unknown_reason == ""
    assert (a.total_gpus, a.healthy_gpus, a.last_xid) == (8, 8, "")


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
        devices=_devices(g0={"lost": True}, g1={"ecc": {"volatileUncorrected": 1}}),
        xids=[xid_event(92, 1, 2)],  # observe: still healthy
    )
    a = _assess(report)
    assert (a.total_gpus, a.healthy_gpus) == (8, 6)


def test_total_gpus_uses_the_expected_count_when_gpus_are_missing() -> None:
    a = _assess(make_report(devices=[gpu(i) for i in range(6)]))
    assert (a.total_gpus, a.healthy_gpus) == (8, 6)
