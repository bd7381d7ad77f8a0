"""Scopes above the node (evaluation/domains.py): an NVLink domain's fault, a rack's power brake."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpuhealth.api.names import Action, Scope, Signal, State
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.status import Record
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
