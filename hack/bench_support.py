"""Building blocks of `make bench` (see hack/bench.py): the simulated fleet, the independent watches,
the process samplers and the audit-log counter.

The simulated agents publish through the agent's own code (``Publisher`` over ``KubeTransport`` with a
``ReportBuilder``): only the device source is simulated, so every report write is the merge patch the
real agent would send.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import heapq
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil
from kubernetes import client, config
from kubernetes.watch.watch import iter_resp_lines

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
from gpuhealth.agent.publisher import KubeTransport, LatestSnapshot, Publisher
from gpuhealth.agent.report import AgentInfo, ReportBuilder, now_utc
from gpuhealth.agent.runner import agent_version

GROUP, VERSION, REPORTS = "gpuhealth.dev", "v1alpha1", "gpunodehealths"
TAINT = "gpuhealth.dev/unhealthy"
FLOOR_TAINT = "bench.gpuhealth.dev/floor"
GPU_SELECTOR = "nvidia.com/gpu.present=true"
LEASE_NAMESPACE = "gpuhealth-system"  # where the operator (OperatorProcess) watches the agents' Leases
# A pass is due a little after the publisher's own clock says so (it stamps a renewal just after ours).
NEXT_PASS_SLACK_S = 0.01
DRA_GROUP, DRA_VERSION, DEVICE_TAINT_RULES = "resource.k8s.io", "v1", "devicetaintrules"
MERGE = "application/merge-patch+json"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def api_client(kubeconfig: Path, pool: int = 16) -> client.ApiClient:
    """An ApiClient whose connection pool is large enough for ``pool`` concurrent threads."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(cfg)


# -- the simulated fleet ---------------------------------------------------------------------------


def gpu_uuid(node_index: int, gpu: int) -> str:
    return f"GPU-{node_index:08x}-{gpu:04x}-4000-8000-{node_index * 8 + gpu:012x}"


def healthy_snapshot(node_index: int, gpus: int = 8) -> Snapshot:
    """What a healthy 8x H100 node looks like to the sampler."""
    devices = tuple(
        DeviceFacts(
            index=i,
            uuid=gpu_uuid(node_index, i),
            pci_bus_id=f"00000000:{0x18 + i * 0x10:02X}:00.0",
            model="NVIDIA H100 80GB HBM3",
            mig_mode="Disabled",
            ecc_mode="Enabled",
            ecc=EccCounts(0, 0, 0, 0),
            retired_pages=RetiredPages(0, 0, False),
            remapped_rows=RemappedRows(0, 0, False, False),
            temperature=Temperature(44 + i % 4, 90, 95),
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


def ecc_snapshot(node_index: int, gpu: int, gpus: int = 8) -> Snapshot:
    """The healthy node with one uncorrected (volatile) ECC error on ``gpu``: a device-scoped fault."""
    snap = healthy_snapshot(node_index, gpus)
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
    ) -> None:
        self.name = name
        self.index = index
        self.transport = KubeTransport(api)
        self.heartbeat_s = heartbeat_s
        self.stats = stats or HeartbeatStats()
        self.lease = NodeLease(KubeLeaseTransport(api), LEASE_NAMESPACE, name, heartbeat_s)
        # One counter across boots: it knows when this node last renewed, as the agent's loop does.
        self.renewer = CountingLease(self.lease, self.stats)
        self.primed = False
        self.lock = threading.RLock()
        self._boot(now_utc() - dt.timedelta(hours=1))

    def _boot(self, boot_time: dt.datetime) -> None:
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
            lease=self.renewer,
        )
        self.publisher.give_up_after_s = 60.0

    def start(self) -> str | None:
        """What the agent does at start: read the existing report, sample, write (create or patch)."""
        with self.lock:
            self.publisher.restore()
            self.latest.set(healthy_snapshot(self.index))
            return self.publisher.publish()

    def fault(self, xid: int = 79, gpu: int = 3) -> str | None:
        """The XID enters the source (the event thread's hand-off) and the publisher writes it at once."""
        with self.lock:
            event = XidEvent(xid=xid, time=now_utc(), source="simulated", gpu=gpu, uuid=gpu_uuid(self.index, gpu))
            self.xids.put(event)
            return self.publisher.publish()

    def device_fault(self, gpu: int = 3) -> str | None:
        """A sample with an uncorrected ECC error on ``gpu`` (device scope), written at once."""
        with self.lock:
            self.latest.set(ecc_snapshot(self.index, gpu))
            return self.publisher.publish()

    def device_clear(self) -> str | None:
        """The GPU was reset: the next sample is clean again."""
        with self.lock:
            self.latest.set(healthy_snapshot(self.index))
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


def rate(mark_from: tuple[float, int], mark_to: tuple[float, int]) -> float | None:
    """Events per second between two (time, count) marks; None over an empty window."""
    span = mark_to[0] - mark_from[0]
    return (mark_to[1] - mark_from[1]) / span if span > 0 else None


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


# -- watches ----------------------------------------------------------------------------------------


def _raw_watch(
    list_fn: Callable[..., Any],
    on_sync: Callable[[list[dict[str, Any]]], None],
    on_event: Callable[[str, dict[str, Any]], None],
    stop: threading.Event,
    **kwargs: Any,
) -> None:
    """List then watch, raw JSON (no model deserialisation), relisting on any error."""
    while not stop.is_set():
        try:
            data = json.loads(list_fn(_preload_content=False, **kwargs).data)
            rv = data["metadata"]["resourceVersion"]
            on_sync(data.get("items") or [])
            while not stop.is_set():
                resp = list_fn(
                    watch=True,
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=20,
                    _preload_content=False,
                    _request_timeout=(5, 60),
                    **kwargs,
                )
                try:
                    for line in iter_resp_lines(resp):
                        ev = json.loads(line)
                        if ev["type"] == "ERROR":
                            raise RuntimeError(f"watch error: {ev.get('object')}")
                        obj = ev["object"]
                        rv = obj["metadata"]["resourceVersion"]
                        if ev["type"] != "BOOKMARK":
                            on_event(ev["type"], obj)
                        if stop.is_set():
                            return
                finally:
                    resp.release_conn()
        except Exception:
            if stop.is_set():
                return
            time.sleep(0.5)


class NodeWatch:
    """An independent watch on the GPU Nodes: which taint keys each node carries, and since when."""

    def __init__(self, api: client.ApiClient, keys: Iterable[str] = (TAINT, FLOOR_TAINT)) -> None:
        self.core = client.CoreV1Api(api)
        self.keys = frozenset(keys)
        self.cond = threading.Condition()
        self.taints: dict[str, frozenset[str]] = {}
        self.seen_at: dict[tuple[str, str], float] = {}
        self.count: dict[str, int] = dict.fromkeys(self.keys, 0)
        self.curve: dict[str, list[tuple[float, int]]] = {k: [] for k in self.keys}
        self.synced = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-node-watch", daemon=True)

    def start(self) -> NodeWatch:
        self.thread.start()
        if not self.synced.wait(60):
            raise RuntimeError("node watch did not sync in 60s")
        return self

    def _run(self) -> None:
        _raw_watch(self.core.list_node, self._sync, self._event, self.stop, label_selector=GPU_SELECTOR)

    def _keys_of(self, obj: dict[str, Any]) -> frozenset[str]:
        return frozenset(t.get("key") for t in (obj.get("spec") or {}).get("taints") or []) & self.keys

    def _set(self, name: str, keys: frozenset[str], now: float) -> None:
        old = self.taints.get(name, frozenset())
        if old == keys:
            return
        self.taints[name] = keys
        for k in keys - old:
            self.seen_at[(name, k)] = now
            self.count[k] += 1
            self.curve[k].append((now, self.count[k]))
        for k in old - keys:
            self.seen_at.pop((name, k), None)
            self.count[k] -= 1
            self.curve[k].append((now, self.count[k]))

    def _sync(self, items: list[dict[str, Any]]) -> None:
        now = time.time()
        with self.cond:
            names = set()
            for obj in items:
                name = obj["metadata"]["name"]
                names.add(name)
                self._set(name, self._keys_of(obj), now)
            for name in set(self.taints) - names:
                self._set(name, frozenset(), now)
            self.cond.notify_all()
        self.synced.set()

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.time()
        with self.cond:
            name = obj["metadata"]["name"]
            self._set(name, frozenset() if kind == "DELETED" else self._keys_of(obj), now)
            self.cond.notify_all()

    def wait_taint(self, node: str, key: str, timeout: float) -> float | None:
        """When the watch first saw ``key`` on ``node`` (epoch seconds), or None after ``timeout``."""
        with self.cond:
            self.cond.wait_for(lambda: (node, key) in self.seen_at, timeout)
            return self.seen_at.get((node, key))

    def wait_all(self, nodes: Iterable[str], key: str, timeout: float, present: bool = True) -> bool:
        names = list(nodes)
        with self.cond:
            return self.cond.wait_for(lambda: all(((n, key) in self.seen_at) == present for n in names), timeout)

    def tainted(self, key: str = TAINT) -> int:
        with self.cond:
            return self.count[key]


class RuleWatch:
    """An independent watch on ``resource.k8s.io/v1`` DeviceTaintRules: since when each device has one.

    A device is ``(pool, device)`` from the rule's ``spec.deviceSelector`` (pool = node name in the
    NVIDIA model), whoever wrote the rule; the bench compares nothing but presence and time.
    """

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.cond = threading.Condition()
        self.rules: dict[str, tuple[str, str]] = {}
        self.seen_at: dict[tuple[str, str], float] = {}
        self.synced = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-rule-watch", daemon=True)

    def start(self) -> RuleWatch:
        self.thread.start()
        if not self.synced.wait(60):
            raise RuntimeError("DeviceTaintRule watch did not sync in 60s")
        return self

    def _run(self) -> None:
        _raw_watch(
            lambda **kw: self.custom.list_cluster_custom_object(DRA_GROUP, DRA_VERSION, DEVICE_TAINT_RULES, **kw),
            self._sync,
            self._event,
            self.stop,
        )

    @staticmethod
    def _device(obj: dict[str, Any]) -> tuple[str, str]:
        sel = (obj.get("spec") or {}).get("deviceSelector") or {}
        return str(sel.get("pool") or ""), str(sel.get("device") or "")

    def _put(self, name: str, dev: tuple[str, str] | None, now: float) -> None:
        old = self.rules.pop(name, None)
        if old is not None and old not in self.rules.values():
            self.seen_at.pop(old, None)
        if dev is not None:
            self.rules[name] = dev
            self.seen_at.setdefault(dev, now)

    def _sync(self, items: list[dict[str, Any]]) -> None:
        now = time.time()
        with self.cond:
            names = {o["metadata"]["name"] for o in items}
            for name in set(self.rules) - names:
                self._put(name, None, now)
            for obj in items:
                self._put(obj["metadata"]["name"], self._device(obj), now)
            self.cond.notify_all()
        self.synced.set()

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.time()
        with self.cond:
            self._put(obj["metadata"]["name"], None if kind == "DELETED" else self._device(obj), now)
            self.cond.notify_all()

    def wait_rule(self, pool: str, device: str, timeout: float) -> float | None:
        """When the watch first saw a rule for the device (epoch seconds), or None after ``timeout``."""
        with self.cond:
            self.cond.wait_for(lambda: (pool, device) in self.seen_at, timeout)
            return self.seen_at.get((pool, device))

    def wait_all(self, devices: Iterable[tuple[str, str]], timeout: float, present: bool = True) -> bool:
        wanted = list(devices)
        with self.cond:
            return self.cond.wait_for(lambda: all((d in self.seen_at) == present for d in wanted), timeout)

    def count(self) -> int:
        with self.cond:
            return len(self.rules)


class ReportWatch:
    """A watch on the GPUNodeHealth objects: each node's verdict (status.state), plus the floor chain.

    The floor chain is the least any controller could do: on a report carrying an XID for an armed floor
    node, patch that Node with a taint, in one merge patch, from the watch thread itself.
    """

    def __init__(self, api: client.ApiClient, floor_api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.floor_core = client.CoreV1Api(floor_api)
        self.armed: set[str] = set()
        self.floor_errors = 0
        self.cond = threading.Condition()
        self.states: dict[str, str] = {}
        self.synced = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-report-watch", daemon=True)

    def start(self) -> ReportWatch:
        self.thread.start()
        if not self.synced.wait(60):
            raise RuntimeError("report watch did not sync in 60s")
        return self

    def _run(self) -> None:
        _raw_watch(
            lambda **kw: self.custom.list_cluster_custom_object(GROUP, VERSION, REPORTS, **kw),
            self._sync,
            self._event,
            self.stop,
        )

    def _floor(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if name in self.armed and (obj.get("spec") or {}).get("xidEvents"):
            self.armed.discard(name)
            try:
                self.floor_core.patch_node(
                    name,
                    {"spec": {"taints": [{"key": FLOOR_TAINT, "value": "XID79", "effect": "NoSchedule"}]}},
                    _content_type=MERGE,
                    _preload_content=False,
                )
            except Exception:
                self.floor_errors += 1

    def _sync(self, items: list[dict[str, Any]]) -> None:
        with self.cond:
            self.states = {o["metadata"]["name"]: str((o.get("status") or {}).get("state") or "") for o in items}
            self.cond.notify_all()
        self.synced.set()

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        if self.armed:
            self._floor(obj)
        with self.cond:
            name = obj["metadata"]["name"]
            if kind == "DELETED":
                self.states.pop(name, None)
            else:
                self.states[name] = str((obj.get("status") or {}).get("state") or "")
            self.cond.notify_all()

    def wait_states(self, nodes: Iterable[str], state: str, timeout: float) -> float | None:
        """Epoch seconds at which every node in ``nodes`` was seen in ``state``; None on timeout."""
        names = list(nodes)
        with self.cond:
            ok = self.cond.wait_for(lambda: all(self.states.get(n) == state for n in names), timeout)
            return time.time() if ok else None

    def count(self, nodes: Iterable[str], state: str) -> int:
        with self.cond:
            return sum(1 for n in nodes if self.states.get(n) == state)


# -- process sampling and logs -----------------------------------------------------------------------


@dataclass
class ProcSampler:
    """RSS of one process every ``period`` seconds, on a thread."""

    pid: int
    period: float = 0.25
    samples: list[tuple[float, int]] = field(default_factory=list)
    cpu_samples: list[tuple[float, float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> ProcSampler:
        self.proc = psutil.Process(self.pid)
        threading.Thread(target=self._run, name=f"bench-rss-{self.pid}", daemon=True).start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                now = time.time()
                self.samples.append((now, self.proc.memory_info().rss))
                self.cpu_samples.append((now, self.cpu_s()))
            except psutil.Error:
                return
            self.stop.wait(self.period)

    def cpu_s(self) -> float:
        t = self.proc.cpu_times()
        return float(t.user + t.system)

    @property
    def peak_rss(self) -> int:
        return max((r for _, r in self.samples), default=0)


_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def find_log_line(path: Path, pattern: str, timeout: float) -> tuple[float, str] | None:
    """Wait for a line matching ``pattern``; its logged time (epoch seconds) and the line."""
    rx = re.compile(pattern)
    deadline = time.monotonic() + timeout
    pos = 0
    buf = ""
    while time.monotonic() < deadline:
        with open(path, errors="replace") as f:
            f.seek(pos)
            chunk = f.read()
            pos = f.tell()
        buf += chunk
        *lines, buf = buf.split("\n")
        for line in lines:
            if rx.search(line):
                m = _LOG_TIME.match(line)
                when = time.time()
                if m:
                    when = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                return when, line
        time.sleep(0.05)
    return None


# -- the audit log -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditEntry:
    at: float
    verb: str
    resource: str
    subresource: str
    name: str
    code: int

    @property
    def write(self) -> bool:
        return self.verb in WRITE_VERBS


def audit_files(path: Path) -> list[Path]:
    """The audit log and its rotated predecessors (``audit-<time>.log``, rotated at 100 MB), oldest first."""
    rotated = sorted(path.parent.glob(f"{path.stem}-*{path.suffix}"))
    return [*rotated, *([path] if path.exists() else [])]


def read_audit(path: Path, user: str) -> Iterator[AuditEntry]:
    """The user's completed requests (stage ResponseComplete) from the API server's json audit logs."""
    for part in audit_files(path):
        yield from _read_audit_file(part, user)


def _read_audit_file(path: Path, user: str) -> Iterator[AuditEntry]:
    with open(path, errors="replace") as f:
        for line in f:
            if user not in line:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("stage") != "ResponseComplete" or (ev.get("user") or {}).get("username") != user:
                continue
            ref = ev.get("objectRef") or {}
            yield AuditEntry(
                at=dt.datetime.fromisoformat(ev["requestReceivedTimestamp"]).timestamp(),
                verb=str(ev.get("verb") or ""),
                resource=str(ref.get("resource") or ""),
                subresource=str(ref.get("subresource") or ""),
                name=str(ref.get("name") or ""),
                code=int((ev.get("responseStatus") or {}).get("code") or 0),
            )


def describe(entries: Iterable[AuditEntry]) -> dict[str, int]:
    """Counts by 'verb resource[/subresource]', for the report."""
    out: dict[str, int] = {}
    for e in entries:
        key = f"{e.verb} {e.resource}{'/' + e.subresource if e.subresource else ''}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, -(-len(s) * q // 100) - 1))
    return s[int(k)]


def latency_summary(samples_ms: list[float], timeouts: int, timeout_ms: float) -> dict[str, Any]:
    """p50/p90/p99/max of one-at-a-time latencies; a timed-out sample counts as the timeout (a lower bound)."""
    values = samples_ms + [timeout_ms] * timeouts
    return {
        "p50": round(percentile(values, 50), 1),
        "p90": round(percentile(values, 90), 1),
        "p99": round(percentile(values, 99), 1),
        "max": round(max(values, default=float("nan")), 1),
        "samples": len(values),
        "timeouts": timeouts,
    }


def steady_writes_per_hour(write_times: list[float], startup_s: float = 5.0) -> tuple[float | None, int]:
    """Writes per hour once started, and how many start-up writes were left out.

    An agent's start is a burst (the report created, its Lease patched: 404, then created); what it
    costs while nothing changes is the rate after that: (writes - 1) / (last - first) of the rest.
    """
    times = sorted(write_times)
    if not times:
        return None, 0
    startup = [t for t in times if t < times[0] + startup_s]
    steady = times[len(startup) :]
    span = steady[-1] - steady[0] if steady else 0.0
    return ((len(steady) - 1) / span * 3600 if span > 0 else None), len(startup)
