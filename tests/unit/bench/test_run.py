"""The driver's pure parts: which nodes each core phase faults, the phase clock's lines and list, and
the teardown's order (what a run started is stopped however far it got)."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest

from hack.bench import support
from hack.bench.cluster import BenchCluster
from hack.bench.context import Started
from hack.bench.detection import fault_nodes


def test_the_core_phases_fault_distinct_nodes_in_turn() -> None:
    governed = [f"n{i}" for i in range(10)]
    nodes = fault_nodes(governed, faults=3, storm=2)
    assert nodes.detect == ["n0", "n1", "n2"]
    assert nodes.storm == ["n3", "n4"]
    assert nodes.breaker == ["n5", "n6"]
    # A fleet too small for a breaker of its own wraps round to the first nodes.
    assert fault_nodes(governed[:6], faults=3, storm=2).breaker == ["n5", "n0"]


def test_the_phase_clock_logs_each_phase_and_how_long_the_last_took(monkeypatch: pytest.MonkeyPatch) -> None:
    now = iter([100.0, 100.0, 142.0, 845.0])
    lines: list[str] = []
    monkeypatch.setattr(time, "time", lambda: next(now))
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    monkeypatch.setattr(support, "log", lines.append)
    clock = support.PhaseClock()
    clock("control plane with 3 nodes")
    clock("storm: 2 nodes fault at once")
    assert clock.end() == 745.0
    assert clock.phases == [("control plane with 3 nodes", 0.0, 1.5), ("storm: 2 nodes fault at once", 42.0, 1.5)]
    assert lines == [
        "== control plane with 3 nodes (load average 1.5) ==",
        "   (control plane with 3 nodes took 42 s; 0.7 min in)",
        "== storm: 2 nodes fault at once (load average 1.5) ==",
        "   (storm took 11 min 43 s; whole run 12 min 25 s)",
    ]


class _Stoppable:
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def __getattr__(self, verb: str) -> Any:
        if verb in ("stop", "close", "kill"):
            return lambda: self.calls.append(f"{verb} {self.name}")
        raise AttributeError(verb)


def test_the_teardown_stops_what_runs_on_the_cluster_before_the_cluster() -> None:
    calls: list[str] = []
    started = Started(cluster=cast(BenchCluster, _Stoppable("cluster", calls)), pool=ThreadPoolExecutor(max_workers=1))
    started.heartbeats = cast(Any, _Stoppable("heartbeats", calls))
    started.fleets.append(cast(Any, _Stoppable("agents", calls)))
    started.operator = cast(Any, _Stoppable("operator", calls))
    started.operators.append(cast(Any, _Stoppable("replica", calls)))
    started.stop()
    assert calls == ["close heartbeats", "stop agents", "stop operator", "kill replica", "stop cluster"]


def test_a_failed_step_of_the_teardown_does_not_leave_the_control_plane_running() -> None:
    from concurrent.futures import ThreadPoolExecutor
    from typing import cast

    from devkit.agents import AgentFleet
    from hack.bench.cluster import BenchCluster
    from hack.bench.context import Started

    stopped: list[str] = []

    class Stuck:
        def stop(self) -> None:
            stopped.append("fleet")
            raise TimeoutError("an agent did not exit")

    class Cluster:
        def stop(self) -> None:
            stopped.append("cluster")

    started = Started(cast(BenchCluster, Cluster()), ThreadPoolExecutor(1), fleets=[cast(AgentFleet, Stuck())])
    with pytest.raises(TimeoutError):
        started.stop()
    assert stopped == ["fleet", "cluster"]
