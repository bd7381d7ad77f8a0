"""Turns watched objects into decisions and decisions into idempotent, conflict-safe writes.

Kopf handlers only feed the caches and the work queue (handlers.py). Workers here reconcile one node
at a time: evaluate (pure), decide (pure), then write in an order that survives a kill at any line:

1. the GPUNodeHealth status (the decision, the write-ahead record), with a resourceVersion
   precondition so a decision is never based on a stale record;
2. the Node (taint, cordon, state label and the ownership annotation, in one patch, also with a
   resourceVersion precondition);
3. the Node's GPUHealthy condition, then Events.

A restarted operator re-reads everything, finds the record, and converges the Node to it; an action
Event is posted only by the write that changed the Node, so actions are never announced twice.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpuhealth.actions.kube import Kube, is_conflict, is_not_found, status_of
from gpuhealth.actions.nodes import Marks, plan_condition, plan_node
from gpuhealth.api.names import (
    API_VERSION,
    GPU_PRESENT_LABEL,
    GPU_RESOURCE,
    OUT_OF_SERVICE,
    POLICY_KIND,
    RELEASE_ANNOTATION,
    REPORT_KIND,
    Mode,
    Signal,
    State,
)
from gpuhealth.api.policy import Policy, PolicyError, parse_policy, select_policy
from gpuhealth.api.report import Report, ReportError, parse_report
from gpuhealth.api.timeutil import format_time, parse_time
from gpuhealth.catalog import xid as catalog
from gpuhealth.controller import capacity, metrics
from gpuhealth.controller.backoff import growing_delay
from gpuhealth.controller.drainer import Drainer
from gpuhealth.controller.podwatch import PodWatch
from gpuhealth.controller.workqueue import WorkQueue
from gpuhealth.drain import pods as P
from gpuhealth.drain.plan import plan_drain
from gpuhealth.evaluation.assess import THERMAL_REASONS, Assessment, NodeView, assess
from gpuhealth.evaluation.restarts import failure, restart_loop_finding
from gpuhealth.evaluation.transitions import Decision, Inputs, Record, decide

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_EVIDENCE = 16
NODE_SELECTOR = f"{GPU_PRESENT_LABEL}=true"


def _gpu_capacity(node: Mapping[str, Any]) -> int | None:
    cap = ((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE)
    try:
        return int(cap) if cap is not None else None
    except ValueError:
        return None


def _evidence(a: Assessment) -> list[dict[str, Any]]:
    out = []
    for f in a.actionable()[:MAX_EVIDENCE]:
        e: dict[str, Any] = {
            "signal": str(f.signal),
            "reason": f.reason,
            "action": str(f.action),
            "detail": f.detail,
        }
        if f.gpu is not None:
            e["gpu"] = f.gpu
        if f.uuid:
            e["uuid"] = f.uuid
        if f.code is not None:
            e["code"] = f.code
        if f.since:
            e["since"] = format_time(f.since)
        out.append(e)
    return out


class _Lists(Mapping[str, list[dict[str, Any]]]):
    """A read-only view of pods grouped by a key, as lists, built per key only when asked.

    Copying every group on each reconcile cost time proportional to all pods in the cluster.
    """

    def __init__(self, groups: Mapping[str, Mapping[str, dict[str, Any]]]) -> None:
        self._groups = groups

    def __getitem__(self, key: str) -> list[dict[str, Any]]:
        return list(self._groups[key].values())

    def __iter__(self) -> Iterator[str]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)


@dataclass
class PolicyView:
    """What the sweep learned about a policy, for its status."""

    nodes: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    overlaps: dict[str, int] = field(default_factory=dict)
    held: int = 0


_POD_META = (
    "name",
    "namespace",
    "uid",
    "labels",
    "annotations",
    "ownerReferences",
    "deletionTimestamp",
    "resourceVersion",
)


_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _slim_container(cs: Mapping[str, Any]) -> dict[str, Any]:
    """Restart count, exit codes and times, the waiting reason: what restart-loop detection reads."""
    out: dict[str, Any] = {"restartCount": cs.get("restartCount") or 0}
    for key in ("state", "lastState"):
        state = cs.get(key) or {}
        slim: dict[str, Any] = {}
        term = state.get("terminated")
        if term:
            slim["terminated"] = {f: term[f] for f in ("exitCode", "finishedAt") if f in term}
        if state.get("waiting"):
            slim["waiting"] = {"reason": state["waiting"].get("reason")}
        if slim:
            out[key] = slim
    return out


def _slim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    """Only what drains and restart-loop detection read: keeps memory flat with many pods."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    slim_meta = {k: meta[k] for k in _POD_META if k in meta}
    if _LAST_APPLIED in (meta.get("annotations") or {}):
        slim_meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k != _LAST_APPLIED}
    slim_status = {k: status[k] for k in ("phase", "startTime") if k in status}
    if "containerStatuses" in status:
        slim_status["containerStatuses"] = [_slim_container(cs) for cs in status["containerStatuses"] or []]
    return {"metadata": slim_meta, "spec": {"nodeName": spec.get("nodeName")}, "status": slim_status}


def _slim_node(body: Mapping[str, Any]) -> dict[str, Any]:
    """What taints, cordons, conditions and policy selection read: a real node's image list and
    managed fields are most of its size."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    return {
        "metadata": {k: v for k, v in meta.items() if k != "managedFields"},
        "spec": body.get("spec") or {},
        "status": {k: status[k] for k in ("capacity", "conditions") if k in status},
    }


def _slim_report(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


RESYNC_AFTER_S = 5.0
RETRY_BASE_S, RETRY_MAX_S = 0.5, 30.0
EVENT_RETRIES = 12  # about five minutes of growing delays


def _retryable(e: BaseException) -> bool:
    code = status_of(e)
    return code == 0 or code == 429 or code >= 500


def _newer(rv: object, than: str | None) -> bool:
    """resourceVersions are opaque, but etcd's are increasing integers; unknown forms count as newer."""
    if than is None:
        return True
    try:
        return int(str(rv)) > int(than)
    except ValueError:
        return True


def _current_drain(record: Mapping[str, Any], rec: Record) -> bool:
    """The drain record belongs to the current Draining episode (started at or after it began)."""
    started = parse_time(record.get("startedAt"))
    return started is None or rec.since is None or started >= rec.since - dt.timedelta(seconds=1)


def _drain_done(record: Mapping[str, Any], rec: Record) -> bool:
    return record.get("phase") == "Completed" and bool(record.get("startedAt")) and _current_drain(record, rec)


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        *,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        workers: int = 16,
        tick: float = 5.0,
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.tick = tick
        self.workers = workers
        self.nodes: dict[str, dict[str, Any]] = {}
        self.reports: dict[str, dict[str, Any]] = {}
        self.policies: dict[str, Policy] = {}
        self.policy_objs: dict[str, dict[str, Any]] = {}
        self.invalid_policies: dict[str, str] = {}
        self.records: dict[str, Record] = {}
        self.reserved: dict[str, set[str]] = {}
        self.policy_locks: dict[str, asyncio.Lock] = {}
        self.breaker_open: dict[str, bool] = {}
        self.policy_status_cache: dict[str, dict[str, Any]] = {}
        self.bad_report_versions: dict[str, str] = {}
        self.first_seen: dict[str, dt.datetime] = {}
        self.pods_by_node: dict[str, dict[str, dict[str, Any]]] = {}
        self.pods_by_gang: dict[str, dict[str, dict[str, Any]]] = {}
        self.pods_by_workload: dict[str, dict[str, dict[str, Any]]] = {}
        self.pod_index: dict[str, tuple[str, str | None, str]] = {}  # uid -> (node, gang, workload)
        self.active_drains: dict[str, set[str]] = {}
        self.drainer = Drainer(self)
        self.pod_watch = PodWatch(kube, _slim_pod, self.on_pod, self.replace_pods)
        self._pods_listed = False
        self.queue = WorkQueue()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube")
        self._tasks: list[asyncio.Task[None]] = []
        self.ready = asyncio.Event()
        # Set while this replica may act (see handlers.acting); cleared while Kopf peering pauses it.
        self.active = asyncio.Event()
        self._holders = 0
        self._resync_needed = False
        self._loaded_at = 0.0
        self._activation: asyncio.Task[None] | None = None
        self.written_rv: dict[str, str] = {}
        self._event_tasks: set[asyncio.Task[None]] = set()
        self._event_backoff = 0.0
        self._events_paused_until = 0.0
        self._governing: dict[str, tuple[Policy | None, list[Policy]]] = {}
        self.event_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="events")
        self._failures: dict[str, int] = {}

    # -- plumbing --------------------------------------------------------------------------------

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def hold(self) -> None:
        self._holders += 1
        if self._holders == 1:
            self._activation = asyncio.get_running_loop().create_task(self._activate())

    async def _activate(self) -> None:
        """Start acting; first re-read everything if our caches may be stale (a pause, or a late start)."""
        if self._resync_needed or time.monotonic() - self._loaded_at > RESYNC_AFTER_S:
            await self._resync()
        if self._holders > 0 and not self.active.is_set():
            self.active.set()
            log.info("acting (this replica leads)")

    def release(self) -> None:
        self._holders = max(0, self._holders - 1)
        if self._holders == 0:
            if self.active.is_set():
                log.info("paused: not acting until resumed")
            self.active.clear()
            self._resync_needed = True  # another replica may act meanwhile: our caches go stale

    async def _resync(self) -> None:
        """After a pause, forget cached records and re-read everything another replica may have changed.

        Pods are not re-read: the pod watch runs whether or not this replica acts, so they are current.
        """
        self._resync_needed = False
        self.records.clear()
        self.written_rv.clear()
        self.reserved.clear()
        self.active_drains.clear()
        await self._load()
        log.info("resynced after a pause")

    async def _load(self) -> None:
        self._loaded_at = time.monotonic()
        nodes, reports, policies = await asyncio.gather(
            self.call(self.kube.list_nodes, NODE_SELECTOR),
            self.call(self.kube.list_custom, "gpunodehealths"),
            self.call(self.kube.list_custom, "gpuhealthpolicies"),
        )
        if not self._pods_listed:
            for pod in await self.call(self.pod_watch.list):
                self.on_pod("ADDED", pod, enqueue=False)
            self._pods_listed = True
        for p in policies:
            self.on_policy("ADDED", p, enqueue=False)
        for r in reports:
            self.on_report("ADDED", r, enqueue=False)
        for n in nodes:
            self.on_node("ADDED", n, enqueue=False)
        for name in self.nodes:
            self.queue.add(name)

    async def start(self) -> None:
        """Prime the caches with a full list, so the breaker counts every node before any decision."""
        await self._load()
        self.pod_watch.start(asyncio.get_running_loop())
        self._tasks = [asyncio.create_task(self._worker(i)) for i in range(self.workers)]
        self._tasks.append(asyncio.create_task(self._sweeper()))
        self.ready.set()
        log.info(
            "watching %d GPU nodes, %d reports, %d policies",
            len(self.nodes),
            len(self.reports),
            len(self.policy_objs),
        )

    async def stop(self) -> None:
        self.pod_watch.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.flush_events()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.event_pool.shutdown(wait=False, cancel_futures=True)

    # -- cache feeders (called by Kopf handlers) ---------------------------------------------------

    def on_node(self, event: str | None, body: Mapping[str, Any], enqueue: bool = True) -> None:
        name = body["metadata"]["name"]
        if event == "DELETED":
            self.nodes.pop(name, None)
            self.records.pop(name, None)
            self._governing.pop(name, None)
            return
        self._store_node(name, body)
        self.first_seen.setdefault(name, self.clock())
        if enqueue:
            self.queue.add(name)

    def on_report(self, event: str | None, body: Mapping[str, Any], enqueue: bool = True) -> None:
        name = body["metadata"]["name"]
        if event == "DELETED":
            self.reports.pop(name, None)
        else:
            self.reports[name] = _slim_report(body)
            # Our own writes update the record at once; adopt a watched status only if it is newer than
            # our last write (another writer, e.g. a previous leader), never an older echo of it.
            if body.get("status") and (
                name not in self.records or _newer(body["metadata"].get("resourceVersion"), self.written_rv.get(name))
            ):
                self.records[name] = Record.from_status(dict(body["status"]))
        if enqueue:
            self.queue.add(name)

    def on_pod(self, event: str | None, body: Mapping[str, Any], enqueue: bool = True) -> None:
        """Pods by node, gang and workload: what drains and restart-loop detection need."""
        uid = body["metadata"].get("uid")
        if not uid:
            return
        old = self.pod_index.pop(uid, None)
        if old is not None:
            self.pods_by_node.get(old[0], {}).pop(uid, None)
            if old[1]:
                self.pods_by_gang.get(old[1], {}).pop(uid, None)
            self.pods_by_workload.get(old[2], {}).pop(uid, None)
        node = str((body.get("spec") or {}).get("nodeName") or "")
        if event != "DELETED":
            pod = _slim_pod(body)
            gang, workload = P.gang_key(pod), P.workload_key(pod)
            self.pod_index[uid] = (node, gang, workload)
            self.pods_by_node.setdefault(node, {})[uid] = pod
            if gang:
                self.pods_by_gang.setdefault(gang, {})[uid] = pod
            self.pods_by_workload.setdefault(workload, {})[uid] = pod
        if enqueue:
            for n in {node, old[0] if old else ""}:
                if n in self.nodes:
                    self.queue.add(n)
            for draining in self.active_drains.values():
                for n in draining:
                    self.queue.add(n)

    def _store_node(self, name: str, body: Mapping[str, Any]) -> None:
        """Cache a Node; which policy governs it is re-computed only when its labels change."""
        old = self.nodes.get(name)
        self.nodes[name] = _slim_node(body)
        if old is None or (old.get("metadata") or {}).get("labels") != (body.get("metadata") or {}).get("labels"):
            self._governing.pop(name, None)

    def replace_pods(self, pods: list[dict[str, Any]]) -> None:
        """A fresh full list (the watch expired): pods missing from it are gone."""
        fresh = {p["metadata"].get("uid") for p in pods}
        for uid, (node, _, _) in list(self.pod_index.items()):
            if uid not in fresh:
                self.on_pod("DELETED", {"metadata": {"uid": uid}, "spec": {"nodeName": node}})
        for p in pods:
            self.on_pod("MODIFIED", p)

    def queue_later(self, name: str, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.queue.add, name)

    def on_policy(self, event: str | None, body: Mapping[str, Any], enqueue: bool = True) -> None:
        name = body["metadata"]["name"]
        self._governing.clear()
        if event == "DELETED":
            self.policies.pop(name, None)
            self.policy_objs.pop(name, None)
            self.invalid_policies.pop(name, None)
        else:
            self.policy_objs[name] = dict(body)
            try:
                self.policies[name] = parse_policy(body)
                self.invalid_policies.pop(name, None)
            except PolicyError as e:
                self.policies.pop(name, None)
                if self.invalid_policies.get(name) != str(e):
                    self.invalid_policies[name] = str(e)
                    metrics.INVALID_INPUT.labels("GPUHealthPolicy").inc()
                    log.warning("policy %s refused: %s", name, e)
                    uid = body["metadata"].get("uid", name)
                    self._event(
                        POLICY_KIND,
                        name,
                        uid,
                        "Warning",
                        "InvalidPolicy",
                        f"The operator will not act on this policy: {e}",
                        API_VERSION,
                    )
        if enqueue:
            for n in self.nodes:
                self.queue.add(n)

    # -- workers ---------------------------------------------------------------------------------

    async def _worker(self, i: int) -> None:
        while True:
            await self.active.wait()
            name = await self.queue.get()
            if not self.active.is_set():
                self.queue.done(name)
                self.queue.add(name)
                continue
            try:
                await self.reconcile(name)
                self._failures.pop(name, None)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                # Growing delays per node (throttling, an API away): never a tight retry loop.
                n = self._failures[name] = self._failures.get(name, 0) + 1
                delay = growing_delay(n, RETRY_BASE_S, RETRY_MAX_S)
                metrics.RECONCILE_ERRORS.inc()
                if _retryable(e) or is_conflict(e):
                    log.warning("reconcile of %s failed (%s); retrying in %.1fs", name, e, delay)
                else:
                    log.exception("reconcile of %s failed; retrying in %.1fs", name, delay)
                self.queue_later(name, delay)
            finally:
                self.queue.done(name)

    async def _sweeper(self) -> None:
        """Time moves on without events: silence, probation, sustained heat; and policy status."""
        while True:
            await asyncio.sleep(self.tick)
            await self.active.wait()
            try:
                if self._resync_needed:
                    await self._resync()
                now = self.clock()
                for name in list(self.nodes):
                    if self._time_dependent(name, now):
                        self.queue.add(name)
                await self.update_policy_statuses()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sweep failed")

    def _time_dependent(self, name: str, now: dt.datetime) -> bool:
        """Whether the clock alone may change this node's verdict; everything else waits for an event.

        Checking this is cheap, so a sweep over a large idle fleet reconciles (and writes) nothing.
        """
        rec = self.records.get(name)
        report = self.reports.get(name)
        if rec is None or report is None:
            return True  # a new node, or one whose agent never reported: silence is measured by the clock
        if rec.state in (State.RECOVERING, State.DRAINING, State.DEGRADED) or rec.held_by_breaker:
            return True  # probation, drain deadlines and retries, breaker admission, app-XID windows
        status = report.get("status") or {}
        if status.get("pending"):
            return True  # sustained heat
        if rec.state == State.UNKNOWN:
            return False  # only a fresh report (an event) brings it back
        heartbeat = parse_time((report.get("spec") or {}).get("heartbeatTime"))
        policy = self.policies.get(str(status.get("policy") or ""))
        silence = policy.silence_after_s if policy else 0.0
        if heartbeat is None or (now - heartbeat).total_seconds() > silence:
            return True  # the agent went silent
        return any(
            (d.get("clockEventReasons") or 0) & THERMAL_REASONS for d in (report.get("spec") or {}).get("devices") or []
        )

    # -- the reconcile ---------------------------------------------------------------------------

    def governing(self, name: str) -> tuple[Policy | None, list[Policy]]:
        """The policy that governs a cached node (and those it overrides), memoized per node."""
        hit = self._governing.get(name)
        if hit is None:
            labels = ((self.nodes.get(name) or {}).get("metadata") or {}).get("labels") or {}
            hit = self._governing[name] = select_policy(list(self.policies.values()), labels)
        return hit

    def _parse(self, name: str, obj: Mapping[str, Any] | None) -> Report | None:
        if obj is None:
            return None
        try:
            return parse_report(obj)
        except ReportError as e:
            rv = str(obj["metadata"].get("resourceVersion"))
            if self.bad_report_versions.get(name) != rv:
                self.bad_report_versions[name] = rv
                metrics.INVALID_INPUT.labels("GPUNodeHealth").inc()
                log.warning("report %s ignored: %s", name, e)
                self._event(
                    "Node",
                    name,
                    name,
                    "Warning",
                    "InvalidReport",
                    f"The agent's report is unusable and was ignored (no action taken on it): {e}",
                )
            return None

    async def reconcile(self, name: str) -> None:
        for attempt in range(5):
            try:
                await self._reconcile_once(name)
                return
            except Exception as e:
                if is_conflict(e) and attempt < 4:
                    metrics.CONFLICTS.labels("reconcile").inc()
                    await self._refresh(name)
                    continue
                raise

    async def _refresh(self, name: str) -> None:
        try:
            self._store_node(name, await self.call(self.kube.get_node, name))
        except Exception as e:
            if is_not_found(e):
                self.nodes.pop(name, None)
                self._governing.pop(name, None)
            else:
                raise
        try:
            report = await self.call(self.kube.get_report, name)
            self.reports[name] = _slim_report(report)
            self.records[name] = Record.from_status(report.get("status"))
        except Exception as e:
            if not is_not_found(e):
                raise

    async def _reconcile_once(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            return
        policy, overridden = self.governing(name)
        if policy is None or policy.mode == Mode.PAUSED:
            return
        now = self.clock()
        report_obj = self.reports.get(name)
        if report_obj is None and (now - self.first_seen.get(name, now)).total_seconds() < policy.silence_after_s:
            return  # a new node's agent gets the silence period to send its first report
        report = self._parse(name, report_obj)
        status: Mapping[str, Any] = (report_obj or {}).get("status") or {}
        prior = self.records.get(name) or Record.from_status(dict(status))
        annotations = node["metadata"].get("annotations") or {}
        # A release is a Node write to acknowledge (the annotation is removed), so only Enforce acts on it.
        released = RELEASE_ANNOTATION in annotations and policy.mode == Mode.ENFORCE
        view = NodeView(name, node["metadata"].get("labels") or {}, _gpu_capacity(node))
        node_pods = list(self.pods_by_node.get(name, {}).values())
        loop = restart_loop_finding(policy, name, node_pods, _Lists(self.pods_by_workload), now)
        # A release acknowledges all evidence up to now, in this very evaluation.
        cleared = now if released else prior.cleared_before
        a = assess(policy, report, view, now, status.get("pending") or {}, cleared, (loop,) if loop else ())
        drain = status.get("drain") or {}
        inputs = Inputs(drain_complete=_drain_done(drain, prior), released=released)
        decision = decide(prior, a, policy, now, inputs)
        if decision.new_quarantine and not prior.out_of_service:
            decision = await self._admit(name, policy, prior, a, now, inputs, decision)
        try:
            await self._persist(name, policy, overridden, report_obj, decision, a, now)
            # The decision is announced right after it is recorded and before anything acts on it.
            await self._announce(name, policy, decision, a, now)
            if policy.mode == Mode.ENFORCE:
                await self._converge_node(name, policy, decision.record, a, now)
                await self._drain(name, policy, decision.record, a, now)
                if released:
                    await self.call(
                        self.kube.patch_node, name, {"metadata": {"annotations": {RELEASE_ANNOTATION: None}}}
                    )
        finally:
            self.reserved.get(policy.name, set()).discard(name)

    async def _drain(self, name: str, policy: Policy, rec: Record, a: Assessment, now: dt.datetime) -> None:
        """Drain while Draining; evict crash-looping pods from any quarantined node."""
        status = (self.reports.get(name) or {}).get("status") or {}
        record = status.get("drain") or {}
        active = self.active_drains.setdefault(policy.name, set())
        if rec.state != State.DRAINING:
            active.discard(name)
            if rec.state in OUT_OF_SERVICE:
                await self._evict_crashlooping(name, policy, now)
            if record and rec.state == State.HEALTHY:
                await self._write_drain(name, None)
            return
        if record and not _current_drain(record, rec):
            record = {}  # a previous episode's drain: start afresh
        if record.get("phase") == "Completed":
            active.discard(name)
            return
        if name not in active:
            lock = self.policy_locks.setdefault(policy.name, asyncio.Lock())
            async with lock:
                if len(active) >= policy.max_concurrent_drains:
                    if record.get("phase") != "Queued":
                        await self._write_drain(name, {"phase": "Queued"})
                        self._event(
                            "Node",
                            name,
                            name,
                            "Normal",
                            "DrainQueued",
                            f"Waiting for a drain slot (maxConcurrentDrains {policy.max_concurrent_drains})",
                        )
                    return
                active.add(name)
            if record.get("phase") == "Queued":
                record = {}
        fatal = any(
            f.signal in (Signal.GPU_LOST, Signal.NVML_UNAVAILABLE)
            or (
                f.signal == Signal.XID
                and f.code is not None
                and catalog.lookup(f.code).immediate_action == "REBOOT_NODE"
            )
            for f in a.findings
        )
        if not record.get("startedAt"):
            # Record the start before the first request, so a restart recognises this drain's requests.
            if status.get("drain"):
                await self._write_drain(name, None)  # a merge patch would keep a previous drain's pods
            record = {"phase": "Running", "startedAt": format_time(now), "fatal": fatal, "pods": {}}
            await self._write_drain(name, record)
        gangs = _Lists(self.pods_by_gang)
        plan = plan_drain(name, list(self.pods_by_node.get(name, {}).values()), gangs, policy.drain, fatal, record, now)
        new_record = await self.drainer.execute(name, plan, now)
        if plan.complete:
            active.discard(name)
            self.queue_later(name, 0.05)  # the state machine moves on with the completed drain
            self._event(
                "Node",
                name,
                name,
                "Normal",
                "DrainFinished",
                f"All {new_record.get('total', 0)} workload pods have left the node "
                f"({new_record.get('evicted', 0)} evicted)",
            )
        if new_record != record:
            await self._write_drain(name, new_record)
        if not plan.complete:
            self.queue_later(name, 1.0)

    async def _write_drain(self, name: str, record: Mapping[str, Any] | None) -> None:
        result = await self.call(
            self.kube.patch_report_status,
            name,
            {"status": {"drain": None}} if record is None else {"status": {"drain": dict(record)}},
        )
        self.reports[name] = _slim_report(result)
        self.written_rv[name] = str(result["metadata"].get("resourceVersion", ""))

    async def _evict_crashlooping(self, name: str, policy: Policy, now: dt.datetime) -> None:
        for pod in list(self.pods_by_node.get(name, {}).values()):
            if P.is_deleting(pod) or P.is_terminal(pod) or P.is_daemonset(pod):
                continue
            if pod["metadata"].get("namespace") in policy.drain.system_namespaces:
                continue
            f = failure(pod, now, policy.restart_loop_window_s)
            if f is None or f[0] < policy.restart_loop_min_restarts:
                continue
            meta = pod["metadata"]
            try:
                await self.call(self.kube.evict_pod, meta["namespace"], meta["name"], meta.get("uid"))
            except Exception as e:
                if status_of(e) in (404, 409, 429, 500):
                    continue
                raise
            meta["deletionTimestamp"] = format_time(now)
            self._event(
                "Node",
                name,
                name,
                "Normal",
                "EvictedCrashLooping",
                f"Evicted {P.key(pod)} (restarted {f[0]}x on this quarantined node) so its controller "
                "places it elsewhere",
            )

    async def _admit(
        self,
        name: str,
        policy: Policy,
        prior: Record,
        a: Assessment,
        now: dt.datetime,
        inputs: Inputs,
        d: Decision,
    ) -> Decision:
        """The circuit breaker: reserve a slot under the policy's lock, or hold the quarantine back."""
        lock = self.policy_locks.setdefault(policy.name, asyncio.Lock())
        async with lock:
            governed = [n for n in self.nodes if self.governing(n)[0] is policy]
            reserved = self.reserved.setdefault(policy.name, set())
            out = {n for n in governed if (r := self.records.get(n)) is not None and r.out_of_service} | reserved
            out.discard(name)
            if len(out) + 1 <= policy.breaker_limit(len(governed)):
                reserved.add(name)
                return d
        return decide(
            prior,
            a,
            policy,
            now,
            Inputs(breaker_allows=False, drain_complete=inputs.drain_complete, released=inputs.released),
        )

    def _status_body(
        self,
        policy: Policy,
        overridden: list[Policy],
        decision: Decision,
        a: Assessment,
    ) -> dict[str, Any]:
        body: dict[str, Any] = dict(decision.record.to_status())
        body.update(
            policy=policy.name,
            overriddenPolicies=[p.name for p in overridden] or None,
            dryRun=policy.mode == Mode.DRY_RUN or None,
            totalGPUs=a.total_gpus,
            healthyGPUs=a.healthy_gpus,
            lastXid=a.last_xid or None,
            evidence=_evidence(a) or None,
            pending=dict(a.pending) or None,
        )
        if decision.record.state == State.UNKNOWN:
            body["message"] = a.unknown_reason or body.get("message")
        return body

    async def _persist(
        self,
        name: str,
        policy: Policy,
        overridden: list[Policy],
        report_obj: Mapping[str, Any] | None,
        decision: Decision,
        a: Assessment,
        now: dt.datetime,
    ) -> None:
        prev: Mapping[str, Any] = (report_obj or {}).get("status") or {}
        body = self._status_body(policy, overridden, decision, a)
        changed = {k: v for k, v in body.items() if prev.get(k) != v and not (v is None and k not in prev)}
        if report_obj is None:
            # No agent report after the silence period: create a stub so the Unknown verdict has a home.
            try:
                report_obj = await self.call(
                    self.kube.create_report,
                    {
                        "apiVersion": API_VERSION,
                        "kind": REPORT_KIND,
                        "metadata": {"name": name},
                        "spec": {"nodeName": name},
                    },
                )
            except Exception as e:
                if status_of(e) != 409:
                    raise
                report_obj = await self.call(self.kube.get_report, name)
            self.reports[name] = _slim_report(report_obj)
            changed = body
        if not changed:
            self.records[name] = decision.record
            return
        patch = {
            "metadata": {"resourceVersion": report_obj["metadata"]["resourceVersion"]},
            "status": changed,
        }
        result = await self.call(self.kube.patch_report_status, name, patch)
        self.reports[name] = _slim_report(result)
        self.written_rv[name] = str(result["metadata"].get("resourceVersion", ""))
        self.records[name] = decision.record

    async def _converge_node(self, name: str, policy: Policy, rec: Record, a: Assessment, now: dt.datetime) -> None:
        node = self.nodes[name]
        quarantine = rec.state in OUT_OF_SERVICE
        top = a.top
        reason = rec.reason or (top.reason if top else "")
        marks = Marks(
            state=rec.state,
            quarantine=quarantine,
            reason=reason,
            effect=policy.taint_effect,
            cordon=policy.cordon,
            since=format_time(rec.since or now),
        )
        plan = plan_node(node, marks)
        if plan.patch is not None:
            updated = await self.call(self.kube.patch_node, name, plan.patch)
            self._store_node(name, updated)
            node = self.nodes[name]  # the cached copy, so the condition written below is reflected in it
            for act in plan.actions:
                metrics.ACTIONS.labels(act, reason, str(policy.mode)).inc()
            if "taint" in plan.actions and top is not None and top.since is not None:
                metrics.DETECTION_TO_ACTION.observe(max(0.0, (self.clock() - top.since).total_seconds()))
            await self._announce_node_actions(
                name, plan.actions, plan.lifted_by_others, plan.foreign_cordon, marks, rec
            )
        cond = plan_condition(node, rec.state, rec.reason, rec.message, format_time(now))
        if cond is not None:
            await self.call(self.kube.patch_node_status, name, cond)
            # Reflect our own write so the next reconcile does not repeat it before the watch catches up.
            conds = [c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") != "GPUHealthy"]
            node.setdefault("status", {})["conditions"] = [*conds, *cond["status"]["conditions"]]

    async def _announce_node_actions(
        self,
        name: str,
        actions: tuple[str, ...],
        lifted: tuple[str, ...],
        foreign_cordon: bool,
        marks: Marks,
        rec: Record,
    ) -> None:
        msgs = []
        if "taint" in actions:
            msgs.append(f"Tainted {marks.reason} ({marks.effect})")
        if "cordon" in actions:
            msgs.append("Cordoned")
        if foreign_cordon:
            msgs.append("Already cordoned by someone else: gpuhealth will leave that cordon in place")
        if "untaint" in actions:
            msgs.append("Removed gpuhealth's taint")
        if "uncordon" in actions:
            msgs.append("Uncordoned (gpuhealth's own cordon)")
        if msgs:
            self._event("Node", name, name, "Normal", "GPUHealthAction", "; ".join(msgs) + f". State: {rec.state}")
        for what in lifted:
            self._event(
                "Node",
                name,
                name,
                "Warning",
                "LiftedByOthers",
                f"Someone else removed gpuhealth's {what} while the node is {rec.state} ({rec.reason}); "
                "recorded, and not put back for this episode",
            )

    async def _announce(self, name: str, policy: Policy, d: Decision, a: Assessment, now: dt.datetime) -> None:
        dry = policy.mode == Mode.DRY_RUN
        if d.new_quarantine:
            for f in a.actionable():
                metrics.FAULTS.labels(str(f.signal), "" if f.code is None else str(f.code)).inc()
        for type_, reason, message in d.events:
            if dry:
                message = f"DryRun (policy {policy.name}): would act, no Node was changed. {message}"
                metrics.ACTIONS.labels(reason, d.record.reason or reason, "DryRun").inc()
            self._event("Node", name, name, type_, reason, message)

    def _event(
        self, kind: str, name: str, uid: str, type_: str, reason: str, message: str, api_version: str = "v1"
    ) -> None:
        """Post an Event without holding up the caller; it carries the time of the decision.

        Events go through their own small thread pool, so during a storm the Node writes that carry
        the actual protection are never queued behind the announcements. Throttling or an API that is
        away is retried in the background with growing delays: the record of an action is not dropped.
        """
        args = (kind, name, uid, type_, reason, message, api_version, dt.datetime.now(dt.UTC))
        task = asyncio.get_running_loop().create_task(self._post_event(args))
        self._event_tasks.add(task)
        task.add_done_callback(self._event_tasks.discard)

    async def _post_event(self, args: tuple[Any, ...]) -> None:
        """Post with retries; a throttled or absent API pauses *all* Events, growing while it lasts.

        Under throttling the API's write slots go to the Node and report writes that protect the fleet
        first; the announcements follow once the API takes requests again.
        """
        loop = asyncio.get_running_loop()
        for _ in range(EVENT_RETRIES + 1):
            pause = self._events_paused_until - loop.time()
            if pause > 0:
                await asyncio.sleep(pause)
            try:
                await loop.run_in_executor(self.event_pool, self.kube.post_event, *args)
                self._event_backoff = 0.0
                return
            except Exception as e:
                if not _retryable(e):
                    metrics.EVENTS_DROPPED.inc()
                    log.warning("could not post event %s on %s %s: %s", args[4], args[0], args[1], e)
                    return
                self._event_backoff = min(max(0.5, self._event_backoff * 2), 30.0)
                self._events_paused_until = max(self._events_paused_until, loop.time() + self._event_backoff)
        metrics.EVENTS_DROPPED.inc()
        log.warning("gave up posting event %s on %s %s", args[4], args[0], args[1])

    async def flush_events(self, timeout: float = 5.0) -> None:
        """On shutdown: give Events in flight a moment to land."""
        if self._event_tasks:
            await asyncio.wait(list(self._event_tasks), timeout=timeout)

    # -- policy status -----------------------------------------------------------------------------

    def summarize(self) -> dict[str, PolicyView]:
        views = {p: PolicyView() for p in self.policies}
        for name in self.nodes:
            winner, others = self.governing(name)
            if winner is None:
                continue
            v = views[winner.name]
            v.nodes += 1
            rec = self.records.get(name) or Record()
            v.counts[str(rec.state)] = v.counts.get(str(rec.state), 0) + 1
            if rec.held_by_breaker:
                v.held += 1
            for o in others:
                views[o.name].overlaps[winner.name] = views[o.name].overlaps.get(winner.name, 0) + 1
        return views

    async def update_policy_statuses(self) -> None:
        views = self.summarize()
        capacity.export_gpus_out_of_service(self.policies, self.nodes, self.records, self.governing)
        for pname, v in views.items():
            policy = self.policies[pname]
            limit = policy.breaker_limit(v.nodes)
            out = sum(v.counts.get(str(s), 0) for s in OUT_OF_SERVICE)
            is_open = v.held > 0
            for s in State:
                metrics.NODES.labels(pname, str(s)).set(v.counts.get(str(s), 0))
            metrics.BREAKER_OPEN.labels(pname).set(1 if is_open else 0)
            was_open = self.breaker_open.get(pname, False)
            self.breaker_open[pname] = is_open
            obj = self.policy_objs.get(pname, {})
            uid = obj.get("metadata", {}).get("uid", pname)
            if is_open != was_open:
                if is_open:
                    self._event(
                        POLICY_KIND,
                        pname,
                        uid,
                        "Warning",
                        "BreakerOpen",
                        f"{out} of {v.nodes} nodes are out of service (limit {limit}): holding back "
                        f"{v.held} more quarantines",
                        API_VERSION,
                    )
                else:
                    self._event(
                        POLICY_KIND,
                        pname,
                        uid,
                        "Normal",
                        "BreakerClosed",
                        f"Back under the limit ({out} of {v.nodes} out of service, limit {limit})",
                        API_VERSION,
                    )
            overlap_msg = ", ".join(f"{n} nodes governed by {w}" for w, n in sorted(v.overlaps.items()))
            status: dict[str, Any] = {
                "observedGeneration": policy.generation,
                "nodes": v.nodes,
                "healthy": v.counts.get("Healthy", 0),
                "degraded": v.counts.get("Degraded", 0),
                "quarantined": v.counts.get("Quarantined", 0),
                "draining": v.counts.get("Draining", 0),
                "awaitingRepair": v.counts.get("AwaitingRepair", 0),
                "recovering": v.counts.get("Recovering", 0),
                "unknown": v.counts.get("Unknown", 0),
                "breaker": "Open" if is_open else "Closed",
                "breakerLimit": limit,
                "outOfService": out,
                "heldBack": v.held,
                "overlaps": overlap_msg or None,
            }
            prev = self.policy_status_cache.get(pname)
            if prev is None:
                prev = {k: val for k, val in (obj.get("status") or {}).items() if k in status}
            if all(prev.get(k) == val for k, val in status.items()):
                self.policy_status_cache[pname] = status
                continue
            status["conditions"] = [
                {
                    "type": "BreakerOpen",
                    "status": "True" if is_open else "False",
                    "reason": "LimitReached" if is_open else "UnderLimit",
                    "message": f"{out}/{v.nodes} out of service, limit {limit}",
                    "lastTransitionTime": format_time(self.clock()),
                },
                {
                    "type": "Overlapping",
                    "status": "True" if overlap_msg else "False",
                    "reason": "LowerPriority" if overlap_msg else "NoOverlap",
                    "message": overlap_msg or "no node matches a higher-priority policy",
                    "lastTransitionTime": format_time(self.clock()),
                },
            ]
            try:
                await self.call(self.kube.patch_policy_status, pname, {"status": status})
                self.policy_status_cache[pname] = {k: v2 for k, v2 in status.items() if k != "conditions"}
            except Exception as e:
                if not is_not_found(e):
                    raise
