"""Background fact traffic for `make bench`: health facts that change without being a fault.

A live fleet's reports change all the time for reasons that need no action: a corrected ECC error is
counted, a GPU warms up under load and cools down again. Each such change is a report write (the
agent writes on change), which the operator receives and assesses like any other. This phase asks:
what does a single fault's detection-to-taint cost while the fleet writes N such changes a second?

``FactTraffic`` sends the changes through each simulated node's own publisher (``SimNode.fact_change``)
at a fixed rate on random healthy nodes, and counts the writes it achieved: the rate reported is the
one achieved, not the one asked. ``TrafficProcesses`` runs it in worker processes of its own, each
with its share of the rate and of the nodes: in the bench's process, its threads would compete for
the interpreter lock with the independent watches whose timestamps are the measurement (one process
managed about 60 writes a second, and the floor chain's latency rose with it). ``measure_traffic``
runs it at each asked rate, first alone (what the operator spends on traffic that changes no verdict:
its CPU and its writes, which should be none), then with single faults one at a time on other nodes,
timed as the detection phase times them.
"""

from __future__ import annotations

import datetime as dt
import math
import multiprocessing as mp
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from devkit.audit import read_audit
from hack.bench.fleet import SimNode
from hack.bench.support import (
    FAULT_TIMEOUT_S,
    TAINT,
    ProcSampler,
    api_client,
    describe,
    latency_summary,
    log,
    publish_all,
)
from hack.bench.watch import NodeWatch, ReportWatch

# How far behind the pacer may fall before it stops catching up (a burst of more would not be the rate).
MAX_BACKLOG_S = 1.0
TRAFFIC_ONLY_S = 10.0  # the window with traffic and nothing else, per rate


def due_now(rate_per_s: float, elapsed_s: float, sent: int, max_backlog: int) -> tuple[int, int]:
    """(events to send now, events to give up on) for a pacer ``elapsed_s`` into a run at ``rate_per_s``.

    Event i is due at i / rate. Everything due and not yet sent is sent now, but at most ``max_backlog``:
    a pacer that fell further behind (its workers were all busy) gives up on the oldest rather than
    bursting, so the achieved rate shows the shortfall instead of hiding it in a burst.
    """
    if rate_per_s <= 0 or elapsed_s < 0:
        return 0, 0
    owed = math.floor(elapsed_s * rate_per_s) + 1 - sent
    if owed <= 0:
        return 0, 0
    skip = max(0, owed - max(1, max_backlog))
    return owed - skip, skip


def achieved_rate(writes: int, window_s: float) -> float | None:
    """Writes per second over a window; None over an empty one."""
    return writes / window_s if window_s > 0 else None


class FactNode(Protocol):
    """What the traffic needs of a node: a fact change written through the agent's publisher."""

    name: str

    def fact_change(self, event: int) -> str | None: ...


@dataclass
class TrafficCounts:
    sent: int = 0
    writes: int = 0
    unchanged: int = 0  # the publisher found nothing to write (should not happen: every event changes a fact)
    failures: int = 0
    skipped: int = 0  # events the pacer gave up on, having fallen more than MAX_BACKLOG_S behind


class FactTraffic:
    """Fact changes on random nodes at ``rate_per_s``, from a pool of ``workers`` threads."""

    def __init__(self, nodes: Sequence[FactNode], rate_per_s: float, workers: int = 16, seed: int = 15) -> None:
        if not nodes:
            raise ValueError("background traffic needs at least one node")
        self.nodes = nodes
        self.rate = rate_per_s
        self.workers = workers
        self.rng = random.Random(seed)
        self.counts = TrafficCounts()
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(workers)
        self.stop_event = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="traffic")
        self.thread = threading.Thread(target=self._run, name="bench-traffic", daemon=True)

    def start(self) -> FactTraffic:
        self.thread.start()
        return self

    def mark(self) -> tuple[float, int]:
        """(now, writes so far): two marks give the achieved rate between them."""
        with self.lock:
            return time.time(), self.counts.writes

    def stop(self) -> TrafficCounts:
        self.stop_event.set()
        self.thread.join()
        self.pool.shutdown(wait=True)
        return self.counts

    def _run(self) -> None:
        t0 = time.monotonic()
        max_backlog = max(1, math.ceil(self.rate * MAX_BACKLOG_S))
        while not self.stop_event.is_set():
            fire, skip = due_now(self.rate, time.monotonic() - t0, self.counts.sent + self.counts.skipped, max_backlog)
            with self.lock:
                self.counts.skipped += skip
            for _ in range(fire):
                # A free worker, or wait for one (a slow API server shows as a lower achieved rate).
                while not self.slots.acquire(timeout=0.1):
                    if self.stop_event.is_set():
                        return
                with self.lock:
                    event = self.counts.sent
                    self.counts.sent += 1
                node = self.nodes[self.rng.randrange(len(self.nodes))]
                self.pool.submit(self._one, node, event)
            if not fire:
                self.stop_event.wait(min(0.05, 1.0 / self.rate))

    def _one(self, node: FactNode, event: int) -> None:
        try:
            kind = node.fact_change(event)
            with self.lock:
                if kind in ("create", "patch"):
                    self.counts.writes += 1
                else:
                    self.counts.unchanged += 1
        except Exception:
            with self.lock:
                self.counts.failures += 1
        finally:
            self.slots.release()


class LazyFactNode:
    """A node of a traffic worker process: attached to the node's report on its first change."""

    def __init__(self, name: str, index: int, boot_time: dt.datetime, api: Any) -> None:
        self.name = name
        self.index = index
        self.boot_time = boot_time
        self.api = api
        self.sim: SimNode | None = None
        self.lock = threading.Lock()

    def fact_change(self, event: int) -> str | None:
        with self.lock:
            if self.sim is None:
                # No Lease: the bench's own simulator of this node renews it; this one only writes facts.
                sim = SimNode(self.name, self.index, self.api, renew_lease=False)
                sim.attach(self.boot_time)
                self.sim = sim
            return self.sim.fact_change(event)


COUNT_FIELDS = ("sent", "writes", "unchanged", "failures", "skipped")


def traffic_worker(
    kubeconfig: str,
    nodes: list[tuple[str, int, str]],
    rate_per_s: float,
    seed: int,
    ready: Any,
    stop: Any,
    shared: Any,
) -> None:
    """One traffic process: ``nodes`` (name, index, boot time) at ``rate_per_s``, counts mirrored into ``shared``."""
    api = api_client(Path(kubeconfig), pool=20)
    lazy = [LazyFactNode(n, i, dt.datetime.fromisoformat(b), api) for n, i, b in nodes]
    traffic = FactTraffic(lazy, rate_per_s, seed=seed)

    def mirror(counts: TrafficCounts) -> None:
        for i, f in enumerate(COUNT_FIELDS):
            shared[i] = getattr(counts, f)

    ready.set()
    traffic.start()
    while not stop.wait(0.2):
        mirror(traffic.counts)
    mirror(traffic.stop())


def split(nodes: Sequence[tuple[str, int, str]], parts: int) -> list[list[tuple[str, int, str]]]:
    """``nodes`` dealt round robin into ``parts`` disjoint shares (no node is written by two processes)."""
    return [list(nodes[i::parts]) for i in range(parts)]


def processes_for(rate_per_s: float, cpus: int) -> int:
    """Worker processes for a rate: one per 60 changes a second (what one manages), at most one per CPU."""
    return max(1, min(max(1, cpus), math.ceil(rate_per_s / 60)))


class TrafficProcesses:
    """``FactTraffic`` in worker processes, each with its share of the rate and of the nodes."""

    def __init__(self, kubeconfig: Path, nodes: Sequence[SimNode], rate_per_s: float) -> None:
        ctx = mp.get_context("spawn")  # the bench's process has many threads: no fork
        specs = [(n.name, n.index, n.boot_time.isoformat()) for n in nodes]
        parts = processes_for(rate_per_s, os.cpu_count() or 1)
        self.ready = [ctx.Event() for _ in range(parts)]
        self.stop_event = ctx.Event()
        self.shared = [ctx.Array("q", len(COUNT_FIELDS)) for _ in range(parts)]
        self.procs = [
            ctx.Process(
                target=traffic_worker,
                args=(
                    str(kubeconfig),
                    share,
                    rate_per_s / parts,
                    15 + i,
                    self.ready[i],
                    self.stop_event,
                    self.shared[i],
                ),
                name=f"bench-traffic-{i}",
                daemon=True,
            )
            for i, share in enumerate(split(specs, parts))
        ]

    def start(self, timeout: float = 120.0) -> TrafficProcesses:
        for proc in self.procs:
            proc.start()
        for ev in self.ready:
            if not ev.wait(timeout):
                self.stop()
                raise RuntimeError("a traffic worker process did not start")
        return self

    def _total(self, field: str) -> int:
        i = COUNT_FIELDS.index(field)
        return sum(int(a[i]) for a in self.shared)

    def mark(self) -> tuple[float, int]:
        """(now, writes so far, to within the workers' 0.2 s mirroring)."""
        return time.time(), self._total("writes")

    def stop(self) -> TrafficCounts:
        self.stop_event.set()
        for proc in self.procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
        return TrafficCounts(**{f: self._total(f) for f in COUNT_FIELDS})


@dataclass
class TrafficContext:
    """What the traffic phase measures with: the fleet, the watches, the operator and its audit log."""

    nodes: Sequence[SimNode]  # healthy nodes the traffic may touch (none of the faulted ones)
    kubeconfig: Path  # the simulated agents' identity
    sims: dict[str, SimNode]
    node_watch: NodeWatch
    report_watch: ReportWatch
    operator: ProcSampler
    audit_log: Path
    operator_user: str
    pool: ThreadPoolExecutor
    floor: Callable[[], float | None]  # one no-logic floor sample (ms), None if it timed out
    settle_s: float  # before each rate: the operator's trailing work of the phase before (Events, sweeps) done


def measure_traffic(
    ctx: TrafficContext, rates: Sequence[float], fault_nodes: Sequence[Sequence[str]]
) -> list[dict[str, Any]]:
    """For each asked rate: the traffic alone, then single faults under it on that rate's own nodes (a node
    quarantined too often within the flapping window would be held for repair); the traffic stops between rates.
    """
    out = []
    for asked, nodes in zip(rates, fault_nodes, strict=True):
        out.append(_one_rate(ctx, asked, nodes))
        # Back to healthy for the next rate: the faulted nodes "reboot" (clean reports), taints go.
        publish_all(ctx.pool, SimNode.reboot, [ctx.sims[n] for n in nodes])
        ctx.report_watch.wait_states(nodes, "Healthy", timeout=120)
        ctx.node_watch.wait_all(nodes, TAINT, timeout=60, present=False)
    return out


def _one_rate(ctx: TrafficContext, asked: float, fault_nodes: Sequence[str]) -> dict[str, Any]:
    time.sleep(ctx.settle_s)
    traffic = TrafficProcesses(ctx.kubeconfig, ctx.nodes, asked).start()
    time.sleep(2.0)  # the pacers and their workers running, the first nodes attached
    # The traffic alone: what it costs the operator (no verdict changes, so it should write nothing).
    alone_from, cpu_from = traffic.mark(), ctx.operator.cpu_s()
    time.sleep(TRAFFIC_ONLY_S)
    alone_to, cpu_to = traffic.mark(), ctx.operator.cpu_s()
    # Then single faults, one at a time, while it keeps going; after every other one a floor sample (the
    # no-logic chain through the same API server and watches, under the same traffic): the ratio says how
    # much of the latency is gpuhealth's and how much the shared machine's.
    detect: list[float] = []
    floor: list[float] = []
    timeouts = floor_timeouts = 0
    for i, name in enumerate(fault_nodes):
        t0 = time.time()
        ctx.sims[name].fault()
        t1 = ctx.node_watch.wait_taint(name, TAINT, timeout=FAULT_TIMEOUT_S)
        if t1 is None:
            timeouts += 1
        else:
            detect.append((t1 - t0) * 1000)
        time.sleep(0.2)
        if i % 2 == 1:
            ms = ctx.floor()
            if ms is None:
                floor_timeouts += 1
            else:
                floor.append(ms)
            time.sleep(0.2)
    faults_to, fault_cpu_to = traffic.mark(), ctx.operator.cpu_s()
    counts = traffic.stop()
    time.sleep(1.0)  # the audit log is written as each request completes
    ops = [e for e in read_audit(ctx.audit_log, ctx.operator_user) if alone_from[0] <= e.at < faults_to[0]]
    alone = [e for e in ops if e.at < alone_to[0]]
    window = faults_to[0] - alone_from[0]
    alone_s = alone_to[0] - alone_from[0]
    achieved = achieved_rate(faults_to[1] - alone_from[1], window)
    d = latency_summary(detect, timeouts, FAULT_TIMEOUT_S * 1000)
    fl = latency_summary(floor, floor_timeouts, FAULT_TIMEOUT_S * 1000)
    res: dict[str, Any] = {
        "asked_per_s": asked,
        "processes": len(traffic.procs),
        "achieved_per_s": round(achieved, 1) if achieved is not None else None,
        "writes": faults_to[1] - alone_from[1],
        "window_s": round(window, 1),
        "sent": counts.sent,
        "unchanged": counts.unchanged,
        "failures": counts.failures,
        "skipped": counts.skipped,
        "detect_to_taint_ms": d,
        "floor_ms": fl,
        "ratio_to_floor": round(d["p50"] / fl["p50"], 2) if floor and fl["p50"] > 0 else None,
        "operator_cpu_percent_traffic_only": round((cpu_to - cpu_from) / alone_s * 100, 1) if alone_s > 0 else None,
        "operator_cpu_percent": round((fault_cpu_to - cpu_from) / window * 100, 1) if window > 0 else None,
        "operator_writes_traffic_only": sum(e.write for e in alone),
        "operator_writes_traffic_only_by_kind": describe(e for e in alone if e.write),
        "operator_requests": len(ops),
        "operator_writes": sum(e.write for e in ops),
        "operator_writes_by_kind": describe(e for e in ops if e.write),
    }
    log(
        f"  traffic {asked:g}/s asked, {res['achieved_per_s']}/s achieved: detect p50 {d['p50']} ms, "
        f"p99 {d['p99']} ms ({timeouts} timed out), floor p50 {fl['p50']} ms; "
        f"operator CPU {res['operator_cpu_percent']}%, "
        f"writes {res['operator_writes']} ({res['operator_writes_traffic_only']} with traffic alone)"
    )
    return res
