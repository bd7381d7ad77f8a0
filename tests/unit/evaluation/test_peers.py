"""P2P-aware repair (evaluation/peers.py, the group in evaluation/devices.py, the ladder's first step):
a GPU whose recovery action needs its NVLink peers idle holds them out with it, as one decision, and
they return at once when its reset no longer needs them. Peers unknown: today's NodeReboot."""

from __future__ import annotations

from typing import Any

from gpuhealth.api.devices import DeviceRecord, DeviceState
from gpuhealth.api.names import Action, Scope, Signal
from gpuhealth.api.remediation import RemediationSettings, StepKind
from gpuhealth.api.remediation_status import LadderRecord, Phase
from gpuhealth.api.report import Report
from gpuhealth.evaluation.assess import NodeView, assess
from gpuhealth.evaluation.devices import DeviceInputs, DeviceVerdict, decide_devices
from gpuhealth.evaluation.findings import Assessment
from gpuhealth.evaluation.ladder import GPU, Observed, advance, steps_for
from gpuhealth.evaluation.peers import PEER, REREAD_TIMEOUT_S, awaiting_reread, groups, peers_of, with_peers
from tests.unit.builders import at, gpu, make_policy, make_report, xid_event

UUIDS = {i: f"GPU-{i:04d}" for i in range(8)}
POLICY = make_policy({"safety": {"probation": "10m"}, "remediation": {"enabled": True}})
ALL = tuple(range(8))


def nvswitch_report(action: str = "DrainAndReset", peers: bool = True, faulted: int = 3) -> Report:
    """An 8-GPU NVSwitch node (every GPU reaches every other over NVLink); GPU ``faulted`` asks for ``action``."""

    def entry(i: int) -> dict[str, Any]:
        nvlink: dict[str, Any] = {"links": 18, "active": 18}
        if peers:
            nvlink["peers"] = [p for p in ALL if p != i]
        extra = {"recoveryAction": action} if i == faulted else {}
        return gpu(i, nvlink=nvlink, **extra)

    return make_report(devices=[entry(i) for i in ALL], xids=[xid_event(154, -1, gpu_index=faulted)])


def assessed(report: Report) -> Assessment:
    return assess(POLICY, report, NodeView("n", gpu_capacity=8), at(0))


def decide(
    report: Report,
    prior: dict[int, DeviceRecord],
    now: float,
    budget: int = 100,
    ladders: dict[int, LadderRecord] | None = None,
    **kw: Any,
) -> DeviceVerdict:
    a = assessed(report)
    gs = groups(report, a.findings, ladders or {}, prior)
    a = with_peers(a, report, gs)
    inputs = DeviceInputs(uuids=UUIDS, gpu_budget=budget, groups=tuple(g.members for g in gs), **kw)
    return decide_devices(prior, a.findings, POLICY, at(now), inputs)


def states(v: DeviceVerdict) -> dict[int, DeviceState]:
    return {r.index: r.state for r in v.records}


def test_peers_are_read_from_the_report_without_the_gpu_itself() -> None:
    report = nvswitch_report()
    assert peers_of(report.device(3)) == (0, 1, 2, 4, 5, 6, 7)
    assert peers_of(nvswitch_report(peers=False).device(3)) is None


def test_drain_and_reset_with_peers_known_holds_the_gpu_and_every_peer_out_as_one() -> None:
    v = decide(nvswitch_report(), {}, 0)
    assert set(v.new_quarantines) == set(ALL)
    assert all(s == DeviceState.DRAINING for s in states(v).values())
    assert v.record(3).reason == "XID154"  # type: ignore[union-attr]
    assert {r.reason for r in v.records if r.index != 3} == {str(Signal.NVLINK_PEER)}
    # The peers are not bad GPUs: eight out does not take the node out (maxBadGPUsPerNode 1).
    assert not v.escalate
    peer = v.record(0)
    assert peer is not None and peer.quarantines == () and "NVLink peer of GPU 3" in peer.message


def test_the_group_is_one_breaker_decision_never_a_partial_group() -> None:
    short = decide(nvswitch_report(), {}, 0, budget=7)
    assert all(s == DeviceState.IN_SERVICE for s in states(short).values())
    assert all(r.held_by_breaker for r in short.records)
    whole = decide(nvswitch_report(), {}, 0, budget=8)
    assert all(s == DeviceState.DRAINING for s in states(whole).values())


def test_peers_unknown_hold_the_gpu_alone_and_its_ladder_starts_at_node_reboot() -> None:
    report = nvswitch_report(peers=False)
    v = decide(report, {}, 0)
    assert [r.index for r in v.records if r.out_of_service] == [3]
    facts = report.device(3)
    assert facts is not None
    unknown = steps_for(RemediationSettings(enabled=True), "XID154", facts.recovery_action)
    assert [s.kind for s in unknown] == [StepKind.NODE_REBOOT, StepKind.REPLACE]
    known = steps_for(RemediationSettings(enabled=True), "XID154", facts.recovery_action, peers_known=True)
    assert [s.kind for s in known] == [StepKind.GPU_RESET, StepKind.NODE_REBOOT, StepKind.REPLACE]


def test_a_plain_reset_holds_no_peer() -> None:
    report = nvswitch_report(action="Reset")
    a = assessed(report)
    assert groups(report, a.findings, {}, {}) == ()


def _held(prior: DeviceVerdict) -> dict[int, DeviceRecord]:
    return {r.index: r for r in prior.records}


def test_peers_stay_held_while_the_reset_runs_and_return_at_once_after_it() -> None:
    first = decide(nvswitch_report(), {}, 0)
    drained = decide(nvswitch_report(), _held(first), 10, drained=frozenset(ALL))
    assert all(s == DeviceState.QUARANTINED for s in states(drained).values())
    prior = _held(drained)
    # The reset Job runs; the agent's facts now show no recovery action, but the Job is in flight.
    running = LadderRecord(3, StepKind.GPU_RESET, phase=Phase.RUNNING, reason="XID154", job="ns/reset-3")
    clean = nvswitch_report(action="None")
    during = decide(clean, prior, 20, ladders={3: running})
    assert all(during.record(p).out_of_service for p in ALL if p != 3)  # type: ignore[union-attr]
    # The Job is done (Verifying): the peers no longer need holding and come back without probation.
    done = decide(clean, prior, 30, ladders={3: LadderRecord(3, StepKind.GPU_RESET, phase=Phase.VERIFYING)})
    back = {r.index for r in done.records if r.state == DeviceState.IN_SERVICE}
    assert back == set(ALL) - {3}
    assert set(done.lifted) == back
    assert {e.reason for e in done.events if e.index != 3} == {"PeerReturned"}
    # The GPU itself goes through probation as after any reset.
    assert done.record(3).state == DeviceState.RECOVERING  # type: ignore[union-attr]


def test_a_peer_with_a_fault_of_its_own_keeps_it() -> None:
    first = decide(nvswitch_report(), {}, 0)
    prior = {r.index: r for r in first.records}
    clean = nvswitch_report(action="None")
    report = make_report(
        devices=_raw_devices(clean),
        xids=[xid_event(154, -1, gpu_index=3), xid_event(48, 5, gpu_index=5)],
    )
    v = decide(report, prior, 30, ladders={3: LadderRecord(3, StepKind.GPU_RESET, phase=Phase.VERIFYING)})
    assert v.record(5).out_of_service and v.record(5).reason == "XID48"  # type: ignore[union-attr]
    assert not v.record(4).out_of_service  # type: ignore[union-attr]


def _raw_devices(report: Report) -> list[dict[str, Any]]:
    out = []
    for d in report.devices:
        nvlink = {"links": 18, "active": 18, "peers": list(d.nvlink.peers or ())} if d.nvlink else None
        out.append(gpu(d.index, nvlink=nvlink))
    return out


def test_a_restarted_operator_rebuilds_the_same_group_from_the_report_and_status() -> None:
    """Everything the group is made of is the agent's report and the written status: a second pass
    over the same inputs (an operator killed and restarted in between) decides the same records and
    announces no new quarantine."""
    first = decide(nvswitch_report(), {}, 0)
    prior = {r.index: r for r in first.records}
    again = decide(nvswitch_report(), prior, 1)
    assert again.new_quarantines == ()
    assert states(again) == states(first)
    assert {r.index: r.reason for r in again.records} == {r.index: r.reason for r in first.records}


def test_the_reset_starts_only_once_the_ladder_is_told_it_may() -> None:
    """The ladder's first move for the faulted GPU is ONE GPUReset (the remediator's ``may_start``
    holds it back until every peer is drained: tests/integration/test_p2p_reset.py)."""
    report = nvswitch_report()
    facts = report.device(3)
    assert facts is not None
    steps = steps_for(RemediationSettings(enabled=True), "XID154", facts.recovery_action, peers_known=True)
    held = GPU(3, "GPU-0003", DeviceState.QUARANTINED, "XID154", at(0), True, "rule-3", False)
    assert advance(None, held, steps, Observed(may_start=False), at(1)).record is None
    move = advance(None, held, steps, Observed(may_start=True), at(1))
    assert move.start == StepKind.GPU_RESET and move.record is not None and move.record.phase == Phase.PENDING


def test_peer_findings_are_device_scoped_drains() -> None:
    report = nvswitch_report()
    a = assessed(report)
    added = with_peers(a, report, groups(report, a.findings, {}, {}))
    peers = [f for f in added.findings if f.signal == PEER]
    assert sorted(f.gpu for f in peers if f.gpu is not None) == [0, 1, 2, 4, 5, 6, 7]
    assert all(f.scope == Scope.DEVICE and f.action == Action.DRAIN for f in peers)


def test_drain_p2p_is_the_gpus_only_with_its_peers_known_and_remediation_on() -> None:
    def scope(report: Report, policy: Any = POLICY) -> Scope:
        a = assess(policy, report, NodeView("n", gpu_capacity=8), at(0))
        (f,) = [f for f in a.findings if f.code == 154]
        return f.scope

    assert scope(nvswitch_report("DrainP2P")) == Scope.DEVICE
    assert scope(nvswitch_report("DrainP2P", peers=False)) == Scope.NODE
    assert scope(nvswitch_report("DrainP2P"), make_policy({})) == Scope.NODE
    v = decide(nvswitch_report("DrainP2P"), {}, 0)
    assert {r.index for r in v.records if r.out_of_service} == set(ALL)


def test_the_reread_is_waited_for_from_the_end_of_the_drain_up_to_the_timeout() -> None:
    draining = DeviceRecord(3, state=DeviceState.DRAINING, since=at(0))
    assert awaiting_reread(draining, at(10_000)) == REREAD_TIMEOUT_S, "the clock starts once it is drained"
    drained = DeviceRecord(3, state=DeviceState.QUARANTINED, since=at(0), drained=True)
    assert awaiting_reread(drained, at(100)) == REREAD_TIMEOUT_S - 100
    assert awaiting_reread(drained, at(REREAD_TIMEOUT_S + 1)) is None


def test_peers_are_let_go_once_the_gpu_waits_for_a_human() -> None:
    first = decide(nvswitch_report(), {}, 0)
    prior = {r.index: r for r in first.records}
    prior[3] = DeviceRecord(3, uuid="GPU-0003", state=DeviceState.AWAITING_REPAIR, reason="XID154", since=at(5))
    v = decide(
        nvswitch_report(), prior, 30, ladders={3: LadderRecord(3, StepKind.REPLACE, phase=Phase.AWAITING_REPAIR)}
    )
    assert {r.index for r in v.records if r.out_of_service} == {3}
