"""Each NVML recovery action 0-7 end to end through the pure chain: a report whose GPU carries it and
an XID 154 on that GPU -> assess (verdict, scope) -> the catalog's ladder for it -> the ladder's first
move. The expectations are written out here, not read from ``api/recovery.py``, so the table cannot
drift from what docs/remediation.md promises (NVIDIA's meaning of each value is cited there)."""

from __future__ import annotations

import pytest

from gpuhealth.api.devices import DeviceState
from gpuhealth.api.names import Action, Scope, Signal
from gpuhealth.api.recovery import RECOVERY, RecoveryAction
from gpuhealth.api.remediation import RemediationSettings, StepKind
from gpuhealth.api.remediation_status import Phase
from gpuhealth.evaluation.assess import Finding, NodeView, assess
from gpuhealth.evaluation.ladder import GPU, Observed, advance, steps_for
from tests.unit.builders import at, gpu, make_policy, make_report, xid_event

# NVML value, report spelling, verdict, scope, first step (None: no ladder), steps after it
CASES = [
    (0, "None", Action.OBSERVE, Scope.NODE, None, []),
    (1, "Reset", Action.DRAIN, Scope.DEVICE, StepKind.GPU_RESET, [StepKind.NODE_REBOOT, StepKind.REPLACE]),
    (2, "Reboot", Action.DRAIN, Scope.NODE, StepKind.NODE_REBOOT, [StepKind.REPLACE]),
    (3, "DrainP2P", Action.DRAIN, Scope.NODE, StepKind.NODE_REBOOT, [StepKind.REPLACE]),
    # its NVLink peers not reported (this report has none): no reset (tests/unit/evaluation/test_peers.py)
    (4, "DrainAndReset", Action.DRAIN, Scope.DEVICE, StepKind.NODE_REBOOT, [StepKind.REPLACE]),
    (5, "RecoverImexDomain", Action.DRAIN, Scope.DOMAIN, StepKind.NODE_REBOOT, [StepKind.REPLACE]),
    (6, "BusReset", Action.DRAIN, Scope.DEVICE, StepKind.GPU_RESET, [StepKind.NODE_REBOOT, StepKind.REPLACE]),
    (7, "SystemReboot", Action.DRAIN, Scope.NODE, StepKind.NODE_REBOOT, [StepKind.REPLACE]),
]


def test_every_nvml_value_has_a_case() -> None:
    assert sorted(c[0] for c in CASES) == sorted(r.nvml for r in RECOVERY.values()) == list(range(8))


@pytest.mark.parametrize(("nvml", "spelling", "verdict", "scope", "first", "rest"), CASES, ids=[c[1] for c in CASES])
def test_recovery_action_through_assess_scope_and_ladder(
    nvml: int, spelling: str, verdict: Action, scope: Scope, first: StepKind | None, rest: list[StepKind]
) -> None:
    assert RecoveryAction.from_nvml(nvml) == RecoveryAction(spelling)
    report = make_report(devices=[gpu(3, recoveryAction=spelling)], xids=[xid_event(154, -1, gpu_index=3)])
    facts = report.device(3)
    assert facts is not None and facts.recovery_action is RecoveryAction(spelling)  # typed by parse_report

    a = assess(make_policy(), report, NodeView("n", gpu_capacity=1), at(0))
    (finding,) = [f for f in a.findings if f.code == 154]
    assert (finding.action, finding.scope) == (verdict, scope)

    steps = steps_for(RemediationSettings(enabled=True), finding.reason, facts.recovery_action)
    assert [s.kind for s in steps] == ([first, *rest] if first is not None else [])
    held = GPU(3, "GPU-3", DeviceState.QUARANTINED, finding.reason, at(0), True, "rule-3", False)
    move = advance(None, held, steps, Observed(may_start=True), at(1))
    if first is None:
        assert move.record is None and move.start is None  # nothing to repair: observed only
    elif first == StepKind.GPU_RESET:
        assert move.start == StepKind.GPU_RESET and move.record is not None and move.record.phase == Phase.PENDING
    else:
        assert move.start is None and move.record is not None
        assert (move.record.step, move.record.phase) == (StepKind.NODE_REBOOT, Phase.HANDED_OFF)


@pytest.mark.parametrize(("nvml", "spelling", "verdict", "scope", "first", "rest"), CASES, ids=[c[1] for c in CASES])
def test_a_recovery_action_without_its_xid_154_gets_the_same_verdict_scope_and_ladder(
    nvml: int, spelling: str, verdict: Action, scope: Scope, first: StepKind | None, rest: list[StepKind]
) -> None:
    """The agent reads the field itself (NVML field 230): a GPU that reports a recovery action gets its
    verdict, scope and first step from the one table though no XID 154 came with it (an agent started
    after the XID, a missed event), as docs/remediation.md promises. ``None`` needs nothing: no finding."""
    report = make_report(devices=[gpu(3, recoveryAction=spelling)])
    a = assess(make_policy(), report, NodeView("n", gpu_capacity=1), at(0))
    if first is None:
        assert a.findings == ()
        return
    (finding,) = a.findings
    assert (finding.code, finding.gpu, finding.action, finding.scope) == (154, 3, verdict, scope)
    assert f"recovery action {spelling}" in finding.detail and "no XID 154" in finding.detail
    steps = steps_for(RemediationSettings(enabled=True), finding.reason, RecoveryAction(spelling))
    assert [s.kind for s in steps] == [first, *rest]


def test_the_recovery_action_is_one_finding_with_its_xid_154_and_holds_after_a_release() -> None:
    """With its XID 154 the GPU has one finding, the XID's; a release acknowledges the XID but not the
    field, which still says what the GPU needs until a reset or a reboot clears it."""
    report = make_report(devices=[gpu(3, recoveryAction="Reboot")], xids=[xid_event(154, -1, gpu_index=3)])
    (with_xid,) = assess(make_policy(), report, NodeView("n", gpu_capacity=1), at(0)).findings
    assert with_xid.since == at(-1) and "no XID 154" not in with_xid.detail
    released = assess(make_policy(), report, NodeView("n", gpu_capacity=1), at(0), cleared_before=at(0))
    (still,) = released.findings
    assert (still.code, still.action, still.scope) == (154, Action.DRAIN, Scope.NODE)
    cleared = make_report(devices=[gpu(3, recoveryAction="None")], xids=[xid_event(154, -1, gpu_index=3)])
    assert assess(make_policy(), cleared, NodeView("n", gpu_capacity=1), at(0), cleared_before=at(0)).findings == ()


def test_recover_imex_domain_is_the_domains_finding_where_the_node_has_a_domain() -> None:
    """With a domain label the NVLink domain's finding (evaluation/domains.py) takes the node out with its
    domain and is the fault's only finding; without one (no finding of the domain's) the GPU's own
    recovery action takes the node out, as its XID 154 would."""
    report = make_report(devices=[gpu(3, recoveryAction="RecoverImexDomain")])
    domain = Finding(Signal.IMEX_DOMAIN, Action.DRAIN, "the domain's", scope=Scope.DOMAIN)
    a = assess(make_policy(), report, NodeView("n", gpu_capacity=1), at(0), extra=(domain,))
    assert [f.signal for f in a.findings] == [Signal.IMEX_DOMAIN]
    (alone,) = assess(make_policy(), report, NodeView("n", gpu_capacity=1), at(0)).findings
    assert (alone.code, alone.action, alone.scope) == (154, Action.DRAIN, Scope.DOMAIN)
