"""The rest of the fleet during a drain storm (hack/bench/drain_fleet.py): writes to nodes not drained,
and how the verdicts moved, rendered into the drain line."""

from __future__ import annotations

import time
from typing import Any

from hack.bench.details import storm_elsewhere
from hack.bench.drain_fleet import VerdictSampler, verdict_swings, writes_elsewhere


def event(verb: str, resource: str, name: str, at: str, sub: str = "") -> dict[str, Any]:
    ref = {"resource": resource, "name": name, **({"subresource": sub} if sub else {})}
    return {"verb": verb, "objectRef": ref, "requestReceivedTimestamp": at}


T0 = 1_764_849_600.0  # 2025-12-04T12:00:00Z


def test_writes_elsewhere_counts_fleet_writes_after_the_faults_off_the_drained_nodes() -> None:
    entries = [
        event("patch", "nodes", "n1", "2025-12-04T12:00:01Z"),
        event("patch", "nodes", "n1", "2025-12-04T12:00:02Z", sub="status"),
        event("patch", "gpunodehealths", "n2", "2025-12-04T12:00:03Z", sub="status"),
        event("patch", "nodes", "d1", "2025-12-04T12:00:03Z"),  # a drained node
        event("patch", "nodes", "n3", "2025-12-04T11:59:59Z"),  # before the faults
        event("get", "nodes", "n4", "2025-12-04T12:00:05Z"),  # not a write
        event("create", "pods", "p", "2025-12-04T12:00:05Z", sub="eviction"),  # the drain's own
    ]
    assert writes_elsewhere(entries, ["d1"], T0) == {
        "writes": 3,
        "nodes": 2,
        "by": {"patch gpunodehealths/status": 1, "patch nodes": 1, "patch nodes/status": 1},
    }


def test_verdict_swings_say_where_each_state_began_peaked_and_fell() -> None:
    samples = [
        (T0, {"Healthy": 100, "Quarantined": 0}),
        (T0 + 2, {"Healthy": 60, "Unknown": 40, "Quarantined": 0}),
        (T0 + 4, {"Healthy": 95, "Unknown": 5, "Quarantined": 0}),
    ]
    v = verdict_swings(samples, T0)
    assert v["at_start"] == {"Healthy": 100, "Quarantined": 0}
    assert v["peak"] == {"Healthy": 100, "Quarantined": 0, "Unknown": 40}
    assert v["low"] == {"Healthy": 60, "Quarantined": 0, "Unknown": 0}
    assert v["peak_at_s"]["Unknown"] == 2.0
    assert verdict_swings([], T0) == {}
    line = storm_elsewhere({"elsewhere": writes_elsewhere([], [], T0), "verdicts": v})
    assert "0 operator writes on 0 nodes not drained;" in line
    assert "Healthy 100 -> peak 100 at 0.0 s" in line and "Unknown 0 -> peak 40 at 2.0 s" in line
    assert "Quarantined" not in line  # it did not move
    assert storm_elsewhere({}) == ""  # a run before these figures


def test_the_sampler_counts_until_stopped() -> None:
    calls: list[int] = []

    def tally() -> dict[str, int]:
        calls.append(1)
        return {"Healthy": len(calls)}

    sampler = VerdictSampler(tally, every_s=0.01).start()
    while len(calls) < 3:
        time.sleep(0.01)
    samples = sampler.stop()
    assert len(samples) >= 3 and samples[0][1] == {"Healthy": 1}
    n = len(calls)
    time.sleep(0.05)
    assert len(calls) == n  # stopped
