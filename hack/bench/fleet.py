"""The simulated fleet of `make bench`: one agent per node, with a simulated device source and the
agent's own publishing code and heartbeat Lease.

The simulated agents publish through the agent's own code (``Publisher`` over ``KubeTransport`` with a
``ReportBuilder``, renewing a ``NodeLease``): only the device source is simulated, so every report
write is the merge patch and every renewal the Lease patch the real agent would send.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import heapq
import math
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from kubernetes import client

from gpuhealth.agent.events import XidBuffer
from gpuhealth.agent.lease import KubeLeaseTransport, NodeLease
from gpuhealth.agent.model import (
    DeviceFacts,
    EccCounts,
    NvmlStatus,
    RemappedRows,
    RetiredPages,
    Snapshot,
    Temperature,
    XidEvent,
)
from gpuhealth.agent.publisher import LatestSnapshot, Publisher
from gpuhealth.agent.report import AgentInfo, ReportBuilder, now_utc
from gpuhealth.agent.runner import agent_version
from gpuhealth.agent.transport import KubeTransport
from gpuhealth.api.report import MigDevice

LEASE_NAMESPACE = "gpuhealth-system"  # where the operator (OperatorProcess) watches the agents' Leases
# A pass is due a little after the publisher's own clock says so (it stamps a renewal just after ours).
NEXT_PASS_SLACK_S = 0.01


def gpu_uuid(node_index: int, gpu: int) -> str:
    return f"GPU-{node_index:08x}-{gpu:04x}-4000-8000-{node_index * 8 + gpu:012x}"


# A temperature move of the background traffic: past the report's 5 C dead band (so the agent writes it),
# far below the policy's thermal threshold (90 C) and the GPUs' slowdown (90 C): a fact, never a fault.
WARM_DELTA_C = 8


# Per GPU index, the MIG devices NVML lists under it (a MIG-enabled GPU); the other GPUs are not MIG-enabled.
MigLayout = Mapping[int, tuple[MigDevice, ...]]


def healthy_snapshot(
    node_index: int, gpus: int = 8, corrected: Sequence[int] = (), warm: bool = False, mig: MigLayout | None = None
) -> Snapshot:
    """What a healthy 8x H100 node looks like to the sampler.

    ``corrected``: each GPU's volatile corrected-ECC count (no rule acts on corrected errors); ``warm``:
    every GPU ``WARM_DELTA_C`` warmer than idle. Both are the background fact traffic's changes.
    ``mig``: the GPUs in MIG mode and their MIG devices (the bench's MIG fleet, hack/bench/mig.py).
    """
    layout = mig or {}
    devices = tuple(
        DeviceFacts(
            index=i,
            uuid=gpu_uuid(node_index, i),
            pci_bus_id=f"00000000:{0x18 + i * 0x10:02X}:00.0",
            model="NVIDIA H100 80GB HBM3",
            mig_mode="Enabled" if i in layout else "Disabled",
            mig_devices=layout.get(i, ()),
            ecc_mode="Enabled",
            ecc=EccCounts(0, corrected[i] if i < len(corrected) else 0, 0, 0),
            retired_pages=RetiredPages(0, 0, False),
            remapped_rows=RemappedRows(0, 0, False, False),
            temperature=Temperature(44 + i % 4 + (WARM_DELTA_C if warm else 0), 90, 95),
            clock_event_reasons=0,
            power_w=310.0 + i,
        )
        for i in range(gpus)
    )
    return Snapshot(
        time=now_utc(),
        nvml=NvmlStatus(available=True, driver_version="570.124.06", cuda_version="12.8"),
        devices=devices,
        sources=("simulated",),
    )


def ecc_snapshot(node_index: int, gpu: int, gpus: int = 8, mig: MigLayout | None = None) -> Snapshot:
    """The healthy node with one uncorrected (volatile) ECC error on ``gpu``: a device-scoped fault."""
    snap = healthy_snapshot(node_index, gpus, mig=mig)
    devices = tuple(dataclasses.replace(d, ecc=EccCounts(1, 0, 0, 0)) if d.index == gpu else d for d in snap.devices)
    return dataclasses.replace(snap, devices=devices)


class HeartbeatStats:
    """Every Lease renewal the simulated fleet made: how many, and the longest gap on any one node."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.renewals = 0
        self.failures = 0
        self.last: dict[str, float] = {}
        self.max_gap_s = 0.0

    def renewed(self, node: str, at: float) -> None:
        with self.lock:
            self.renewals += 1
            prev = self.last.get(node)
            if prev is not None:
                self.max_gap_s = max(self.max_gap_s, at - prev)
            self.last[node] = at

    def failed(self) -> None:
        with self.lock:
            self.failures += 1

    def reset_gap(self) -> None:
        """Measure the longest gap from here on (the first pass after start-up may skip one renewal)."""
        with self.lock:
            self.max_gap_s = 0.0
            now = time.time()
            self.last = dict.fromkeys(self.last, now)

    def mark(self) -> tuple[float, int]:
        """(now, renewals so far): two marks give the rate achieved between them."""
        with self.lock:
            return time.time(), self.renewals


class CountingLease:
    """The agent's own ``NodeLease`` renewal, counted (the simulator's identity is not audited)."""

    def __init__(self, lease: NodeLease, stats: HeartbeatStats) -> None:
        self.lease = lease
        self.stats = stats
        self.last_monotonic = float("-inf")

    def renew(self, now: dt.datetime) -> str:
        kind = self.lease.renew(now)
        self.last_monotonic = time.monotonic()
        self.stats.renewed(self.lease.node, time.time())
        return kind

    def changed(self) -> bool:
        return self.lease.changed()


class SimNode:
    """One node's agent with a simulated device source and the real publisher and Lease renewal.

    Calls are serialised per node (the real agent has one publisher thread): faults and the heartbeat
    driver may reach the same node from different threads.
    """

    def __init__(
        self,
        name: str,
        index: int,
        api: client.ApiClient,
        heartbeat_s: float = 3600.0,
        stats: HeartbeatStats | None = None,
        renew_lease: bool = True,
        mig: MigLayout | None = None,
    ) -> None:
        self.name = name
        self.index = index
        self.mig = mig  # the MIG-enabled GPUs' MIG devices, in every sample this node's agent takes
        self.transport = KubeTransport(api)
        self.heartbeat_s = heartbeat_s
        self.stats = stats or HeartbeatStats()
        self.lease = NodeLease(KubeLeaseTransport(api), LEASE_NAMESPACE, name, heartbeat_s)
        # One counter across boots: it knows when this node last renewed, as the agent's loop does.
        self.renewer = CountingLease(self.lease, self.stats)
        self.primed = False
        self.renew_lease = renew_lease
        self.lock = threading.RLock()
        self._boot(now_utc() - dt.timedelta(hours=1))

    def _boot(self, boot_time: dt.datetime) -> None:
        # The background traffic's facts: volatile counters and a temperature, which a reboot clears.
        self.corrected: list[int] = [0] * 8
        self.warm = False
        self.builder = ReportBuilder(
            self.name, AgentInfo(version=agent_version(), sources=("simulated",), boot_time=boot_time)
        )
        self.latest = LatestSnapshot()
        self.xids = XidBuffer()
        # As the agent: the heartbeat is a Lease renewal every heartbeat_s, the report written only on change;
        # retries as the agent does.
        self.publisher = Publisher(
            self.transport,
            self.builder,
            self.latest,
            self.xids,
            heartbeat_interval_s=self.heartbeat_s,
            initial_backoff_s=0.2,
            max_backoff_s=5.0,
            lease=self.renewer if self.renew_lease else None,
        )
        self.publisher.give_up_after_s = 60.0

    def start(self) -> str | None:
        """What the agent does at start: read the existing report, sample, write (create or patch)."""
        with self.lock:
            self.publisher.restore()
            self.latest.set(healthy_snapshot(self.index, mig=self.mig))
            return self.publisher.publish()

    @property
    def boot_time(self) -> dt.datetime:
        boot = self.builder.agent.boot_time
        assert boot is not None  # every simulated boot has one
        return boot

    def attach(self, boot_time: dt.datetime) -> None:
        """Take over a node another simulator (another process) publishes for: the same boot, and the report
        as the server has it, so the next write is a merge patch against it."""
        with self.lock:
            self._boot(boot_time)
            self.publisher.restore()

    def fault(self, xid: int = 79, gpu: int = 3) -> str | None:
        """The XID enters the source (the event thread's hand-off) and the publisher writes it at once."""
        with self.lock:
            event = XidEvent(xid=xid, time=now_utc(), source="simulated", gpu=gpu, uuid=gpu_uuid(self.index, gpu))
            self.xids.put(event)
            return self.publisher.publish()

    def device_fault(self, gpu: int = 3) -> str | None:
        """A sample with an uncorrected ECC error on ``gpu`` (device scope), written at once."""
        with self.lock:
            self.latest.set(ecc_snapshot(self.index, gpu, mig=self.mig))
            return self.publisher.publish()

    def device_clear(self) -> str | None:
        """The GPU was reset: the next sample is clean again."""
        with self.lock:
            self.latest.set(healthy_snapshot(self.index, mig=self.mig))
            return self.publisher.publish()

    def sample(self, snapshot: Snapshot) -> str | None:
        """The source took ``snapshot`` (any facts a phase sets up): the publisher writes it at once."""
        with self.lock:
            self.latest.set(snapshot)
            return self.publisher.publish()

    def fact_change(self, event: int) -> str | None:
        """Background health traffic, not a fault: the sampler sees a fact move and the publisher writes it.

        Even events add a corrected ECC error on one GPU, odd ones move the GPUs' temperature by
        ``WARM_DELTA_C`` (up, then back down): changes the agent reports, below every threshold of the policy.
        """
        with self.lock:
            if event % 2 == 0:
                self.corrected[(event // 2) % len(self.corrected)] += 1
            else:
                self.warm = not self.warm
            self.latest.set(healthy_snapshot(self.index, corrected=self.corrected, warm=self.warm, mig=self.mig))
            return self.publisher.publish()

    def heartbeat(self) -> str | None:
        """The publisher's scheduled pass: renews the Lease when due, writes the report only if it changed.

        The bench starts every simulated agent at once; a real fleet's agents started at different times.
        The first pass stands in for this agent's own start (the driver spreads first passes over one
        interval), so it renews whatever the publisher's clock says; from then on the publisher decides.
        """
        with self.lock:
            if not self.primed:
                self.primed = True
                return self.renewer.renew(now_utc())
            return self.publisher.publish()

    def next_due(self, interval_s: float) -> float:
        """Monotonic time of this node's next renewal: one interval after its last (the agent's wait)."""
        return self.renewer.last_monotonic + interval_s + NEXT_PASS_SLACK_S

    def reboot(self) -> str | None:
        """The node was repaired and rebooted: a new agent, a new boot, an XID history without the fault."""
        with self.lock:
            self._boot(now_utc())
            return self.start()


def spread_offsets(count: int, interval_s: float) -> list[float]:
    """First-renewal offsets of ``count`` agents spread evenly over one heartbeat interval."""
    return [i * interval_s / count for i in range(count)] if count > 0 else []


def heartbeat_workers(count: int, interval_s: float, latency_s: float = 0.15, most: int = 48) -> int:
    """Passes in flight enough for ``count`` renewals per ``interval_s`` at ``latency_s`` each.

    The renewal rate is fixed by the fleet (N / interval); what a pool of W workers can deliver is
    W / latency. At 10,000 nodes and 30 s that is 333/s, which eight workers only reach below 24 ms a
    request: under load the API server answers slower, the fleet's Leases went stale and the nodes
    Unknown (docs/scaling.md). ``most`` is the sim client's connection pool."""
    if count <= 0 or interval_s <= 0:
        return 1
    return max(8, min(most, math.ceil(count / interval_s * latency_s)))


class Beating(Protocol):
    """What the heartbeat driver needs of a node: one publisher pass, and where to count failures."""

    stats: HeartbeatStats

    def heartbeat(self) -> str | None: ...

    def next_due(self, interval_s: float) -> float: ...


class HeartbeatDriver:
    """The fleet's publisher loops: each node's next pass is due one interval after its last one ended.

    That is the agent's own loop (wait ``last + interval - now``, publish). The nodes start spread
    evenly over one interval (:func:`spread_offsets`), so renewals arrive at about N / interval per
    second, as from N agents started at different times. Passes run on a small pool so one slow
    request does not hold the others back.
    """

    def __init__(self, sims: Sequence[Beating], interval_s: float, workers: int = 8) -> None:
        self.sims = sims
        self.interval_s = interval_s
        self.cond = threading.Condition()
        self.due: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="heartbeat")
        self.thread = threading.Thread(target=self._run, name="bench-heartbeats", daemon=True)

    def start(self) -> HeartbeatDriver:
        t0 = time.monotonic()
        with self.cond:
            self.due = [(t0 + off, i) for i, off in enumerate(spread_offsets(len(self.sims), self.interval_s))]
            heapq.heapify(self.due)
        self.thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        with self.cond:
            self.cond.notify_all()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            with self.cond:
                if not self.due:
                    self.cond.wait(1.0)
                    continue
                at, i = self.due[0]
                wait = at - time.monotonic()
                if wait > 0:
                    self.cond.wait(wait)
                    continue
                heapq.heappop(self.due)
            try:
                self.pool.submit(self._pass, i)
            except RuntimeError:
                return  # shut down

    def _pass(self, i: int) -> None:
        sim = self.sims[i]
        try:
            sim.heartbeat()
            # Due one interval after the node's last renewal, wherever it came from (a pass, a reboot).
            due = max(time.monotonic() + NEXT_PASS_SLACK_S, sim.next_due(self.interval_s))
        except Exception:
            sim.stats.failed()  # the publisher already retried for a minute; try again next interval
            due = time.monotonic() + self.interval_s
        with self.cond:
            heapq.heappush(self.due, (due, i))
            self.cond.notify_all()
