"""One fleet size through the operator's intake, in this process: memory, CPU per event, load, storm.

Each event goes the way a watch event does (``controller/intake/objectwatch.py``): the line the API
server streams is decoded, slimmed by the watch's own ``slim`` and handed to the runtime's feeder,
which updates the caches and queues the node; the runtime's own workers (``Runtime._worker``) and
sweeper then pass the node, against the in-memory port (``kube.py``). What the probe leaves out: the
watch threads' socket reads and the hop from that thread to the loop (one ``call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import json
import os
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gpuhealth.controller.process.runtime import Runtime, settle_heap
from gpuhealth.controller.state.slim import slim_lease, slim_node, slim_pod, slim_report
from hack.fleetprobe import fleet
from hack.fleetprobe.kube import MemKube
from hack.memprobe import wire
from hack.memprobe.fleet import policy_body

TICK_S = 0.01  # the load driver's step: each step delivers the events due by then


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


@dataclass
class Event:
    kind: str  # pod_add, pod_update, pod_delete, report_change, lease_renewal, node_update, fault
    node: int
    line: bytes


class Clock:
    """The runtime's clock: still at T0 while the fleet is built, then moving with the wall clock."""

    def __init__(self) -> None:
        self.started: float | None = None

    def start(self) -> None:
        self.started = time.monotonic()

    def __call__(self) -> dt.datetime:
        moved = 0.0 if self.started is None else time.monotonic() - self.started
        return fleet.T0 + dt.timedelta(seconds=moved)


class Probe:
    def __init__(self, nodes: int) -> None:
        self.n = nodes
        self.kube = MemKube()
        self.clock = Clock()
        self.rt = Runtime(self.kube, clock=self.clock)  # the runtime's defaults: 16 workers, a 5 s sweep
        self.passes = 0
        self.rv = 20_000_000
        self.extra: dict[int, int] = {}  # node -> pods added beyond its 8
        reconcile = self.rt.reconciler.reconcile

        async def counted(name: str) -> float | None:
            self.passes += 1
            return await reconcile(name)

        self.rt.reconciler.reconcile = counted  # type: ignore[method-assign]
        self.feed: dict[str, Callable[[str, dict[str, Any]], None]] = {
            "node": self.rt.on_node,
            "report": self.rt.on_report,
            "pod": self.rt.on_pod,
            "lease": self.rt.on_lease,
        }
        self.slim: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "node": slim_node,
            "report": slim_report,
            "pod": slim_pod,
            "lease": slim_lease,
        }

    # -- the fleet, held ---------------------------------------------------------------------------

    def build(self) -> dict[str, Any]:
        """Feed the fleet as the start-up lists do (slimmed bodies, nothing queued); what it holds."""
        gc.collect()
        rss0 = rss_bytes()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        started = time.process_time()
        rt = self.rt
        rt.store.pods.expect()
        rt.on_policy("ADDED", wire(policy_body()), enqueue=False)
        for i in range(self.n):
            rt.on_node("ADDED", slim_node(wire(fleet.settled_node(i))), enqueue=False)
            rt.on_report("ADDED", slim_report(wire(fleet.settled_report(i))), enqueue=False)
            rt.on_lease("ADDED", slim_lease(wire(fleet.lease_body(i, fleet.name(i)))), live=False)
        gc.collect()
        fleet_bytes = tracemalloc.get_traced_memory()[0] - base
        for i in range(self.n):
            for k in range(fleet.PODS_PER_NODE):
                rt.on_pod("ADDED", slim_pod(wire(fleet.gpu_pod(i, k))), enqueue=False)
        rt.store.pods.listed()
        gc.collect()
        total = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        settle_heap()  # as the runtime does once its start-up pod list is in (``Runtime._list_pods``)
        pods = self.n * fleet.PODS_PER_NODE
        return {
            "held_bytes": total,
            "bytes_per_node": round(fleet_bytes / self.n),
            "bytes_per_pod": round((total - fleet_bytes) / pods),
            "rss_bytes": rss_bytes(),
            "rss_growth_bytes": rss_bytes() - rss0,
            "build_cpu_s": round(time.process_time() - started, 2),
        }

    # -- the runtime's own workers and sweeper ----------------------------------------------------

    async def start(self) -> None:
        rt = self.rt
        rt._loop = asyncio.get_running_loop()
        rt.leadership.loaded()
        rt.hold()
        await rt.active.wait()
        rt._tasks = [asyncio.create_task(rt._worker(i)) for i in range(rt.workers)]
        rt._tasks.append(asyncio.create_task(rt._sweeper()))

    async def idle(self) -> None:
        q = self.rt.queue
        while q._dirty or q._processing:
            await asyncio.sleep(0.001)

    def full_collection_ms(self) -> float:
        """How long one full cyclic collection stops the process (the loop with it), at this size."""
        started = time.perf_counter()
        gc.collect()
        return round((time.perf_counter() - started) * 1e3, 1)

    async def settle(self) -> dict[str, Any]:
        """Pass every node once, as start-up does: a settled fleet writes nothing."""
        cpu, wall = time.process_time(), time.perf_counter()
        for name in list(self.rt.store.nodes):
            self.rt.queue.add(name)
        await self.idle()
        passes = [w for w in self.kube.writes if w.verb != "patch_policy_status"]
        return {
            "passes": self.passes,
            "cpu_s": round(time.process_time() - cpu, 2),
            "wall_s": round(time.perf_counter() - wall, 2),
            "cpu_ms_per_pass": round((time.process_time() - cpu) / max(1, self.passes) * 1e3, 3),
            # The passes' writes. The sweeper's first tick (5 s after start) writes the policy's status once,
            # inside this phase when a loaded machine makes it last that long (a unit test's run, 1 write):
            # that write is the policy's, not the settled nodes', and counted apart.
            "writes": len(passes),
            "written": sorted({f"{w.verb} {w.name}" for w in passes}),  # what, where a write is a bug
            "policy_writes": len(self.kube.writes) - len(passes),
        }

    # -- events ------------------------------------------------------------------------------------

    def _rv(self) -> int:
        self.rv += 1
        return self.rv

    def event(self, kind: str, i: int, at: dt.datetime) -> Event:
        """The next event of ``kind`` on node ``i``, as the watch streams it."""
        if kind == "pod_add":
            k = fleet.PODS_PER_NODE + self.extra.get(i, 0)
            self.extra[i] = self.extra.get(i, 0) + 1
            return Event(kind, i, fleet.line("ADDED", fleet.gpu_pod(i, k, rv=self._rv())))
        if kind == "pod_delete":
            extra = self.extra.get(i, 0)
            k = fleet.PODS_PER_NODE + extra - 1 if extra else 0
            if extra:
                self.extra[i] = extra - 1
            return Event(kind, i, fleet.line("DELETED", fleet.gpu_pod(i, k, rv=self._rv())))
        if kind == "pod_update":
            return Event(kind, i, fleet.line("MODIFIED", fleet.gpu_pod(i, i % fleet.PODS_PER_NODE, rv=self._rv())))
        if kind == "report_change":
            return Event(kind, i, fleet.line("MODIFIED", fleet.settled_report(i, at=at, rv=self._rv())))
        if kind == "fault":
            body = fleet.settled_report(i, at=at, rv=self._rv(), xid=fleet.FAULT_XID)
            return Event(kind, i, fleet.line("MODIFIED", body))
        if kind == "lease_renewal":
            return Event(kind, i, fleet.line("MODIFIED", fleet.renewed_lease(i, at)))
        if kind == "node_update":
            return Event(kind, i, fleet.line("MODIFIED", fleet.updated_node(i, self._rv())))
        raise ValueError(kind)

    def deliver(self, e: Event) -> None:
        """What the watch thread and the loop do with one streamed line."""
        msg = json.loads(e.line)
        watch = _WATCH[e.kind]
        if watch == "report":  # the agent's write, now what the port answers with (kube.py ``observe``)
            self.kube.observe("report", fleet.name(e.node), msg["object"])
        obj = self.slim[watch](msg["object"])
        if watch == "lease":
            self.rt.on_lease(msg["type"], obj)
        else:
            self.feed[watch](msg["type"], obj)

    async def per_event(self, kind: str, count: int) -> dict[str, Any]:
        """CPU per event of one kind: intake (decode, slim, feed, queue) and the passes it caused."""
        at = self.clock()
        step = max(1, self.n // count)
        events = [self.event(kind, (j * step) % self.n, at) for j in range(count)]
        await self.idle()
        passes = self.passes
        cpu0 = time.process_time()
        for e in events:
            self.deliver(e)
        cpu1 = time.process_time()
        await self.idle()
        cpu2 = time.process_time()
        return {
            "events": count,
            "intake_us": round((cpu1 - cpu0) / count * 1e6, 1),
            "passes_per_event": round((self.passes - passes) / count, 3),
            "pass_us_per_event": round((cpu2 - cpu1) / count * 1e6, 1),
            "total_us": round((cpu2 - cpu0) / count * 1e6, 1),
        }

    # -- load --------------------------------------------------------------------------------------

    def schedule(self, seconds: float, rates: dict[str, float], faults: list[int]) -> list[tuple[float, Event]]:
        """Every event of the phase, made before it starts (making them is not the operator's cost),
        at even spacing per kind; the nodes of each kind's events walk the fleet."""
        out: list[tuple[float, Event]] = []
        cursor = {k: (hash(k) % 997) * 13 for k in rates}
        for kind, rate in rates.items():
            count = int(seconds * rate)
            for j in range(count):
                t = (j + 0.5) / rate
                i = cursor[kind] % self.n
                cursor[kind] += 7919  # a prime stride: every node in turn, neighbours apart
                out.append((t, self.event(kind, i, fleet.T0 + dt.timedelta(seconds=t))))
        if faults:
            gap = seconds / (len(faults) + 1)
            for j, i in enumerate(faults, 1):
                out.append((j * gap, self.event("fault", i, fleet.T0 + dt.timedelta(seconds=j * gap))))
        out.sort(key=lambda te: te[0])
        return out

    async def load(self, seconds: float, rates: dict[str, float], faults: list[int]) -> dict[str, Any]:
        """Deliver a phase's events on time; the CPU it took, and each fault's report to its taint."""
        plan = self.schedule(seconds, rates, faults)
        await self.idle()
        self.kube.writes.clear()
        sent: dict[int, float] = {}
        lag: list[float] = []
        passes = self.passes
        cpu, t0 = time.process_time(), time.perf_counter()
        k = 0
        while k < len(plan):
            now = time.perf_counter() - t0
            while k < len(plan) and plan[k][0] <= now:
                due, e = plan[k]
                if e.kind == "fault":
                    sent[e.node] = time.perf_counter()
                self.deliver(e)
                lag.append(now - due)
                k += 1
            await asyncio.sleep(TICK_S)
        await self.idle()
        wall = time.perf_counter() - t0
        used = time.process_time() - cpu
        return {
            "seconds": round(wall, 2),
            "rates_per_s": rates,
            "events": len(plan),
            "cpu_s": round(used, 2),
            "core_share": round(used / wall, 3),
            "passes": self.passes - passes,  # node passes the phase's events, faults and sweeps caused
            # How late the driver delivered events (a stalled loop, or a process the machine did not run):
            # a fault's detection cannot be faster than its report's delivery.
            "delivery_lag_p99_ms": round(pct(lag, 0.99) * 1e3, 1),
            **self._detections(sent),
        }

    async def storm(self, nodes: list[int]) -> dict[str, Any]:
        """``nodes`` fault at once: their reports arrive back to back, as one watch delivers them."""
        at = self.clock()
        events = [self.event("fault", i, at) for i in nodes]
        await self.idle()
        self.kube.writes.clear()
        sent: dict[int, float] = {}
        cpu, t0 = time.process_time(), time.perf_counter()
        for e in events:
            sent[e.node] = time.perf_counter()
            self.deliver(e)
        await self.idle()
        wall = time.perf_counter() - t0
        return {
            "nodes": len(nodes),
            "seconds": round(wall, 2),
            "cpu_s": round(time.process_time() - cpu, 2),
            "nodes_per_s": round(len(nodes) / wall, 1),
            **self._detections(sent),
        }

    def _detections(self, sent: dict[int, float]) -> dict[str, Any]:
        """Each fault's report event to the first write that left gpuhealth's taint on its Node."""
        first: dict[str, float] = {}
        for w in self.kube.writes:
            if w.tainted and w.name not in first:
                first[w.name] = w.at
        got = [(first[fleet.name(i)] - t) * 1e3 for i, t in sent.items() if first.get(fleet.name(i), -1.0) >= t]
        verbs: dict[str, int] = {}
        for w in self.kube.writes:
            verbs[w.verb] = verbs.get(w.verb, 0) + 1
        return {
            "faults": len(sent),
            "tainted": len(got),
            "detection_ms": {
                "p50": round(pct(got, 0.5), 2),
                "p99": round(pct(got, 0.99), 2),
                "max": round(max(got, default=float("nan")), 2),
            },
            "writes": dict(sorted(verbs.items())),
        }

    async def stop(self) -> None:
        for t in self.rt._tasks:
            t.cancel()
        await asyncio.gather(*self.rt._tasks, return_exceptions=True)
        self.rt.pool.shutdown(wait=False, cancel_futures=True)
        self.rt.drain_pool.shutdown(wait=False, cancel_futures=True)
        self.rt.events.close()


_WATCH = {
    "pod_add": "pod",
    "pod_update": "pod",
    "pod_delete": "pod",
    "report_change": "report",
    "fault": "report",
    "lease_renewal": "lease",
    "node_update": "node",
}
KINDS = ("pod_add", "pod_update", "pod_delete", "report_change", "lease_renewal", "node_update")


def spread(n: int, count: int, offset: int = 0) -> Iterator[int]:
    """``count`` distinct nodes spread over the fleet."""
    step = max(1, n // max(1, count))
    return ((offset + j * step) % n for j in range(count))
