"""Wiring and lifecycle: builds the rooms, feeds the caches from watch events, runs the workers and
the sweeper, and starts and stops it all.

Kopf handlers (handlers.py) only call the ``on_*`` feeders and ``hold``/``release``; the feeders
update the store and queue the nodes an event may affect. Workers take one node at a time from a
de-duplicating queue and hand it to the node reconciler; the sweeper re-queues the nodes whose
verdict the clock alone may change, and updates policy statuses.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from gpuhealth.api.names import (
    API_VERSION,
    POLICY_KIND,
    POLICY_PLURAL,
    RELEASE_ANNOTATION,
    RELEASE_GPU_ANNOTATION,
    REPORT_PLURAL,
    State,
)
from gpuhealth.controller import metrics
from gpuhealth.controller.admission import AdmissionRoom, start_admission
from gpuhealth.controller.backoff import growing_delay
from gpuhealth.controller.breaker import Breaker
from gpuhealth.controller.device_drainer import DeviceDrainer
from gpuhealth.controller.device_reconciler import DeviceReconciler
from gpuhealth.controller.drainer import Drainer
from gpuhealth.controller.events import EventPoster
from gpuhealth.controller.leadership import Leadership
from gpuhealth.controller.leasewatch import LeaseWatch
from gpuhealth.controller.node_reconciler import NodeReconciler
from gpuhealth.controller.objectwatch import ObjectWatch
from gpuhealth.controller.podwatch import PodWatch
from gpuhealth.controller.policy_status import PolicyStatus
from gpuhealth.controller.remediator import Remediator
from gpuhealth.controller.report_gc import ReportCollector
from gpuhealth.controller.slicewatch import SliceWatch
from gpuhealth.controller.slim import slim_node, slim_pod, slim_report
from gpuhealth.controller.store import NODE_SELECTOR, Store
from gpuhealth.controller.workqueue import WorkQueue
from gpuhealth.evaluation import freshness
from gpuhealth.evaluation.rules import time_dependent
from gpuhealth.kube.client import KubePort, is_conflict, retryable

log = logging.getLogger(__name__)
T = TypeVar("T")

TIMED_FIRST = (State.RECOVERING, State.DRAINING)  # time-driven work queued ahead of the rest
COMMANDS = (RELEASE_ANNOTATION, RELEASE_GPU_ANNOTATION)  # what an SRE asks of a Node (kubectl gpuhealth release)


def _commands(node: Mapping[str, Any] | None) -> tuple[Any, ...]:
    annotations = ((node or {}).get("metadata") or {}).get("annotations") or {}
    return tuple(annotations.get(k) for k in COMMANDS)


def _replace(
    fresh: list[dict[str, Any]], cached: Mapping[str, Any], feed: Callable[[str, Mapping[str, Any]], None]
) -> None:
    """Feed a fresh full list as events: a DELETED for each cached name missing from it, then each item."""
    names = {o["metadata"]["name"] for o in fresh}
    for name in [n for n in cached if n not in names]:
        feed("DELETED", {"metadata": {"name": name}})
    for o in fresh:
        feed("MODIFIED", o)


RETRY_BASE_S, RETRY_MAX_S = 0.5, 30.0


class Runtime:
    def __init__(
        self,
        kube: KubePort,
        *,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        workers: int = 16,
        tick: float = 5.0,
        lease_namespace: str = "",
        kueue: str = "off",
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.tick = tick
        self.workers = workers
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube")
        self.store = Store()
        self.queue = WorkQueue()
        self.events = EventPoster(kube.post_event)
        self.breaker = Breaker(self.store)
        self.drainer = Drainer(kube, self.call, self.events, self.queue_later, self.store, self.breaker, clock)
        # DRA ResourceSlices (which device each GPU is) for per-GPU quarantine; a slice change re-queues its node.
        self.slice_watch = SliceWatch(kube, on_change=self._on_slice)
        self.devices = DeviceReconciler(
            kube, self.call, self.store, self.breaker, self.slice_watch.cache, self.events, clock
        )
        self.device_drainer = DeviceDrainer(kube, self.call, self.store, self.drainer, self.events, self.queue_later)
        self.reconciler = NodeReconciler(
            kube,
            self.call,
            self.store,
            self.breaker,
            self.drainer,
            self.events,
            clock,
            self.devices,
            self.device_drainer,
            self.queue_later,
            Remediator(kube, self.call, self.store, self.events, self.queue_later),
        )
        self.policy_status = PolicyStatus(kube, self.call, self.store, self.events, clock)
        self.reports_gc = ReportCollector(kube, self.call, self.store)
        self.leadership = Leadership(self._resync)
        self.pod_watch = PodWatch(kube, slim_pod, self.on_pod, self.replace_pods)
        # The fleet itself: GPU Nodes (selected server-side) and the agents' reports, slimmed as they arrive.
        self.node_watch = ObjectWatch(
            "nodes",
            lambda slim: kube.list_nodes_rv(NODE_SELECTOR, slim),
            lambda rv, timeout: kube.watch_nodes(NODE_SELECTOR, rv, timeout),
            slim_node,
            self.on_node,
            self.replace_nodes,
        )
        self.report_watch = ObjectWatch(
            "reports",
            lambda slim: kube.list_custom_rv(REPORT_PLURAL, slim),
            lambda rv, timeout: kube.watch_custom(REPORT_PLURAL, rv, timeout),
            slim_report,
            self.on_report,
            self.replace_reports,
        )
        self._fleet_listed = False
        # The agents' heartbeats (node Leases), where the agents run; none: reports carry them.
        self.lease_watch = (
            LeaseWatch(kube, lease_namespace, self.on_lease, self.replace_leases) if lease_namespace else None
        )
        self._leases_listed = False
        # Kueue (optional): gpuhealth as an AdmissionCheck controller (controller/admission.py).
        self.kueue_mode = kueue
        self.admission: AdmissionRoom | None = None
        self.ready = asyncio.Event()
        self._pods_listed = False
        self._tasks: list[asyncio.Task[None]] = []
        self._failures: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run one blocking API call on the kube thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def queue_later(self, name: str, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.queue.add, name)

    # -- leadership (Kopf's ``acting`` daemon) ----------------------------------------------------

    @property
    def active(self) -> asyncio.Event:
        return self.leadership.active

    def hold(self) -> None:
        self.leadership.hold()

    def release(self) -> None:
        self.leadership.release()

    async def _resync(self) -> None:
        """After a pause, forget cached records and re-read everything another replica may have changed.

        Pods are not re-read: the pod watch runs whether or not this replica acts, so they are current.
        """
        self.store.forget_records()
        self.breaker.clear()
        self.policy_status.forget()
        await self._load()
        log.info("resynced after a pause")

    # -- lifecycle -------------------------------------------------------------------------------

    async def _load(self) -> None:
        self.leadership.loaded()
        # Slimmed page by page, as the cache would slim them: the full bodies of a 10,000-node fleet
        # and its reports are never all held at once on top of the caches (docs/scaling.md). The first
        # list is the watches' own (they continue from its resourceVersion); a resync lists again for
        # the records another replica wrote, while the watches go on.
        first = not self._fleet_listed
        nodes, reports, policies = await asyncio.gather(
            self.call(self.node_watch.list) if first else self.call(self.kube.list_nodes, NODE_SELECTOR, slim_node),
            self.call(self.report_watch.list)
            if first
            else self.call(self.kube.list_custom, REPORT_PLURAL, slim_report),
            self.call(self.kube.list_custom, POLICY_PLURAL),
        )
        self._fleet_listed = True
        if not self._pods_listed:
            for pod in await self.call(self.pod_watch.list):
                self.on_pod("ADDED", pod, enqueue=False)
            self._pods_listed = True
        if self.lease_watch is not None and not self._leases_listed:
            for lease in await self.call(self.lease_watch.list):
                self.on_lease("ADDED", lease, live=False)
            self._leases_listed = True
        await self.devices.load_rules()
        for p in policies:
            self.on_policy("ADDED", p, enqueue=False)
        for r in reports:
            self.on_report("ADDED", r, enqueue=False)
        for n in nodes:
            self.on_node("ADDED", n, enqueue=False)
        for name in [*self.store.nodes, *self.reports_gc.suspect_orphans()]:
            self.queue.add(name)

    async def start(self) -> None:
        """Prime the caches with a full list, so the breaker counts every node before any decision."""
        await self._load()
        self.pod_watch.start(asyncio.get_running_loop())
        self.node_watch.start(asyncio.get_running_loop())
        self.report_watch.start(asyncio.get_running_loop())
        if self.lease_watch is not None:
            self.lease_watch.start(asyncio.get_running_loop())
        self._loop = asyncio.get_running_loop()
        self.slice_watch.start()
        # Kueue's Workloads are known before the first drain pass: none of their pods is evicted.
        args = (self.kube, self.call, self.store, self.events, self.active, self.clock)
        self.admission = await start_admission(self.kueue_mode, *args)
        self.drainer.mover = self.admission
        self._tasks = [asyncio.create_task(self._worker(i)) for i in range(self.workers)]
        self._tasks.append(asyncio.create_task(self._sweeper()))
        self.ready.set()
        log.info(
            "watching %d GPU nodes, %d reports, %d policies",
            len(self.store.nodes),
            len(self.store.reports),
            len(self.store.policy_objs),
        )

    async def stop(self) -> None:
        self.pod_watch.stop()
        self.node_watch.stop()
        self.report_watch.stop()
        if self.lease_watch is not None:
            self.lease_watch.stop()
        self.slice_watch.stop()
        if self.admission is not None:
            await self.admission.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.events.flush()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.events.close()

    # -- cache feeders (the watches; policies through Kopf's handlers) -----------------------------

    def on_node(self, event: str | None, body: Mapping[str, Any], enqueue: bool = True) -> None:
        name = body["metadata"]["name"]
        if event == "DELETED":
            self.store.forget_node(name)
            self.store.renewed.pop(name, None)
            self.reports_gc.suspect(name)
            if enqueue:
                self.queue.add(name)  # the worker deletes its report if the Node is really gone
            return
        # A release an SRE just asked for goes ahead of the fleet's backlog, as an agent's new facts do.
        asked = _commands(body) != _commands(self.store.nodes.get(name))
        self.store.put_node(name, body)
        self.store.first_seen.setdefault(name, self.clock())
        if enqueue:
            self.queue.add(name, urgent=asked)

    def on_report(self, event: str | None, body: Mapping[str, Any], enqueue: bool = True) -> None:
        name = body["metadata"]["name"]
        news = False
        if event == "DELETED":
            self.store.drop_report(name)
        else:
            news = self._heard(name, body, live=enqueue)
            self.store.put_report(name, body)
        if enqueue:
            self.queue.add(name, urgent=news)  # the agent's new facts go ahead of the fleet's backlog

    def _heard(self, name: str, body: Mapping[str, Any], live: bool) -> bool:
        """Note a sign of life from the agent (a new spec write), by our clock; flag a skewed one.

        Returns whether it was one (not our own status write echoed, nor the same object again)."""
        prior = self.store.seen.get(name)
        seen, skew = freshness.observe(prior, body, self.clock(), live)
        if seen is None:
            self.store.seen.pop(name, None)
        else:
            self.store.seen[name] = seen
        if skew is not None:
            metrics.INVALID_INPUT.labels("ClockSkew").inc()
            log.warning("report %s: %s", name, skew.describe())
            self.events("Node", name, name, "Warning", "ClockSkew", skew.describe())
        return seen is not None and seen is not prior

    def on_lease(self, event: str | None, lease: Mapping[str, Any], live: bool = True) -> None:
        """An agent's node Lease renewed: a sign of life, by our clock. It costs no reconcile and no
        write, except where a sign of life can change the verdict (Unknown, or no verdict yet)."""
        name = str((lease.get("metadata") or {}).get("name") or "")
        if not name or event == "DELETED":
            return  # the last renewal still happened; the agent recreates its Lease on the next beat
        prior = self.store.renewed.get(name)
        seen = freshness.observe_lease(prior, lease, self.clock(), live)
        if seen is None or seen is prior:
            return
        self.store.renewed[name] = seen
        if not live:
            return
        metrics.LEASE_RENEWALS.inc()
        rec = self.store.records.get(name)
        if name in self.store.nodes and (rec is None or rec.state == State.UNKNOWN):
            metrics.LEASE_RECONCILES.inc()
            self.queue.add(name)

    def replace_leases(self, leases: list[dict[str, Any]]) -> None:
        """A fresh full list (the watch expired): renewals missed meanwhile count from the server's time of
        them (``freshness.observe_lease``), not from the agent's renewTime."""
        for lease in leases:
            self.on_lease("MODIFIED", lease, live=False)

    def on_pod(self, event: str | None, body: Mapping[str, Any], enqueue: bool = True) -> None:
        """Pods by node, gang and workload: what drains and restart-loop detection need."""
        nodes = self.store.put_pod(body, deleted=event == "DELETED")
        if nodes is None or not enqueue:
            return
        for n in set(nodes):
            if n in self.store.nodes:
                self.queue.add(n)
        for n in self.breaker.drains():
            self.queue.add(n)

    def _on_slice(self, pool: str) -> None:
        """From the slice watch's thread: a node's devices changed (``""``: all of them, after a list)."""
        loop = self._loop
        if loop is None:
            return
        names = [pool] if pool else list(self.store.nodes)
        for n in names:
            if n in self.store.nodes:
                loop.call_soon_threadsafe(self.queue.add, n)

    def replace_nodes(self, nodes: list[dict[str, Any]]) -> None:
        """A fresh full list (the watch expired): Nodes missing from it were deleted meanwhile."""
        _replace(nodes, self.store.nodes, self.on_node)

    def replace_reports(self, reports: list[dict[str, Any]]) -> None:
        """A fresh full list (the watch expired): reports missing from it were deleted meanwhile."""
        _replace(reports, self.store.reports, self.on_report)

    def replace_pods(self, pods: list[dict[str, Any]]) -> None:
        """A fresh full list (the watch expired): pods missing from it are gone."""
        fresh = {p["metadata"].get("uid") for p in pods}
        for uid, (node, _, _) in list(self.store.pod_index.items()):
            if uid not in fresh:
                self.on_pod("DELETED", {"metadata": {"uid": uid}, "spec": {"nodeName": node}})
        for p in pods:
            self.on_pod("MODIFIED", p)

    def on_policy(self, event: str | None, body: Mapping[str, Any], enqueue: bool = True) -> None:
        name = body["metadata"]["name"]
        error = self.store.put_policy(name, None if event == "DELETED" else body)
        if error is not None:
            metrics.INVALID_INPUT.labels("GPUHealthPolicy").inc()
            log.warning("policy %s refused: %s", name, error)
            uid = body["metadata"].get("uid", name)
            self.events(
                POLICY_KIND,
                name,
                uid,
                "Warning",
                "InvalidPolicy",
                f"The operator will not act on this policy: {error}",
                API_VERSION,
            )
        if enqueue:
            for n in self.store.nodes:
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
                if name in self.store.nodes:
                    metrics.RECONCILES.inc()
                    await self.reconciler.reconcile(name)
                else:
                    await self.reports_gc.collect(name)
                self._failures.pop(name, None)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                # Growing delays per node (throttling, an API away): never a tight retry loop.
                n = self._failures[name] = self._failures.get(name, 0) + 1
                delay = growing_delay(n, RETRY_BASE_S, RETRY_MAX_S)
                metrics.RECONCILE_ERRORS.inc()
                if retryable(e) or is_conflict(e):
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
                if self.leadership.resync_needed:
                    await self.leadership.resync()
                self.sweep()
                await self.policy_status.update()
                await self.devices.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sweep failed")

    def sweep(self) -> None:
        """Queue the nodes whose verdict the clock alone may change."""
        now = self.clock()
        store = self.store
        for name in list(store.nodes):
            report = store.reports.get(name)
            pname = str(((report or {}).get("status") or {}).get("policy") or "")
            rec = store.records.get(name)
            if time_dependent(rec, report, store.policies.get(pname), now, store.heard(name)):
                # A probation's end returns capacity and a drain's deadline finishes a quarantine:
                # both go ahead of a backlog such as thousands of silent nodes (docs/scaling.md).
                self.queue.add(name, urgent=rec is not None and rec.state in TIMED_FIRST)
