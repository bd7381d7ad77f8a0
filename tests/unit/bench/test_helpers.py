"""The bench's pure helpers: percentiles, rates, the heartbeat spread and schedule, the device fault, and
how results with and without the device and heartbeat figures are judged and rendered."""

from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hack.bench import docs
from hack.bench.cli import parse_args
from hack.bench.cluster import agent_silence, policy_spec
from hack.bench.details import heartbeat_line
from hack.bench.e2e import Sample, summarize
from hack.bench.fleet import (
    HeartbeatDriver,
    HeartbeatStats,
    ecc_snapshot,
    healthy_snapshot,
    heartbeat_workers,
    spread_offsets,
)
from hack.bench.report import evaluate, summary_md, tally
from hack.bench.support import latency_summary, percentile, rate, steady_writes_per_hour
from hack.bench.watch import RuleWatch

FILED = Path(docs.RESULTS) / "bench-1000-2026-11-30-8064aa5.json"


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([7.0], 99) == 7.0
    assert percentile(list(reversed(values)), 90) == 90.0


def test_latency_summary_counts_a_timeout_as_the_timeout() -> None:
    s = latency_summary([10.0, 20.0, 30.0], timeouts=1, timeout_ms=10_000.0)
    assert s["samples"] == 4 and s["timeouts"] == 1
    assert s["max"] == 10_000.0 and s["p99"] == 10_000.0
    assert s["p50"] == 20.0


def test_rate_between_two_marks() -> None:
    assert rate((100.0, 10), (110.0, 60)) == 5.0
    assert rate((100.0, 10), (100.0, 60)) is None


def test_heartbeat_workers_keep_up_with_the_fleets_renewal_rate() -> None:
    assert heartbeat_workers(1020, 30.0) == 8  # 34/s: the floor of eight is plenty
    assert heartbeat_workers(10020, 30.0) == 48  # 334/s at 150 ms: 51 wanted, the pool holds 48
    assert heartbeat_workers(3000, 30.0) == 15  # 100/s at 150 ms
    assert heartbeat_workers(0, 30.0) == 1


def test_spread_offsets_cover_one_interval_evenly() -> None:
    offs = spread_offsets(4, 30.0)
    assert offs == [0.0, 7.5, 15.0, 22.5]
    assert spread_offsets(0, 30.0) == []


def test_the_policy_matches_the_heartbeat() -> None:
    assert agent_silence(30.0) == "2m"
    assert agent_silence(60.0) == "4m"
    spec = policy_spec("100%", 30.0)
    assert spec["rules"]["agentSilence"] == {"after": "2m"}
    assert spec["devices"] == {"scope": "Device"}
    assert spec["safety"]["maxUnhealthyGPUs"] == "100%"


def test_quick_run_leaves_distinct_nodes_for_every_phase() -> None:
    a = parse_args(["--quick"])
    assert (a.nodes, a.device_faults, a.device_storm, a.heartbeat) == (100, 10, 20, 30.0)
    with pytest.raises(SystemExit):
        parse_args(["--nodes", "100", "--device-faults", "50"])


def test_device_fault_is_one_uncorrected_ecc_error_on_one_gpu() -> None:
    snap = ecc_snapshot(5, gpu=3)
    healthy = healthy_snapshot(5)
    assert [d.ecc.volatile_uncorrected if d.ecc else None for d in snap.devices] == [0, 0, 0, 1, 0, 0, 0, 0]
    assert [d.uuid for d in snap.devices] == [d.uuid for d in healthy.devices]


def test_heartbeat_stats_track_the_longest_gap() -> None:
    stats = HeartbeatStats()
    stats.renewed("a", 100.0)
    stats.renewed("a", 130.0)
    stats.renewed("b", 101.0)
    stats.renewed("a", 175.0)
    assert stats.renewals == 4 and stats.max_gap_s == 45.0
    stats.reset_gap()
    assert stats.max_gap_s == 0.0 and stats.mark()[1] == 4


def test_agent_writes_per_hour_leave_out_the_start_up_burst() -> None:
    # Report created, Lease patched (404) and created, then a renewal every 30 s.
    writes = [0.0, 0.03, 0.06, 30.0, 60.0, 90.0, 120.0]
    assert steady_writes_per_hour(writes) == (120.0, 3)
    assert steady_writes_per_hour([0.0, 0.03]) == (None, 2)
    assert steady_writes_per_hour([]) == (None, 0)


class _Node:
    def __init__(self, stats: HeartbeatStats, fail: bool = False) -> None:
        self.stats = stats
        self.fail = fail
        self.passes: list[float] = []
        self.lock = threading.Lock()

    def heartbeat(self) -> str | None:
        with self.lock:
            self.passes.append(time.monotonic())
        if self.fail:
            raise RuntimeError("API down")
        return "lease"

    def next_due(self, interval_s: float) -> float:
        with self.lock:
            return self.passes[-1] + interval_s


def test_heartbeat_driver_passes_every_node_once_per_interval() -> None:
    stats = HeartbeatStats()
    nodes = [_Node(stats) for _ in range(4)] + [_Node(stats, fail=True)]
    driver = HeartbeatDriver(nodes, interval_s=0.2, workers=2).start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(len(n.passes) < 3 for n in nodes):
        time.sleep(0.02)
    driver.close()
    for n in nodes:
        assert len(n.passes) >= 3
        gaps = [b - a for a, b in zip(n.passes, n.passes[1:], strict=False)]
        assert min(gaps) >= 0.2  # never sooner than one interval after the last pass
    assert stats.failures >= 3  # the failing node is counted, and keeps its schedule


def _with_new_figures() -> dict[str, Any]:
    res: dict[str, Any] = copy.deepcopy(json.loads(FILED.read_text(encoding="utf-8")))
    res["device_to_rule_ms"] = latency_summary([50.0, 60.0, 900.0], 0, 10_000.0)
    res["device_storm"] = {
        "gpus": 20,
        "rules": 20,
        "seconds": 0.8,
        "rules_per_s": 25.0,
        "publish_s": 0.3,
        "first_rule_s": 0.1,
        "publish_failures": 0,
        "report_to_rule_ms_p50": 400.0,
        "report_to_rule_ms_max": 700.0,
        "nodes_tainted": 0,
    }
    res["heartbeats"] = {
        "interval_s": 30.0,
        "agents": 1020,
        "asked_per_s": 34.0,
        "achieved_per_s": 33.9,
        "renewals": 5000,
        "window_s": 147.5,
        "failures": 0,
        "max_gap_s": 31.2,
        "agent_silence": "2m",
    }
    res["e2e"] = summarize([Sample(100.0, 100.08, 100.15), Sample(200.0, 200.1, 200.3)], 10_000.0)
    res["e2e"].update({"agents": 4, "xid": 79, "not_recovered": 0})
    res["targets"] = evaluate(res)
    return res


def test_an_older_run_renders_the_new_figures_as_not_measured() -> None:
    old = json.loads(FILED.read_text(encoding="utf-8"))
    assert "device_to_rule_ms" not in old and "device_p50" not in old["targets"]
    block = docs.render(FILED, old)
    assert (
        "| Device fault to DeviceTaintRule, p50 | not measured "
        "| - | no floor measured | unmeasured | <= 200 ms | not measured |" in block
    )
    assert "**10 of 10 targets met**, 7 not measured in this run" in block
    assert "Heartbeat traffic: not measured in this run." in block
    assert "Devices (DRA): not measured in this run." in block
    # Evaluating an old result afresh: the new targets are not measured, not missed.
    fresh = evaluate(old)
    assert tally(fresh, old["nodes"]) == (10, 10, 7)


def test_a_run_with_the_new_figures_renders_them() -> None:
    res = _with_new_figures()
    assert tally(res["targets"], res["nodes"]) == (15, 15, 2)  # the traffic targets: not measured here
    block = docs.render(FILED, res)
    assert (
        "| Device fault to DeviceTaintRule, p99 | 900.0 ms | - | no floor measured | unmeasured | <= 1000 ms | met |"
        in block
    )
    assert (
        "| Device storm (GPUs on distinct nodes at once) | 25.0 rules/s "
        "| - | no floor measured | unmeasured | >= 20 rules/s | met |" in block
    )
    assert "**15 of 15 targets met**, 2 not measured in this run (" in block
    assert "33.9 renewals/s achieved of 34.0 asked" in heartbeat_line(res)
    assert "Devices (DRA): fault to DeviceTaintRule p50 60.0 ms" in summary_md(res)


def test_a_slow_device_storm_is_a_miss() -> None:
    res = _with_new_figures()
    res["device_storm"]["rules_per_s"] = 5.0
    res["device_to_rule_ms"]["timeouts"] = 1
    targets = evaluate(res)
    assert targets["device_storm_rate"]["pass"] is False and targets["device_p99"]["pass"] is False
    assert (
        "| Device storm (GPUs on distinct nodes at once) | 5.00 rules/s "
        "| - | no floor measured | unmeasured | >= 20 rules/s | **missed** |"
        in (docs.render(FILED, {**res, "targets": targets}))
    )


def _rule(name: str, pool: str, device: str) -> dict[str, Any]:
    selector = {"driver": "gpu.nvidia.com", "pool": pool, "device": device}
    return {"metadata": {"name": name}, "spec": {"deviceSelector": selector}}


def test_rule_watch_records_when_each_device_first_had_a_rule() -> None:
    watch = RuleWatch(client.ApiClient())  # never started: its bookkeeping is fed by hand
    watch._sync([_rule("r1", "node-1", "gpu-3")])
    first = watch.seen_at[("node-1", "gpu-3")]
    watch._event("ADDED", _rule("r2", "node-2", "gpu-3"))
    watch._event("MODIFIED", _rule("r1", "node-1", "gpu-3"))
    assert watch.seen_at[("node-1", "gpu-3")] == first  # an update does not move the first sighting
    assert watch.count() == 2
    assert watch.wait_rule("node-2", "gpu-3", timeout=0) is not None
    assert watch.wait_rule("node-3", "gpu-3", timeout=0) is None
    watch._event("DELETED", _rule("r1", "node-1", "gpu-3"))
    assert watch.wait_all([("node-1", "gpu-3")], timeout=0, present=False)
    assert not watch.wait_all([("node-1", "gpu-3"), ("node-2", "gpu-3")], timeout=0)
    watch._sync([])  # a relist without them: both gone
    assert watch.count() == 0 and watch.seen_at == {}


def test_the_emulated_kubelets_lease_reaches_kwok_and_the_node_controller_waits_longer() -> None:
    from hack.bench.cluster import kubelet_lease_args

    assert kubelet_lease_args("kwok", 600) == ["--node-lease-duration-seconds=600"]
    assert kubelet_lease_args("kube-controller-manager", 600) == ["--node-monitor-grace-period=900s"]
    assert kubelet_lease_args("kube-controller-manager", 20) == ["--node-monitor-grace-period=60s"]
    assert kubelet_lease_args("kube-apiserver", 600) == []


def test_the_10k_profile_lengthens_the_emulated_kubelets_lease_unless_given() -> None:
    from hack.bench.cli import parse_args

    assert parse_args(["--profile", "10k"]).kubelet_lease == 600
    assert parse_args(["--profile", "10k", "--kubelet-lease", "40"]).kubelet_lease == 40
    assert parse_args([]).kubelet_lease == 40


def test_the_10k_profile_slows_the_simulated_agents_heartbeats_and_the_silence_follows() -> None:
    from hack.bench.cli import parse_args
    from hack.bench.cluster import agent_silence

    ten_k = parse_args(["--profile", "10k"])
    assert ten_k.heartbeat == 60.0 and agent_silence(ten_k.heartbeat) == "4m"
    assert parse_args(["--profile", "10k", "--heartbeat", "30"]).heartbeat == 30.0
    assert parse_args([]).heartbeat == 30.0 and agent_silence(30.0) == "2m"
