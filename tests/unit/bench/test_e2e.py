"""The end-to-end figure's pure pieces: telling a fault's report write from earlier ones, matching the
fake library's emit to it and to the taint, the split into the agent's and the operator's shares, and
how runs with and without the figure are judged and rendered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hack.bench import docs
from hack.bench.cli import parse_args
from hack.bench.cluster import agent_policy_spec, policy_spec
from hack.bench.details import e2e_line
from hack.bench.e2e import Sample, emitted_at, next_agent, plan, split, summarize
from hack.bench.report import evaluate, summary_md
from hack.bench.watch import ReportWatch, XidKey, first_new_xid, xid_keys

FILED = Path(docs.RESULTS) / "bench-1000-2026-11-30-8064aa5.json"


def _report(name: str, *xids: tuple[int, int | None, str]) -> dict[str, Any]:
    events = [{"xid": x, "gpu": g, "time": t, "source": "nvml"} for x, g, t in xids]
    return {"metadata": {"name": name}, "spec": {"xidEvents": events}, "status": {"state": "Healthy"}}


def test_xid_keys_read_the_reports_events() -> None:
    obj = _report("n", (79, 3, "2026-11-30T19:00:00.1Z"), (48, None, "2026-11-30T19:00:01Z"))
    assert xid_keys(obj) == {(79, 3, "2026-11-30T19:00:00.1Z"), (48, None, "2026-11-30T19:00:01Z")}
    assert xid_keys({"metadata": {"name": "n"}, "spec": {}}) == frozenset()


def test_first_new_xid_ignores_earlier_events_and_other_gpus_and_codes() -> None:
    old: XidKey = (79, 0, "t0")
    seen: dict[XidKey, float] = {old: 1.0, (79, 1, "t1"): 5.0, (79, 2, "t2"): 4.0, (48, 1, "t3"): 3.0}
    assert first_new_xid(seen, frozenset({old}), 79, 1) == 5.0
    assert first_new_xid(seen, frozenset({old}), 79, 0) is None  # the only one on GPU 0 came before
    assert first_new_xid(seen, frozenset(), 79, 0) == 1.0
    assert first_new_xid(seen, frozenset(), 13, 1) is None


def test_report_watch_records_the_first_sighting_of_each_xid_of_tracked_nodes() -> None:
    watch = ReportWatch(client.ApiClient())  # never started: fed by hand
    watch.track_xids.add("agent-1")
    watch._sync([_report("agent-1"), _report("sim-1", (79, 3, "t"))])
    before = watch.xids_of("agent-1")
    assert before == frozenset() and "sim-1" not in watch.xid_seen  # untracked nodes cost nothing
    watch._event("MODIFIED", _report("agent-1", (79, 2, "t1")))
    first = watch.xid_seen["agent-1"][(79, 2, "t1")]
    # The operator's status write re-delivers the same spec: the sighting keeps the report write's instant.
    watch._event("MODIFIED", _report("agent-1", (79, 2, "t1")))
    assert watch.wait_new_xid("agent-1", before, 79, 2, timeout=0) == first
    assert watch.wait_new_xid("agent-1", watch.xids_of("agent-1"), 79, 2, timeout=0) is None
    assert watch.states["agent-1"] == "Healthy"


def test_emits_are_matched_by_the_injected_sequence_number() -> None:
    assert emitted_at({1: 10.0, 2: 20.0}, 2) == 20.0
    assert emitted_at({1: 10.0}, 2) is None


def test_the_split_adds_up_to_the_end_to_end_latency() -> None:
    s = split(Sample(emitted=100.0, report=100.05, taint=100.2))
    assert s.e2e_ms == pytest.approx(200.0)
    assert s.agent_ms == pytest.approx(50.0) and s.operator_ms == pytest.approx(150.0)
    assert s.agent_ms is not None and s.operator_ms is not None
    assert s.agent_ms + s.operator_ms == pytest.approx(s.e2e_ms)


def test_a_missing_instant_leaves_its_parts_unknown() -> None:
    s = split(Sample(emitted=100.0, report=100.05, taint=None))
    assert s.e2e_ms is None and s.operator_ms is None and s.agent_ms == pytest.approx(50.0)
    s = split(Sample(emitted=None, report=None, taint=100.3))
    assert s.e2e_ms is None and s.operator_ms is None and s.agent_ms is None


def test_summarize_counts_each_missing_part_as_a_timeout() -> None:
    samples = [Sample(0.0, 0.05, 0.1), Sample(1.0, 1.1, 1.3), Sample(2.0, 2.05, None), Sample(None, None, None)]
    out = summarize(samples, 10_000.0)
    assert out["faults"] == 4 and out["not_emitted"] == 1
    e2e = out["emit_to_taint_ms"]
    assert e2e["timeouts"] == 2 and e2e["samples"] == 4 and e2e["max"] == 10_000.0
    assert e2e["p50"] == pytest.approx(300.0)
    assert out["emit_to_report_ms"]["timeouts"] == 1
    assert out["report_to_taint_ms"]["timeouts"] == 2


def test_faults_go_round_robin_a_new_gpu_each_round() -> None:
    assert plan(5, 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]
    assert {g for _, g in plan(40, 1)} == set(range(8))
    assert plan(3, 0) == []


def test_agent_nodes_have_a_policy_of_their_own() -> None:
    fleet, agents = policy_spec("100%"), agent_policy_spec()
    assert agents["nodeSelector"]["matchLabels"]["bench-agent"] == "true"
    assert {"key": "bench-agent", "operator": "DoesNotExist"} in fleet["nodeSelector"]["matchExpressions"]
    assert agents["rules"] == fleet["rules"] and agents["safety"]["maxUnhealthy"] == "100%"


def test_real_agent_options() -> None:
    quick, full = parse_args(["--quick"]), parse_args([])
    assert (quick.real_agents, quick.e2e_faults) == (2, 6)
    assert (full.real_agents, full.e2e_faults) == (5, 20)
    assert parse_args(["--real-agents", "1", "--e2e-faults", "0"]).real_agents == 1
    with pytest.raises(SystemExit):
        parse_args(["--real-agents", "1"])  # agent 0 only measures its footprint: none left to fault


def test_the_e2e_targets_judge_the_end_to_end_figure() -> None:
    res: dict[str, Any] = json.loads(FILED.read_text(encoding="utf-8"))
    assert evaluate(res)["e2e_p50"]["measured"] is False
    assert "| XID to taint end to end (real agent), p50 | not measured | - | - | - | <= 200 ms | not measured |" in (
        docs.render(FILED, res)
    )
    assert e2e_line(res) == "End to end (real agents): not measured in this run."
    res["e2e"] = summarize([Sample(0.0, 0.1, 0.15)] * 9 + [Sample(0.0, 0.1, 1.5)], 10_000.0)
    res["e2e"].update({"agents": 4, "xid": 79, "not_recovered": 0})
    targets = evaluate(res)
    assert targets["e2e_p50"]["value"] == pytest.approx(150.0) and targets["e2e_p50"]["pass"] is True
    assert targets["e2e_p99"]["value"] == pytest.approx(1500.0) and targets["e2e_p99"]["pass"] is False
    res["targets"] = targets
    assert (
        "| XID to taint end to end (real agent), p99 | 1,500.0 ms | - | - | - | <= 1000 ms | **MISS** |"
        in summary_md(res)
    )
    assert "over 10 faults on 4 agents (0 timed out)" in e2e_line(res)


def test_faults_skip_agents_whose_node_did_not_come_back() -> None:
    assert next_agent(1, 4, set()) == 1
    assert next_agent(1, 4, {1}) == 2
    assert next_agent(3, 4, {3, 0}) == 1  # round the ring
    assert next_agent(2, 4, {0, 1, 2, 3}) is None  # every node stuck: the phase stops
