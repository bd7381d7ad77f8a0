"""The issue #26 phases' pure parts: the phase selection, the drain storm's pod mix, the audit-log figures
(evictions per second, double actions), the PDB and failover summaries, and how their targets are judged
and rendered."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from devkit.audit import audit_events
from devkit.podorder import PodWrite, pod_writes
from hack.bench import docs
from hack.bench.cli import parse_args, parse_phases
from hack.bench.drain_workload import (
    DRAIN_NAMESPACE,
    double_actions,
    drain_mix,
    eviction_figures,
    min_ready,
    pod_manifest,
)
from hack.bench.failover import failover_summary
from hack.bench.report import evaluate, summary_md, tally
from hack.bench.resilience import ResilienceContext
from hack.bench.targets import resilience_targets_for

FILED = Path(docs.RESULTS) / "bench-1000-2026-11-30-8064aa5.json"
T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def _at(s: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def test_phases_run_in_their_order_and_all_means_every_one() -> None:
    assert parse_phases("drain,restart") == ["restart", "drain"]
    assert parse_phases("all") == ["core", "restart", "failover", "drain"]
    with pytest.raises(ValueError):
        parse_phases("drian")
    assert parse_args([]).phases == ["core"]  # the default run is the bench as it was


def test_a_run_of_the_new_phases_only_needs_no_room_for_the_core_faults() -> None:
    args = parse_args(["--nodes", "50", "--pods", "200", "--phases", "restart,failover,drain"])
    assert (args.drain_nodes, args.failover_samples, args.drain_pods) == (12, 5, 15)
    with pytest.raises(SystemExit):
        parse_args(["--nodes", "10", "--pods", "10", "--phases", "drain", "--drain-nodes", "10"])
    # 1,000 nodes: the issue's 100 nodes x 15 pods.
    assert parse_args(["--phases", "drain"]).drain_nodes == 100


def test_drain_mix_puts_gangs_across_node_pairs_and_alternates_the_rest() -> None:
    nodes = ["n0", "n1", "n2"]
    mix = drain_mix(nodes, 15)
    assert len(mix) == 45
    per_node = {n: [p for p in mix if p.node == n] for n in nodes}
    assert all(len(v) == 15 for v in per_node.values())
    gangs = {p.gang for p in mix if p.gang}
    assert gangs == {"gang-0000"}  # n2 has no partner
    assert {p.node for p in mix if p.gang} == {"n0", "n1"}
    assert all(p.mode == "annotation" for p in mix if p.gang)
    singles = [p for p in per_node["n2"]]
    assert sum(p.mode == "annotation" for p in singles) == 8 and sum(p.mode == "signal" for p in singles) == 7
    assert len({p.name for p in mix}) == len(mix)
    m = pod_manifest(mix[0])
    assert m["spec"]["nodeName"] == "n0" and m["metadata"]["annotations"]["gpuhealth.dev/checkpoint"] == "annotation"
    assert m["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] == "gang-0000"


def _evict(pod: str, s: float) -> PodWrite:
    return PodWrite(f"{DRAIN_NAMESPACE}/{pod}", "evict", _at(s))


def test_evictions_per_second_is_the_sustained_rate_first_to_last() -> None:
    writes = [
        PodWrite(f"{DRAIN_NAMESPACE}/a", "request", _at(0.5)),
        *[_evict(f"p{i}", 1.0 + i * 0.1) for i in range(11)],
    ]
    f = eviction_figures(writes, T0.timestamp())
    assert f["evictions"] == 11 and f["checkpoint_requests"] == 1
    assert f["evictions_per_s"] == 10.0  # 10 gaps over 1 s
    assert f["first_eviction_s"] == 1.0 and f["last_eviction_s"] == 2.0
    assert f["peak_evictions_in_a_second"] == 10
    assert eviction_figures([], 0.0)["evictions_per_s"] is None


def test_a_pod_evicted_twice_or_before_its_request_is_a_double_action() -> None:
    ok = [PodWrite(f"{DRAIN_NAMESPACE}/a", "request", _at(0)), _evict("a", 1), _evict("b", 1)]
    assert double_actions(ok, lambda p: p.endswith("/a")) == []
    twice = [*ok, _evict("b", 2)]
    assert len(double_actions(twice, lambda p: p.endswith("/a"))) == 1
    unasked = [_evict("a", 1)]
    assert "without being asked" in double_actions(unasked, lambda p: p.endswith("/a"))[0]


def test_audit_lines_become_pod_writes(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    lines = [
        {
            "stage": "ResponseComplete",
            "user": {"username": "op"},
            "verb": "create",
            "objectRef": {"resource": "pods", "subresource": "eviction", "namespace": DRAIN_NAMESPACE, "name": "a"},
            "responseStatus": {"code": 201},
            "requestReceivedTimestamp": "2026-12-01T12:00:01.000000Z",
        },
        {
            "stage": "ResponseComplete",
            "user": {"username": "op"},
            "verb": "create",
            "objectRef": {"resource": "pods", "subresource": "eviction", "namespace": DRAIN_NAMESPACE, "name": "b"},
            "responseStatus": {"code": 429},
            "requestReceivedTimestamp": "2026-12-01T12:00:01.500000Z",
        },
        {"stage": "ResponseStarted", "user": {"username": "op"}, "verb": "create"},
        {"stage": "ResponseComplete", "user": {"username": "other"}, "verb": "create"},
    ]
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    entries = list(audit_events(log, ["op"]))
    assert len(entries) == 2
    writes = pod_writes(entries, [DRAIN_NAMESPACE])
    assert [(w.pod, w.kind) for w in writes] == [(f"{DRAIN_NAMESPACE}/a", "evict")]  # the 429 evicted nothing


def test_the_quiet_restart_reads_its_window_once_requests_and_writes_alike(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"

    def line(at: float, verb: str, user: str = "op") -> dict[str, Any]:
        stamp = _at(at).isoformat().replace("+00:00", "Z")
        ref = {"resource": "nodes", "name": "n"}
        return {
            "stage": "ResponseComplete",
            "user": {"username": user},
            "verb": verb,
            "objectRef": ref,
            "responseStatus": {"code": 200},
            "requestReceivedTimestamp": stamp,
        }

    lines = [line(0.5, "list"), line(1.0, "list"), line(2.0, "patch"), line(2.5, "patch", "other"), line(4.0, "patch")]
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    ctx = cast(Any, SimpleNamespace(cluster=SimpleNamespace(audit_log=log), operator_user="op"))
    t0 = T0.timestamp()
    asked = ResilienceContext.requests_between(ctx, t0 + 1.0, t0 + 4.0)
    # [start, end): the request at the end and the other user's are outside; the first one is the list at 1.0
    assert [(e.verb, e.at - t0) for e in asked] == [("list", 1.0), ("patch", 2.0)]
    assert [e.verb for e in asked if e.write] == ["patch"]


def test_pdb_and_failover_summaries() -> None:
    assert min_ready([(0.0, 1), (1.0, 3), (2.0, 2), (3.0, 3)], after=0.5) == 2
    assert min_ready([(0.0, 1)], after=0.5) is None
    f = failover_summary([8.0, None, 12.0], timeout_s=180.0)
    assert f["samples"] == 3 and f["timeouts"] == 1 and f["p50_s"] == 12.0 and f["max_s"] == 180.0
    assert f["kill_to_taint_s"] == [8.0, None, 12.0]


def _with_resilience(nodes: int = 1000) -> dict[str, Any]:
    res: dict[str, Any] = copy.deepcopy(json.loads(FILED.read_text(encoding="utf-8")))
    res["nodes"] = nodes
    res["config"]["phases"] = ["core", "restart", "failover", "drain"]
    res["drain_storm"] = {
        "nodes": 100,
        "pods_per_node": 15,
        "pods": 1503,
        "mix": {"checkpoint": 800, "sigterm": 500, "gang_pods": 200, "gangs": 50, "pdb_pods": 3},
        "evictions": 1503,
        "checkpoint_requests": 1000,
        "evictions_per_s": 61.2,
        "peak_evictions_in_a_second": 90,
        "first_eviction_s": 0.8,
        "last_eviction_s": 25.4,
        "drains_completed": 100,
        "all_drains_completed_s": 27.0,
        "checkpoint_acks": 1000,
        "request_to_ack_ms_p50": 40.0,
        "double_actions": 0,
        "pdb": {"replicas": 3, "evictions": 3, "refused_429": 4, "min_ready_seen": 2},
    }
    res["failover"] = {"p50_s": 11.5, "max_s": 14.0, "samples": 3, "timeouts": 0, "kill_to_taint_s": [9.0, 11.5, 14.0]}
    res["warm_restart"] = {
        "startup_watching_s": 3.1,
        "startup_window_s": 18.0,
        "startup_writes": 0,
        "startup_writes_by_kind": {},
        "fault_published_after_s": 0.05,
        "restart_to_first_taint_s": 4.2,
        "startup_evaluated_s": 12.5,
    }
    res["targets"] = evaluate(res)
    return res


def test_the_new_targets_are_judged_and_rendered() -> None:
    res = _with_resilience()
    assert tally(res["targets"], res["nodes"], resilience_targets_for) == (8, 8, 0)
    md = summary_md(res)
    assert (
        "| Drain storm: evictions per second (sustained) | 61.2 /s "
        "| - | no floor measured | unmeasured | >= 50 evictions/s | pass |" in md
    )
    assert (
        "| Failover: SIGKILL of the acting replica to a new fault's taint, p50 | 11.5 s | - | - | - | <= 15 s | pass |"
        in md
    )
    assert "NVSentinel v0.4.0 published about 5/s" in md
    block = docs.render_resilience(FILED, res)
    assert "| Warm restart: operator writes during start-up | 0 | - | - | - | 0 | met |" in block
    assert "**8 of 8 targets met**" in block


def test_misses_stay_misses_and_10k_allows_a_minute_of_failover() -> None:
    res = _with_resilience()
    res["drain_storm"]["evictions_per_s"] = 5.0
    res["drain_storm"]["double_actions"] = 1
    res["drain_storm"]["pdb"]["min_ready_seen"] = 1
    res["failover"]["p50_s"] = 40.0
    res["warm_restart"]["startup_writes"] = 2
    res["warm_restart"]["startup_evaluated_s"] = None  # the operator never said its start-up was over
    t = evaluate(res)
    misses = ("drain_rate", "drain_double", "drain_pdb", "failover_p50", "restart_writes", "restart_evaluated")
    assert not any(t[k]["pass"] for k in misses)
    assert evaluate({**res, "nodes": 10000})["failover_p50"]["pass"]
    block = docs.render_resilience(FILED, {**res, "targets": t})
    assert (
        "| Drain storm: evictions per second (sustained) | 5.00 /s "
        "| - | no floor measured | unmeasured | >= 50 evictions/s | **missed** |" in block
    )


def test_a_run_without_the_phases_renders_them_as_not_measured() -> None:
    old = json.loads(FILED.read_text(encoding="utf-8"))
    fresh = {**old, "targets": evaluate(old)}
    assert tally(fresh["targets"], old["nodes"], resilience_targets_for) == (0, 0, 8)
    assert "never blind" not in summary_md(fresh)  # a core-only run's summary is as it was


def test_a_run_of_only_the_new_phases_has_a_summary() -> None:
    res = _with_resilience()
    for k in ("storm", "detect_to_taint_ms", "floor_ms", "breaker", "agent", "recovery"):
        res.pop(k)
    res["config"]["phases"] = ["restart", "failover", "drain"]
    md = summary_md(res)
    assert "phases restart, failover, drain" in md and "Drain storm: 100 nodes x 15 pods" in md


def test_a_filed_run_of_only_the_new_phases_feeds_only_the_resilience_block(tmp_path: Path) -> None:
    core = json.loads(FILED.read_text(encoding="utf-8"))
    (tmp_path / FILED.name).write_text(json.dumps(core), encoding="utf-8")
    only = _with_resilience()
    for k in ("storm", "detect_to_taint_ms", "floor_ms", "breaker", "agent", "recovery"):
        only.pop(k)
    only.update({"date": "2026-12-31T00:00Z", "commit": "abcdef0", "load": "1.0-2.0"})
    (tmp_path / "bench-1000-2026-12-31-abcdef0.json").write_text(json.dumps(only), encoding="utf-8")
    rendered = docs.blocks(tmp_path)
    readme, summary, latest, _, resilience, _, _, _, _, _, _ = [*rendered[docs.DOCS[0]], *rendered[docs.DOCS[1]]]
    assert readme == latest and f"`{core['commit']}`" in latest  # the core block keeps the core run
    assert "`abcdef0`" in resilience and "**8 of 8 targets met**" in resilience
    assert "| 1,000 | `abcdef0`, 2026-12-31" in summary and "| 8 of 8 |" in summary  # the README's row
    assert "Drain storm: 100 nodes x 15 pods" in resilience


def test_a_run_of_the_drain_storm_alone_is_rendered_on_its_own(tmp_path: Path) -> None:
    """A ``--phases drain`` run never takes the place of the newest run of the three phases (it does
    not measure failover or restart); it has a block of its own, with its CPU and stack profile."""
    three = _with_resilience()
    three.update({"date": "2026-12-30T00:00Z", "commit": "aaaaaaa", "load": "1.0-2.0"})
    alone = _with_resilience()
    for k in ("storm", "detect_to_taint_ms", "floor_ms", "breaker", "agent", "recovery", "failover", "warm_restart"):
        alone.pop(k)
    alone["config"].update({"phases": ["drain"], "stack_profile": True})
    alone["drain_storm"]["cpu"] = {"wall_s": 27.0, "cores": 2, "machine_busy": 1.0, "cpu_s": {"kube-apiserver": 26.0}}
    alone.update({"date": "2026-12-31T00:00Z", "commit": "bbbbbbb", "load": "1.0-2.0"})
    for r in (three, alone):
        (tmp_path / f"bench-1000-{r['date'][:10]}-{r['commit']}.json").write_text(json.dumps(r), encoding="utf-8")
    _, summary, _, _, resilience, drain_only, _, _, _, _, _ = [
        *docs.blocks(tmp_path)[docs.DOCS[0]],
        *docs.blocks(tmp_path)[docs.DOCS[1]],
    ]
    assert "`aaaaaaa`" in resilience and "`bbbbbbb`" not in resilience and "`bbbbbbb`" not in summary
    assert drain_only.startswith(docs.DRAIN_ALONE_BEGIN) and "commit `bbbbbbb`" in drain_only
    assert "operators stack-profiled" in drain_only and "kube-apiserver 26.0 s, the machine 100% busy" in drain_only
    assert docs.render_drain_alone([]).count("No run of the drain storm alone") == 1


def test_the_blocks_of_a_phase_alone_render_only_its_newest_run(tmp_path: Path) -> None:
    """docs/bench.md keeps the latest tables: an older run of a phase alone is read at the commit that
    filed it, not rendered beside the newest."""
    for phase, drop in (("drain", "warm_restart"), ("restart", "drain_storm")):
        for date, commit in (("2026-12-30T00:00Z", "aaaaaaa"), ("2026-12-31T00:00Z", "bbbbbbb")):
            r = _with_resilience()
            for k in ("storm", "detect_to_taint_ms", "floor_ms", "breaker", "agent", "recovery", "failover", drop):
                r.pop(k)
            r["config"].update({"phases": [phase]})
            r["targets"] = evaluate(r)
            r.update({"date": date, "commit": commit, "load": "1.0-2.0"})
            (tmp_path / f"bench-1000-{date[:10]}-{commit}-{phase}.json").write_text(json.dumps(r), encoding="utf-8")
    *_, drain_only, _, _, restart_only, _, _ = docs.blocks(tmp_path)[docs.DOCS[1]]
    for block in (drain_only, restart_only):
        assert "commit `bbbbbbb`" in block and "`aaaaaaa`" not in block


def test_nothing_filed_yet_says_so() -> None:
    block = docs.blocks(Path(docs.RESULTS))[docs.DOCS[1]][2]
    assert block.startswith(docs.RES_BEGIN)


def test_report_watch_records_when_each_drain_was_first_seen_completed() -> None:
    from kubernetes import client

    from hack.bench.watch import ReportWatch

    w = ReportWatch(client.ApiClient())

    def report(name: str, phase: str | None) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "status": {"state": "Draining", **({"drain": {"phase": phase}} if phase else {})},
        }

    w._sync([report("a", "Running"), report("b", None)])
    w._event("MODIFIED", report("a", "Completed"))
    first = w.drain_completed["a"]
    w._event("MODIFIED", report("a", "Completed"))
    assert w.drain_completed["a"] == first  # the first sighting counts
    assert w.wait_drains(["a", "b"], after=0.0, timeout=0.05) == {"a": first}  # b never finished: not there
    assert w.wait_drains(["a"], after=first + 1, timeout=0.05) == {}  # a drain before ``after`` does not count
    w._event("MODIFIED", report("a", "Running"))  # a new drain
    assert "a" not in w.drain_completed


def test_a_run_of_the_warm_restart_alone_is_rendered_on_its_own(tmp_path: Path) -> None:
    """A ``--phases restart`` run never takes the place of the newest run of the three phases; it has a
    block of its own with the two restart targets."""
    three = _with_resilience()
    three.update({"date": "2026-12-30T00:00Z", "commit": "aaaaaaa", "load": "1.0-2.0"})
    alone = _with_resilience()
    for k in ("storm", "detect_to_taint_ms", "floor_ms", "breaker", "agent", "recovery", "failover", "drain_storm"):
        alone.pop(k)
    alone["config"].update({"phases": ["restart"]})
    alone["warm_restart"]["restart_to_first_taint_s"] = 31.7
    alone["targets"] = evaluate(alone)
    alone.update({"date": "2026-12-31T00:00Z", "commit": "ccccccc", "load": "1.0-2.0"})
    for r in (three, alone):
        (tmp_path / f"bench-1000-{r['date'][:10]}-{r['commit']}.json").write_text(json.dumps(r), encoding="utf-8")
    _, summary, _, _, resilience, drain_only, _, _, restart_only, _, _ = [
        *docs.blocks(tmp_path)[docs.DOCS[0]],
        *docs.blocks(tmp_path)[docs.DOCS[1]],
    ]
    assert "`aaaaaaa`" in resilience and "`ccccccc`" not in resilience + summary + drain_only
    assert restart_only.startswith(docs.RESTART_ALONE_BEGIN) and "commit `ccccccc`" in restart_only
    assert "restart to a new fault's taint 31.7 s (<= 30 s: **missed**)" in restart_only
    assert "operator writes during start-up 0 (0: met)" in restart_only
    # The quiet restart's end, from the operator's own line (controller/process/firstpass.py).
    assert "start-up to every node evaluated 12.5 s (<= 60 s: met)" in restart_only
    assert "every node evaluated 12.5 s after it (its own line)" in restart_only
    assert "first start-up" not in restart_only  # this run did not read its start-up from the audit log
    assert docs.render_restart_alone([]).count("No run of the warm restart alone") == 1


def test_a_restart_run_that_read_its_first_start_up_renders_it(tmp_path: Path) -> None:
    alone = _with_resilience()
    for k in ("storm", "detect_to_taint_ms", "floor_ms", "breaker", "agent", "recovery", "failover", "drain_storm"):
        alone.pop(k)
    alone["config"].update({"phases": ["restart"]})
    alone["operator"].update(
        startup_s=320.7,
        startup_profile={
            "window_s": 290.8,
            "workers": 16,
            "writes": 20016,
            "nodes_written": 10002,
            "writes_by_kind": {"patch nodes/status": 10007, "patch gpunodehealths/status": 10005},
            "writes_per_s": 68.8,
            "server_ms": {"p50": 112.7, "p99": 570.5},
            "in_flight_mean": 9.63,
            "waiting_on_server_share": 0.602,
            "all_workers_in_server_share": 0.03,
            "none_in_server_share": 0.012,
        },
    )
    alone.update({"date": "2026-12-31T00:00Z", "commit": "ccccccc", "load": "1.0-2.0"})
    path = tmp_path / "bench-x-2026-12-31-ccccccc.json"
    head = "Its first start-up, on a fleet never evaluated: operator start-up to every node evaluated 320.7"
    writes = "20,016 writes on 10,002 Nodes (patch nodes/status 10,007, patch gpunodehealths/status 10,005)"
    # At 1,000 nodes the start-up has no target: the figure alone. At 10,000 it is held to 60 s.
    alone["targets"] = evaluate(alone)
    small = docs.render_restart_alone([(path, alone)])
    assert f"{head} s." in small and writes in small and "(<= 60 s: **missed**)" not in small
    alone["nodes"] = 10_000
    alone["targets"] = evaluate(alone)
    large = docs.render_restart_alone([(path, alone)])
    assert f"{head} s (<= 60 s: **missed**)." in large and writes in large


def test_report_watch_times_most_of_a_fleet_and_tallies_what_the_rest_is() -> None:
    from kubernetes import client

    from hack.bench.docs import startup_detail
    from hack.bench.watch import ReportWatch

    w = ReportWatch(client.ApiClient())
    nodes = [f"n{i}" for i in range(100)]
    w._sync([{"metadata": {"name": n}, "status": {"state": "Healthy"}} for n in nodes[:99]])
    w._event("MODIFIED", {"metadata": {"name": "n99"}, "status": {"state": "Unknown"}})
    assert w.wait_share(nodes, "Healthy", 0.99, timeout=0.05) is not None
    assert w.wait_share(nodes, "Healthy", 1.0, timeout=0.05) is None
    assert w.wait_states(nodes, "Healthy", timeout=0.05) is None
    assert w.tally([*nodes, "never"]) == {"Healthy": 99, "Unknown": 1, "none": 1}
    detail = startup_detail(
        {
            "startup_s": None,
            "startup_most_s": 412.5,
            "startup_most_share": 0.99,
            "startup_states": {"Unknown": 1, "Healthy": 99},
        }
    )
    assert detail == " (99% of the nodes after 412.5 s) (at the timeout: Healthy 99, Unknown 1)"
    assert startup_detail({"startup_s": 23.3}) == ""  # a run filed before these were recorded


def test_a_restart_run_with_the_mig_sample_names_its_phases(tmp_path: Path) -> None:
    alone = _with_resilience()
    for k in ("storm", "detect_to_taint_ms", "floor_ms", "breaker", "agent", "recovery", "failover", "drain_storm"):
        alone.pop(k)
    alone.update({"date": "2026-12-31T00:00Z", "commit": "ccccccc", "load": "1.0-2.0"})
    path = tmp_path / "bench-1000-2026-12-31-ccccccc.json"
    alone["config"].update({"phases": ["restart"]})
    assert "(the run's phases" not in docs.render_restart_alone([(path, alone)])
    alone["config"].update({"phases": ["mig", "restart"]})
    assert "alone at 1,000 nodes (the run's phases: mig, restart): commit" in docs.render_restart_alone([(path, alone)])
