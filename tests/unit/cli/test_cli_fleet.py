"""Fleet summary for `kubectl gpuhealth status`: rows, order, totals, GPU-hours and cost held out of service."""

from __future__ import annotations

import json

import pytest

from gpuhealth.api.nodes import node_gpus
from gpuhealth.cli.fleet import (
    NO_VERDICT,
    Price,
    filter_rows,
    gpu_hours,
    price_of,
    summarize,
)
from tests.unit.cli.objects import NOW, ago, node, policy, report


def test_gpu_hours_is_gpus_times_hours_and_never_negative() -> None:
    assert gpu_hours(8, NOW.replace(hour=10), NOW) == pytest.approx(16.0)
    assert gpu_hours(4, NOW.replace(hour=11, minute=30), NOW) == pytest.approx(2.0)
    assert gpu_hours(8, NOW.replace(hour=13), NOW) == 0.0  # clock skew: a future since costs nothing
    assert gpu_hours(8, None, NOW) == 0.0
    assert gpu_hours(0, NOW.replace(hour=10), NOW) == 0.0


def test_price_of_reads_spec_cost() -> None:
    assert price_of(policy(cost={"gpuHourly": 2.5})) == Price(2.5, "USD")
    assert price_of(policy(cost={"gpuHourly": 3, "currency": "EUR"})) == Price(3.0, "EUR")
    assert price_of(policy(cost={"currency": "EUR"})) is None
    assert price_of(policy()) is None
    assert price_of(None) is None


def test_node_gpus_prefers_the_count_label_then_capacity() -> None:
    assert node_gpus(node("a", gpus=4)) == 4
    n = node("b")
    del n["metadata"]["labels"]["nvidia.com/gpu.count"]
    n["status"]["capacity"]["nvidia.com/gpu"] = "2"
    assert node_gpus(n) == 2
    assert node_gpus(None) is None


def test_cost_of_lost_capacity_by_state_and_priced_in_the_policy_currency() -> None:
    nodes = [node(n) for n in ("a", "b", "c", "d", "e")]
    reports = [
        report("a", "Draining", since_s=2 * 3600, reason="XID79", healthyGPUs=7),
        report("b", "AwaitingRepair", since_s=1800, reason="Flapping"),
        report("c", "Healthy", since_s=99999),
        report("d", "Unknown", since_s=3600, reason="AgentSilent"),
        report("e", "Recovering", since_s=900, reason="Released", totalGPUs=4, healthyGPUs=4),
    ]
    fleet = summarize(nodes, reports, [policy(cost={"gpuHourly": 2.5})], NOW)
    rows = {r.node: r for r in fleet.rows}
    assert rows["a"].gpu_hours == pytest.approx(16.0) and rows["a"].cost == pytest.approx(40.0)
    assert rows["b"].gpu_hours == pytest.approx(4.0)
    assert rows["e"].gpu_hours == pytest.approx(1.0)
    assert rows["c"].gpu_hours is None and rows["c"].cost is None
    t = fleet.totals
    assert t.out_nodes == 3 and t.out_gpus == 20
    assert t.out_gpu_hours_by_state == pytest.approx({"AwaitingRepair": 4.0, "Draining": 16.0, "Recovering": 1.0})
    assert list(t.out_gpu_hours_by_state) == ["AwaitingRepair", "Draining", "Recovering"]
    assert t.out_gpu_hours == pytest.approx(21.0)
    assert t.out_cost == pytest.approx({"USD": 52.5})
    # Unknown is counted apart: nobody can see those GPUs, but gpuhealth does not hold them.
    assert t.unknown_nodes == 1 and t.unknown_gpu_hours == pytest.approx(8.0) and t.unknown_cost == {"USD": 20.0}
    assert t.by_state == {"AwaitingRepair": 1, "Draining": 1, "Unknown": 1, "Recovering": 1, "Healthy": 1}
    assert t.gpus_total == 36 and t.gpus_healthy == 35


def test_each_node_is_priced_by_its_own_policy_and_unpriced_ones_are_counted() -> None:
    nodes = [node("a"), node("b"), node("c")]
    reports = [
        report("a", "Quarantined", since_s=3600, policy="train"),
        report("b", "Quarantined", since_s=3600, policy="infer"),
        report("c", "Quarantined", since_s=3600, policy="free"),
    ]
    policies = [
        policy("train", cost={"gpuHourly": 2}),
        policy("infer", cost={"gpuHourly": 1, "currency": "EUR"}),
        policy("free"),
    ]
    t = summarize(nodes, reports, policies, NOW).totals
    assert t.out_cost == pytest.approx({"USD": 16.0, "EUR": 8.0})
    assert t.unpriced_nodes == 1 and t.out_gpu_hours == pytest.approx(24.0)


def test_dry_run_verdicts_hold_nothing_out_of_service() -> None:
    fleet = summarize(
        [node("a")], [report("a", "Draining", since_s=3600, dryRun=True)], [policy(cost={"gpuHourly": 9})], NOW
    )
    (row,) = fleet.rows
    assert row.dry_run and not row.out_of_service and row.gpu_hours is None and row.cost is None
    assert fleet.totals.out_nodes == 0 and fleet.totals.out_cost == {} and fleet.totals.dry_run_nodes == 1


def test_rows_are_most_urgent_first_then_by_name() -> None:
    nodes = [node(n) for n in ("n1", "n2", "n3", "n4", "n5", "n6")]
    reports = [
        report("n1", "Healthy"),
        report("n2", "Degraded"),
        report("n3", "AwaitingRepair"),
        report("n4", "Unknown"),
        report("n6", "Draining"),
    ]
    fleet = summarize(nodes, reports, [policy()], NOW)
    assert [r.node for r in fleet.rows] == ["n3", "n6", "n4", "n2", "n5", "n1"]


def test_nodes_without_a_verdict_say_why() -> None:
    nodes = [
        node("watched", labels={"pool": "a"}),
        node("unwatched", labels={"pool": "z"}),
        node("paused", labels={"pool": "p"}),
    ]
    policies = [
        policy("a", selector={"matchLabels": {"pool": "a"}}),
        policy("p", mode="Paused", selector={"matchLabels": {"pool": "p"}}),
    ]
    fleet = summarize(nodes, [], policies, NOW)
    rows = {r.node: r for r in fleet.rows}
    assert rows["watched"].state == "" and rows["watched"].reason == "NoReport" and rows["watched"].policy == "a"
    assert rows["unwatched"].reason == "NoPolicy" and rows["unwatched"].policy == ""
    assert rows["paused"].reason == "Paused" and rows["paused"].policy_mode == "Paused"
    assert fleet.totals.by_state == {NO_VERDICT: 3}
    assert rows["watched"].total_gpus == 8  # from the Node, before any report


def test_an_invalid_policy_governs_nothing() -> None:
    bad = policy("bad", safety={"probation": "1h", "flapping": {"window": "30m"}})
    fleet = summarize([node("a")], [], [bad], NOW)
    assert fleet.rows[0].reason == "NoPolicy"


def test_orphan_reports_are_listed_unless_a_selector_narrowed_the_nodes() -> None:
    reports = [report("gone", "Quarantined", since_s=60), report("a", "Healthy")]
    fleet = summarize([node("a")], reports, [policy()], NOW)
    gone = next(r for r in fleet.rows if r.node == "gone")
    assert not gone.node_exists and gone.out_of_service
    assert [r.node for r in summarize([node("a")], reports, [policy()], NOW, include_orphans=False).rows] == ["a"]


def test_node_marks_are_read_from_the_node() -> None:
    fleet = summarize([node("a", taint="XID79", cordoned=True)], [report("a", "Draining")], [policy()], NOW)
    row = fleet.rows[0]
    assert row.taint == "XID79" and row.cordoned


def test_filter_by_state_and_policy_recomputes_totals() -> None:
    nodes = [node(n) for n in ("a", "b", "c")]
    reports = [
        report("a", "Draining", since_s=3600, policy="x"),
        report("b", "Healthy", policy="x"),
        report("c", "Draining", since_s=3600, policy="y"),
    ]
    fleet = summarize(nodes, reports, [policy("x"), policy("y")], NOW)
    only = filter_rows(fleet, ["draining"], "x")
    assert [r.node for r in only.rows] == ["a"] and only.totals.out_gpu_hours == pytest.approx(8.0)
    assert [r.node for r in filter_rows(fleet, ["Healthy", "Draining"]).rows] == ["a", "c", "b"]


def test_json_is_complete_and_serializable() -> None:
    fleet = summarize(
        [node("a", taint="XID79", cordoned=True)],
        [report("a", "Draining", since_s=7200, reason="XID79", lastXid="79 (GPU 3)", healthyGPUs=7)],
        [policy(cost={"gpuHourly": 2.5})],
        NOW,
    )
    data = json.loads(json.dumps(fleet.to_json()))
    assert data["generatedAt"] == "2025-06-01T12:00:00Z"
    (row,) = data["nodes"]
    assert row["node"] == "a" and row["state"] == "Draining" and row["reason"] == "XID79"
    assert row["gpus"] == {"healthy": 7, "total": 8} and row["since"] == ago(7200) and row["ageSeconds"] == 7200
    assert row["outOfService"] and row["gpuHours"] == 16.0 and row["cost"] == 40.0 and row["currency"] == "USD"
    assert row["taint"] == "XID79" and row["cordoned"] and row["lastXid"] == "79 (GPU 3)"
    out = data["totals"]["outOfService"]
    assert out == {
        "nodes": 1,
        "gpus": 8,
        "gpuHours": 16.0,
        "gpuHoursByState": {"Draining": 16.0},
        "cost": {"USD": 40.0},
        "unpricedNodes": 0,
        "slowGpus": 0,
        "brokenGpus": 8,
    }
    assert data["totals"]["byState"] == {"Draining": 1}
