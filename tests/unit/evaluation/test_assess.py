"""assess(): what the facts in a GPUNodeHealth report say under a policy, as one table of cases: each
signal (XIDs, application XIDs repeated, ECC, row remapping, thermal clocks, a lost GPU, the GPU
count) to the finding it makes. Reports are built as CRD dicts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuhealth.api.names import GPU_COUNT_LABEL, Action, Signal
from gpuhealth.evaluation.assess import NodeView
from tests.unit.builders import NODE, gpu, iso, make_policy, make_report, xid_event
from tests.unit.evaluation._assess_support import assess_at, eight_gpus, signals


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
        {"xids": [xid_event(154, 10, 3)], "devices": eight_gpus(g3={"recoveryAction": "Reboot"})},
        [(X, DRN, 3, 154)],
    ),
    Case(
        "xid154-uses-device-recovery-none",
        {"xids": [xid_event(154, 10, 3)], "devices": eight_gpus(g3={"recoveryAction": "None"})},
        [(X, OBS, 3, 154)],
    ),
    Case(
        "xid154-uses-device-recovery-system-reboot",
        {"xids": [xid_event(154, 10, 3)], "devices": eight_gpus(g3={"recoveryAction": "SystemReboot"})},
        [(X, DRN, 3, 154)],
    ),
    Case(
        "xid154-uses-device-recovery-bus-reset",
        {"xids": [xid_event(154, 10, 3)], "devices": eight_gpus(g3={"recoveryAction": "BusReset"})},
        [(X, DRN, 3, 154)],
    ),
    Case(
        "xid154-uses-device-recovery-recover-imex-domain",
        {"xids": [xid_event(154, 10, 3)], "devices": eight_gpus(g3={"recoveryAction": "RecoverImexDomain"})},
        [(X, DRN, 3, 154)],
    ),
    Case(
        "xid154-with-a-newer-recovery-action-uses-catalog",
        {"xids": [xid_event(154, 10, 3)], "devices": eight_gpus(g3={"recoveryAction": "SomethingNew"})},
        [(X, OBS, 3, 154)],
    ),
    Case(
        "xid154-without-recovery-action-uses-catalog",
        {"xids": [xid_event(154, 10, 3)]},
        [(X, OBS, 3, 154)],
    ),
    Case(
        # The XID names no GPU: the catalog's verdict; GPU 3's own field still asks for a reboot.
        "xid154-without-gpu-index-uses-catalog",
        {"xids": [xid_event(154, 10, None)], "devices": eight_gpus(g3={"recoveryAction": "Reboot"})},
        [(X, OBS, None, 154), (X, DRN, 3, 154)],
    ),
    Case(
        "recovery-action-without-xid154",
        {"devices": eight_gpus(g3={"recoveryAction": "Reboot"})},
        [(X, DRN, 3, 154)],
    ),
    Case(
        "recovery-action-none-without-xid154",
        {"devices": eight_gpus(g3={"recoveryAction": "None"})},
        [],
    ),
    Case(
        "xid154-override-beats-recovery-action",
        {"xids": [xid_event(154, 10, 3)], "devices": eight_gpus(g3={"recoveryAction": "Reboot"})},
        [(X, REP, 3, 154)],
        policy={"rules": {"xid": {"overrides": [{"code": 154, "action": "repair"}]}}},
    ),
    Case("ecc-at-threshold", {"devices": eight_gpus(g5={"ecc": {"volatileUncorrected": 1}})}, [(E, DRN, 5, None)]),
    Case(
        "ecc-below-policy-threshold",
        {"devices": eight_gpus(g5={"ecc": {"volatileUncorrected": 3}})},
        [],
        policy={"rules": {"ecc": {"uncorrectedThreshold": 4}}},
    ),
    Case(
        "ecc-at-policy-threshold-policy-action",
        {"devices": eight_gpus(g5={"ecc": {"volatileUncorrected": 4}})},
        [(E, REP, 5, None)],
        policy={"rules": {"ecc": {"uncorrectedThreshold": 4, "action": "repair"}}},
    ),
    Case("ecc-aggregate-only-is-history", {"devices": eight_gpus(g5={"ecc": {"aggregateUncorrected": 9}})}, []),
    Case(
        "row-remap-failure-repair",
        {"devices": eight_gpus(g6={"remappedRows": {"failure": True}})},
        [(Signal.ROW_REMAP_FAILURE, REP, 6, None)],
    ),
    Case(
        "row-remap-pending",
        {"devices": eight_gpus(g6={"remappedRows": {"pending": True}})},
        [(Signal.PENDING_REMAP, DRN, 6, None)],
    ),
    Case(
        "retired-pages-pending",
        {"devices": eight_gpus(g2={"retiredPages": {"pending": True}})},
        [(Signal.PENDING_REMAP, DRN, 2, None)],
    ),
    Case(
        "pending-remap-policy-action",
        {"devices": eight_gpus(g2={"retiredPages": {"pending": True}})},
        [(Signal.PENDING_REMAP, COR, 2, None)],
        policy={"rules": {"pendingRemap": {"action": "cordon"}}},
    ),
    Case(
        "hw-thermal-0x40-sustained",
        {"devices": eight_gpus(g1={"clockEventReasons": 0x40, "clockEventsSince": iso(-240)})},
        [(Signal.THERMAL, COR, 1, None)],
    ),
    Case(
        "hw-slowdown-0x8-alone-is-not-thermal",
        {"devices": eight_gpus(g1={"clockEventReasons": 0x8 | 0x1, "clockEventsSince": iso(-600)})},
        [(Signal.HW_SLOWDOWN, COR, 1, None)],
    ),
    Case(
        "hw-slowdown-0x8-not-yet-sustained",
        {"devices": eight_gpus(g1={"clockEventReasons": 0x8, "clockEventsSince": iso(-239)})},
        [],
    ),
    Case(
        "hw-slowdown-0x8-with-0x40-is-thermal-only",
        {"devices": eight_gpus(g1={"clockEventReasons": 0x8 | 0x40, "clockEventsSince": iso(-600)})},
        [(Signal.THERMAL, COR, 1, None)],
    ),
    Case(
        "power-brake-0x80-sustained",
        {"devices": eight_gpus(g4={"clockEventReasons": 0x80 | 0x8, "clockEventsSince": iso(-60)})},
        [(Signal.POWER_BRAKE, COR, 4, None)],
    ),
    Case(
        "power-brake-0x80-not-yet-sustained",
        {"devices": eight_gpus(g4={"clockEventReasons": 0x80, "clockEventsSince": iso(1)})},
        [],
    ),
    Case(
        "power-brake-policy-action-and-duration",
        {"devices": eight_gpus(g4={"clockEventReasons": 0x80, "clockEventsSince": iso(-10)})},
        [(Signal.POWER_BRAKE, OBS, 4, None)],
        policy={"rules": {"powerBrake": {"sustainedFor": "10s", "action": "observe"}}},
    ),
    Case(
        "power-brake-disabled",
        {"devices": eight_gpus(g4={"clockEventReasons": 0x80, "clockEventsSince": iso(-600)})},
        [],
        policy={"rules": {"powerBrake": {"enabled": False}}},
    ),
    Case(
        "power-brake-and-hw-thermal-are-two-findings",
        {"devices": eight_gpus(g4={"clockEventReasons": 0x80 | 0x40, "clockEventsSince": iso(-600)})},
        [(Signal.POWER_BRAKE, COR, 4, None), (Signal.THERMAL, COR, 4, None)],
    ),
    Case(
        "sw-thermal-0x20-alone-is-nothing-as-before",
        {"devices": eight_gpus(g4={"clockEventReasons": 0x20, "clockEventsSince": iso(-600)})},
        [],
    ),
    Case(
        "hw-thermal-not-yet-sustained",
        {"devices": eight_gpus(g1={"clockEventReasons": 0x40, "clockEventsSince": iso(-239)})},
        [],
    ),
    Case(
        "hw-thermal-without-since",
        {"devices": eight_gpus(g1={"clockEventReasons": 0x40})},
        [],
    ),
    Case(
        "sw-thermal-0x20-and-power-brake-0x80-are-not-hw-thermal",
        {"devices": eight_gpus(g1={"clockEventReasons": 0x20 | 0x80, "clockEventsSince": iso(-3600)})},
        [(Signal.POWER_BRAKE, COR, 1, None)],
    ),
    Case(
        "hw-thermal-slowdown-rule-disabled",
        {"devices": eight_gpus(g1={"clockEventReasons": 0x40, "clockEventsSince": iso(-3600)})},
        [],
        policy={"rules": {"thermal": {"slowdown": False}}},
    ),
    Case(
        "gpu-lost",
        {"devices": eight_gpus(g7={"lost": True, "ecc": {"volatileUncorrected": 9}})},
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
    Case(
        "inforom-corrupt-observed-not-quarantined",
        {"devices": [gpu(0, inforomCorrupt=True), gpu(1, inforomCorrupt=False), *(gpu(i) for i in range(2, 8))]},
        [(Signal.INFOROM_CORRUPT, OBS, 0, None)],
    ),
    Case("gpu-count-more-than-label-is-fine", {"devices": [gpu(i) for i in range(9)]}, []),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_assess_table(case: Case) -> None:
    report = make_report(**case.report)
    view = NodeView(NODE, case.labels, case.capacity)
    a = assess_at(report, make_policy(case.policy), case.now_s, view, cleared_s=case.cleared_s)
    assert not a.unknown, a.unknown_reason
    assert sorted(signals(a), key=str) == sorted(case.expect, key=str)
