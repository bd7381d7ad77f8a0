"""Scopes above the node (evaluation/domains.py): an NVLink domain's fault, a rack's power brake."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

from gpuhealth.api.names import Action, Scope, Signal, State
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.status import Record, StoredStatus, evidence_entry
from gpuhealth.api.validation import NodeValidation, Outcome, Trigger, Validation
from gpuhealth.evaluation import domains
from gpuhealth.evaluation.findings import Assessment, Finding
from gpuhealth.evaluation.scope import node_findings, scope_of, xid_scope
from tests.unit.builders import make_policy

NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
KEY = "nvidia.com/gpu.clique"
CLIQUE = "7f3a0c1e-1111-2222-3333-444455556666.32766"


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def report(*devices: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"devices": [{"index": i, "uuid": f"GPU-{i}", **d} for i, d in enumerate(devices)]}}


def test_recover_imex_domain_in_any_spelling_is_the_domains_and_nothing_else_is() -> None:
    r = report({}, {"recoveryAction": "RecoverImexDomain"}, {"recoveryAction": "5"}, {"recoveryAction": "Reset"})
    assert domains.imex_faults("n1", r) == (
        domains.DomainFault("n1", 1, "GPU-1"),
        domains.DomainFault("n1", 2, "GPU-2"),
    )
    assert domains.imex_faults("n1", report({"recoveryAction": "SomethingNew"})) == ()
    assert domains.imex_faults("n1", None) == ()
    assert domains.imex_faults("n1", {"spec": {"devices": "garbage"}}) == ()


def test_the_domain_finding_is_one_for_every_member_and_none_without_a_fault() -> None:
    members = ("a", "b", "c", "d")
    assert domains.domain_finding(KEY, CLIQUE, members, []) is None
    f = domains.domain_finding(KEY, CLIQUE, members, [domains.DomainFault("c", 3, "GPU-3")], NOW)
    assert f is not None
    assert (f.signal, f.action, f.scope, f.gpu, f.since) == (Signal.IMEX_DOMAIN, Action.DRAIN, Scope.DOMAIN, None, NOW)
    assert CLIQUE in f.detail and "4 nodes" in f.detail and "GPU 3 (GPU-3) of node c" in f.detail
    # The same facts give the same finding, whichever member asks: one decision.
    again = domains.domain_finding(KEY, CLIQUE, members, [domains.DomainFault("c", 3, "GPU-3")], NOW)
    assert again == f


def test_a_domain_finding_keeps_its_scope_under_any_policy_and_takes_the_node() -> None:
    f = domains.domain_finding(KEY, CLIQUE, ("a",), [domains.DomainFault("a", 0)], NOW)
    assert f is not None
    for spec in ({}, {"devices": {"scope": "Node"}}):
        assert scope_of(f, make_policy(spec)) == Scope.DOMAIN
    assert node_findings(Assessment(findings=(f,))) == (f,)
    assert xid_scope(154, RecoveryAction.RECOVER_IMEX_DOMAIN) == Scope.DOMAIN


def test_the_domain_is_decided_once_a_member_is_out_for_it() -> None:
    out = Record(state=State.DRAINING, reason=Signal.IMEX_DOMAIN)
    assert domains.domain_decided({"b": out}, ("a", "b"))
    assert not domains.domain_decided({"b": out}, ("a", "c"))
    assert not domains.domain_decided({"b": Record(state=State.DRAINING, reason="XID79")}, ("a", "b"))
    assert not domains.domain_decided({"b": Record(state=State.DEGRADED, reason=Signal.IMEX_DOMAIN)}, ("a", "b"))
    # Its validation failed: it waits for a human and has left the domain's episode (domain_return).
    waiting = Record(state=State.AWAITING_REPAIR, reason=Signal.IMEX_DOMAIN)
    assert not domains.domain_decided({"b": waiting}, ("a", "b")) and not domains.holds_domain(waiting)
    assert domains.holds_domain(Record(state=State.RECOVERING, reason=Signal.IMEX_DOMAIN))


def braking(held_s: float) -> dict[str, Any]:
    since = (NOW - dt.timedelta(seconds=held_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return report({"clockEventReasons": 0x80 | 0x8, "clockEventsSince": since})


def test_a_rack_member_counts_as_braked_while_it_reports_the_brake() -> None:
    policy = make_policy()
    assert domains.power_braked(braking(60), policy)
    assert domains.power_braked(braking(1), policy)  # its brake began a poll after the asking node's
    slowdown = report({"clockEventReasons": 0x8, "clockEventsSince": "2026-01-01T00:00:00Z"})
    assert not domains.power_braked(slowdown, policy)
    assert not domains.power_braked(braking(600), make_policy({"rules": {"powerBrake": {"enabled": False}}}))


def test_correlation_facts_change_with_the_domains_and_the_racks_facts() -> None:
    assert domains.correlation_facts(report({})) == (False, False)
    assert domains.correlation_facts(report({"recoveryAction": "RecoverImexDomain"})) == (True, False)
    assert domains.correlation_facts(braking(1)) == (False, True)  # not yet sustained: still a change


def test_a_rack_finding_from_min_nodes_on() -> None:
    policy = make_policy()  # rack.minNodes 3, rack.action observe
    assert domains.rack_finding(policy, "rack", "r1", ["a", "b"]) is None
    f = domains.rack_finding(policy, "rack", "r1", ["c", "a", "b"], NOW)
    assert f is not None
    assert (f.signal, f.action, f.scope) == (Signal.RACK_POWER_BRAKE, Action.OBSERVE, Scope.RACK)
    assert "rack rack=r1" in f.detail and "3 nodes (a, b, c)" in f.detail and "facility" in f.detail
    two = make_policy({"rules": {"powerBrake": {"rack": {"minNodes": 2, "action": "cordon"}}}})
    f2 = domains.rack_finding(two, "rack", "r1", ["a", "b"])
    assert f2 is not None and f2.action == Action.CORDON


def test_with_rack_replaces_the_nodes_power_brake_findings_by_the_racks_one() -> None:
    brake = Finding(Signal.POWER_BRAKE, Action.CORDON, "brake", gpu=2, scope=Scope.DEVICE)
    ecc = Finding(Signal.ECC, Action.DRAIN, "ecc", gpu=5, scope=Scope.DEVICE)
    a = Assessment(findings=(brake, ecc), total_gpus=8, healthy_gpus=6)
    rack = domains.rack_finding(make_policy(), "rack", "r1", ["a", "b", "c"], NOW)
    got = domains.with_rack(a, rack)
    assert {f.signal for f in got.findings} == {Signal.ECC, Signal.RACK_POWER_BRAKE}
    assert got.healthy_gpus == 7  # GPU 2 is no longer held out for its own brake
    assert domains.with_rack(a, None) is a
    clean = Assessment(findings=(ecc,), total_gpus=8, healthy_gpus=7)
    assert domains.with_rack(clean, rack) is clean  # not braked itself: the rack's finding is not its own


def test_slow_only_when_everything_that_takes_the_node_is_slow() -> None:
    from gpuhealth.evaluation.scope import slow_only

    brake = Finding(Signal.POWER_BRAKE, Action.CORDON, "brake", gpu=1, scope=Scope.NODE)
    xid = Finding(Signal.XID, Action.DRAIN, "xid", gpu=2, code=79, scope=Scope.NODE)
    on_gpu = Finding(Signal.HW_SLOWDOWN, Action.CORDON, "slow", gpu=3, scope=Scope.DEVICE)
    assert slow_only(Assessment(findings=(brake,)))
    assert not slow_only(Assessment(findings=(brake, xid)))
    assert not slow_only(Assessment(findings=(on_gpu,)))  # held out one GPU at a time: not the node's
    assert not slow_only(Assessment())


def _report_with(*devices: dict[str, object]) -> dict[str, object]:
    return {"spec": {"devices": list(devices)}}


def test_unhealthy_fabric_routes_are_the_domains_fault() -> None:
    # ROUTE_UNHEALTHY = 1 in the GPU's fabric health mask, as the agent reports it decoded (api/fabric.py).
    sick = _report_with({"index": 2, "uuid": "GPU-2", "fabric": {"state": "Completed", "routeUnhealthy": True}})
    faults = domains.imex_faults("b", sick)
    assert faults == (domains.DomainFault("b", 2, "GPU-2", domains.ROUTE_UNHEALTHY),)
    assert domains.correlation_facts(sick) == (True, False)
    f = domains.domain_finding(KEY, CLIQUE, ("a", "b", "c", "d"), faults, NOW)
    assert f is not None and f.scope == Scope.DOMAIN
    assert "fabric routes unhealthy on GPU 2 (GPU-2) of node b" in f.detail


def test_a_fabric_mask_of_false_or_unsupported_sub_fields_is_no_fault() -> None:
    # A non-zero health mask whose sub-fields are all "false" (2) or "not supported" (0) decodes to
    # False or absent: nothing for the domain (EKS's agent learned that 0x80 is healthy).
    for fabric in (
        {"state": "Completed", "routeUnhealthy": False, "degradedBandwidth": False, "healthMask": 0xAA},
        {"state": "NotStarted"},
        {},
    ):
        report = _report_with({"index": 0, "uuid": "GPU-0", "fabric": fabric})
        assert domains.imex_faults("a", report) == ()
        assert domains.correlation_facts(report) == (False, False)


# -- Episodes: a rack's or a domain's decision lasts as long as its fault does, on every member --------


def test_a_rack_episode_keeps_its_finding_below_min_nodes_until_no_member_is_braked() -> None:
    policy = make_policy()  # rack.minNodes 3
    # The brake lifts node by node: the last braked node stays under the rack's finding, never its own.
    f = domains.rack_finding(policy, "rack", "r1", ["a"], NOW, episode=True)
    assert f is not None
    assert (f.signal, f.action, f.scope) == (Signal.RACK_POWER_BRAKE, Action.OBSERVE, Scope.RACK)
    assert "1 node (a)" in f.detail and "facility" in f.detail and "episode" in f.detail
    assert domains.rack_finding(policy, "rack", "r1", [], NOW, episode=True) is None  # no member braked: over
    assert domains.rack_finding(policy, "rack", "r1", ["a"], NOW) is None  # no episode: the node's own


def _written(*statuses: dict[str, Any] | None) -> list[StoredStatus]:
    return [StoredStatus.read(s) for s in statuses]


def test_a_rack_episode_is_on_while_a_members_written_status_carries_the_racks_finding() -> None:
    rack = evidence_entry("RackPowerBrake", "RackPowerBrake", "observe", "rack r1: ...")
    ecc = evidence_entry("ECC", "ECC", "drain", "ecc", gpu=2)
    assert domains.rack_episode(
        _written(None, {}, {"state": "Degraded", "reason": "RackPowerBrake", "evidence": [rack]})
    )
    assert domains.rack_episode(_written({"state": "Degraded", "reason": "ECC", "evidence": [ecc, rack]}))
    # The reason alone (past the 16 evidence items the status keeps), while the node is held for it.
    assert domains.rack_episode(_written({"state": "Quarantined", "reason": "RackPowerBrake", "evidence": [ecc]}))
    # Its brake lifted: back in service, or on probation with nothing left to show for the rack.
    assert not domains.rack_episode(_written({"state": "Healthy", "reason": "", "evidence": None}))
    assert not domains.rack_episode(_written({"state": "Recovering", "reason": "RackPowerBrake", "evidence": None}))
    assert not domains.rack_episode(_written({"state": "Quarantined", "reason": "PowerBrake", "evidence": ["junk"]}))
    assert not domains.rack_episode([])


PROBATION_S = 600.0


def recovering(clean_s: float, reason: str = Signal.IMEX_DOMAIN) -> Record:
    """A member on probation since ``clean_s`` seconds before NOW."""
    since = NOW - dt.timedelta(seconds=clean_s)
    return Record(state=State.RECOVERING, reason=reason, since=since, healthy_since=since, drained=True)


def status(rec: Record, **extra: Any) -> StoredStatus:
    return StoredStatus.read({**rec.to_status(), **extra})


def test_a_domain_member_returns_only_when_every_member_out_for_the_domain_can() -> None:
    me = recovering(600)
    # Every member past its probation: all return (whichever passes first).
    got = domains.domain_return("a", me, {"b": status(recovering(601)), "c": status(recovering(700))}, PROBATION_S, NOW)
    assert got == domains.DomainReturn()
    # One member's probation began a pass later: the others wait for it, and come back when it ends.
    got = domains.domain_return("a", me, {"b": status(recovering(597)), "c": status(recovering(600))}, PROBATION_S, NOW)
    assert got.waits_for == ("b",) and got.retry_at == NOW + dt.timedelta(seconds=3)
    # One member's facts went Unknown (no probation counts): wait, with no time to come back at.
    stale = Record(state=State.RECOVERING, reason=Signal.IMEX_DOMAIN, since=NOW, healthy_since=None)
    got = domains.domain_return("a", me, {"b": status(stale)}, PROBATION_S, NOW)
    assert got.waits_for == ("b",) and got.retry_at is None
    # Still quarantined for the domain (its pass after the fault cleared has not come yet).
    held = Record(state=State.QUARANTINED, reason=Signal.IMEX_DOMAIN, drained=True)
    assert domains.domain_return("a", me, {"b": status(held)}, PROBATION_S, NOW).waits_for == ("b",)


def test_a_member_whose_validation_holds_it_holds_its_domain() -> None:
    me = recovering(600)
    asked = NOW - dt.timedelta(seconds=300)
    running = NodeValidation(Trigger.RELEASE, asked, Validation(2, outcome=Outcome.RUNNING, job="v", created=True))
    passed = replace(running, validation=replace(running.validation, outcome=Outcome.PASSED, finished=NOW))
    held = status(recovering(700), nodeValidation=running.to_status())
    assert domains.domain_return("a", me, {"b": held}, PROBATION_S, NOW).waits_for == ("b",)
    done = status(recovering(700), nodeValidation=passed.to_status())
    assert domains.domain_return("a", me, {"b": done}, PROBATION_S, NOW).waits_for == ()


def test_members_out_for_another_reason_or_for_a_human_do_not_hold_the_domain() -> None:
    me = recovering(600)
    others = {
        "b": status(Record(state=State.HEALTHY)),  # already back
        "c": status(recovering(10, reason="XID79")),  # out for its own fault, not the domain's
        "d": status(Record(state=State.AWAITING_REPAIR, reason=Signal.IMEX_DOMAIN)),  # its validation failed
        # Left for the domain, now held by a fault of its own (its reason is still the domain's).
        "e": status(
            Record(state=State.QUARANTINED, reason=Signal.IMEX_DOMAIN, drained=True),
            evidence=[evidence_entry("XID", "XID79", "drain", "fell off the bus", gpu=1, code=79)],
        ),
        "f": StoredStatus.read({}),  # no status yet
    }
    assert domains.domain_return("a", me, others, PROBATION_S, NOW) == domains.DomainReturn()
    # The rule is the domain's: a node on probation for its own fault returns on its own.
    mine = recovering(600, reason="XID79")
    assert domains.domain_return("a", mine, {"b": status(recovering(1))}, PROBATION_S, NOW) == domains.DomainReturn()


def test_the_domains_finding_is_a_members_reason_over_a_fault_as_severe_of_its_own() -> None:
    # The faulting member's own XID 154 (its recovery action) is as severe as the domain's finding, and
    # earlier: the member still leaves, and returns, with its domain (its reason is what the others read).
    own = Finding(Signal.XID, Action.DRAIN, "recovery action", gpu=3, uuid="GPU-3", code=154, since=None)
    dom = domains.domain_finding(KEY, CLIQUE, ("a", "b"), [domains.DomainFault("a", 3, "GPU-3")], NOW)
    assert dom is not None
    assert Assessment(findings=(own, dom)).top == dom
    repair = Finding(Signal.XID, Action.REPAIR, "fell off the bus", gpu=1, code=79, since=NOW)
    assert Assessment(findings=(own, dom, repair)).top == repair  # a worse fault of its own is its own
