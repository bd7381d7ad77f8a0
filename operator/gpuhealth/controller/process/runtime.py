"""Wiring and lifecycle: builds the rooms, runs the workers and the sweeper, and starts and stops it all.

The watches (``objectwatch.py``, ``slicewatch.py``) and Kopf's policy handler (``handlers.py``) call
the cache feeders (``feeders.py``), which update the store and queue the nodes an event may affect;
Kopf's ``acting`` daemon calls ``hold``/``release``. Workers take one node at a time from a
de-duplicating queue and hand it to the node reconciler; the sweeper re-queues the nodes whose
verdict the clock alone may change, and updates policy statuses.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpuhealth.api.names import (
    GPU_NODE_SELECTOR,
    POLICY_PLURAL,
    REPORT_PLURAL,
    State,
)
from gpuhealth.controller import metrics
from gpuhealth.controller.act.admission import AdmissionRoom, start_admission
from gpuhealth.controller.act.device_drainer import DeviceDrainer
from gpuhealth.controller.act.device_reconciler import DeviceReconciler
from gpuhealth.controller.act.drainer import DRAIN_CONCURRENCY, Drainer
from gpuhealth.controller.act.events import EVENT_THREADS, EventPoster
from gpuhealth.controller.act.node_reconciler import NodeReconciler
from gpuhealth.controller.act.node_validator import NodeValidator
from gpuhealth.controller.act.policy_status import PolicyStatus
from gpuhealth.controller.act.remediator import Remediator
from gpuhealth.controller.act.report_gc import ReportCollector
from gpuhealth.controller.act.step_jobs import StepJobs
from gpuhealth.controller.backoff import growing_delay
from gpuhealth.controller.intake.feeders import Feeders
from gpuhealth.controller.intake.objectwatch import lease_watch, node_watch, pod_watch, report_watch
from gpuhealth.controller.intake.slicewatch import SliceWatch
from gpuhealth.controller.intake.workqueue import WorkQueue
from gpuhealth.controller.process.firstpass import FirstPass
from gpuhealth.controller.process.leadership import Leadership
from gpuhealth.controller.process.watchdog import Watchdog
from gpuhealth.controller.state.breaker import Breaker
from gpuhealth.controller.state.job_slots import JobSlots
from gpuhealth.controller.state.slim import slim_node, slim_report
from gpuhealth.controller.state.store import Store
from gpuhealth.drain.kueue import GPU_RESOURCES
from gpuhealth.evaluation.rules import time_dependent
from gpuhealth.kube.aio import AsyncKube
from gpuhealth.kube.client import KubePort, is_conflict, retryable

log = logging.getLogger(__name__)

TIMED_FIRST = (State.RECOVERING, State.DRAINING)  # time-driven work queued ahead of the rest
RETRY_BASE_S, RETRY_MAX_S = 0.5, 30.0
POD_BATCH = 1000  # pods cached from the start-up list between turns of the event loop
SWEEP_BATCH = 1000  # nodes the sweeper looks at between turns of the event loop
# Streams held open at once through the Kube port's client: the Nodes', reports', pods', Leases' and
# ResourceSlices' watches, Kueue's Workloads and AdmissionChecks, and one to spare.
WATCH_STREAMS = 8


def connections(workers: int, drain_concurrency: int) -> int:
    """The client's connection pool for a runtime of ``workers`` and ``drain_concurrency``: one for each
    thread that may hold a connection at once. A smaller pool discards a connection after each request
    beyond it and the next request opens a new one: every 10,000-node drain storm logged "Connection pool
    is full" with a pool of 32 under 16 workers and 32 drains (docs/bench.md)."""
    return workers + drain_concurrency + EVENT_THREADS + WATCH_STREAMS


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
        gpu_resources: Sequence[str] = GPU_RESOURCES,
        drain_concurrency: int = DRAIN_CONCURRENCY,
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.tick = tick
        self.workers = workers
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube")
        # Drains' checkpoint requests and evictions have a pool of their own: a drain storm's thousands
        # of pod writes never queue in front of the taint of the next fault (docs/bench.md, drain storm).
        self.drain_pool = ThreadPoolExecutor(max_workers=drain_concurrency, thread_name_prefix="drain")
        self.api = AsyncKube(kube, self.pool)  # the rooms' port (``kube/aio.py``)
        self.store = Store()
        self.queue = WorkQueue()
        self.events = EventPoster(kube.post_event)
        self.breaker = Breaker(self.store)
        self.drainer = Drainer(
            kube=self.api,
            events=self.events,
            store=self.store,
            breaker=self.breaker,
            clock=clock,
            steps=self.api.on(self.drain_pool),
            parallel=drain_concurrency,
        )
        # DRA ResourceSlices (which device each GPU is) for per-GPU quarantine; a slice change re-queues its node.
        self.slice_watch = SliceWatch(kube, on_change=self._on_slice)
        self.devices = DeviceReconciler(
            kube=self.api, store=self.store, slices=self.slice_watch.cache, events=self.events, clock=clock
        )
        self.device_drainer = DeviceDrainer(kube=self.api, store=self.store, drainer=self.drainer, events=self.events)
        # One admission and one door for the Jobs that repairs and node validations run.
        slots, jobs = JobSlots(self.store), StepJobs(self.api)
        self.reconciler = NodeReconciler(
            kube=self.api,
            store=self.store,
            breaker=self.breaker,
            drainer=self.drainer,
            events=self.events,
            clock=clock,
            devices=self.devices,
            device_drainer=self.device_drainer,
            remediator=Remediator(kube=self.api, store=self.store, events=self.events, slots=slots, jobs=jobs),
            validator=NodeValidator(kube=self.api, store=self.store, events=self.events, slots=slots, jobs=jobs),
        )
        self.policy_status = PolicyStatus(kube=self.api, store=self.store, events=self.events, clock=clock)
        self.reports_gc = ReportCollector(kube=self.api, store=self.store)
        self.leadership = Leadership()
        self._lead_task: asyncio.Task[None] | None = None
        self.feeders = Feeders(
            store=self.store,
            queue=self.queue,
            breaker=self.breaker,
            suspect_gone=self.reports_gc.suspect,
            events=self.events,
            clock=clock,
        )
        # The watches and Kopf's policy handler call these (tests too).
        self.on_node, self.on_report, self.on_pod = self.feeders.on_node, self.feeders.on_report, self.feeders.on_pod
        self.on_lease, self.on_policy = self.feeders.on_lease, self.feeders.on_policy
        self.replace_nodes, self.replace_reports = self.feeders.replace_nodes, self.feeders.replace_reports
        self.replace_pods, self.replace_leases = self.feeders.replace_pods, self.feeders.replace_leases
        # The fleet (GPU Nodes, the agents' reports), the scheduled pods and, where the agents run,
        # their heartbeat Leases (none: reports carry them), each slimmed as it arrives.
        self.node_watch = node_watch(kube, self.on_node, self.replace_nodes)
        self.report_watch = report_watch(kube, self.on_report, self.replace_reports)
        self.pod_watch = pod_watch(kube, self.on_pod, self.replace_pods)
        self.lease_watch = (
            lease_watch(kube, lease_namespace, self.on_lease, self.replace_leases) if lease_namespace else None
        )
        self._fleet_listed = self._leases_listed = False
        # Kueue (optional): gpuhealth as an AdmissionCheck controller (controller/act/admission.py).
        self.kueue_mode = kueue
        self.gpu_resources = tuple(gpu_resources)
        self.admission: AdmissionRoom | None = None
        self.ready = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._failures: dict[str, int] = {}
        self.watchdog = Watchdog()
        self.first_pass = FirstPass()
        self._loop: asyncio.AbstractEventLoop | None = None

    def queue_later(self, name: str, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.queue.add, name)

    # -- leadership (Kopf's ``acting`` daemon) ----------------------------------------------------

    @property
    def active(self) -> asyncio.Event:
        return self.leadership.active

    def hold(self) -> None:
        self.leadership.hold()
        if self._lead_task is None:
            self._lead_task = asyncio.get_running_loop().create_task(self._lead())

    async def _lead(self) -> None:
        """Each time this replica is held: resync first where a pause made the records stale, then act."""
        while True:
            if await self.leadership.wanted():
                await self._resync()
            self.leadership.act()  # not if released, or paused again during the resync: then wait again

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
        # Slimmed page by page, as the cache would slim them: the full bodies of a 10,000-node fleet
        # and its reports are never all held at once on top of the caches (docs/scaling.md). The first
        # list is the watches' own (they continue from its resourceVersion); a resync lists again for
        # the records another replica wrote, while the watches go on. The pods are not listed here:
        # ``_list_pods`` follows, so a restarted operator acts on a new fault without waiting for the
        # biggest list of all (80,000 pods at 10,000 nodes: docs/bench.md, warm restart).
        first = not self._fleet_listed
        leases_due = self.lease_watch is not None and not self._leases_listed
        # gpuhealth's DeviceTaintRules are listed together with the fleet, not after it: the reports'
        # list, the longest at 10,000 nodes, already decides when the first pass can begin.
        nodes, reports, policies, leases, _ = await asyncio.gather(
            self.api.run(self.node_watch.list)
            if first
            else self.api.run(self.kube.list_nodes, GPU_NODE_SELECTOR, slim_node),
            self.api.run(self.report_watch.list)
            if first
            else self.api.run(self.kube.list_custom, REPORT_PLURAL, slim_report),
            self.api.run(self.kube.list_custom, POLICY_PLURAL),
            self.api.run(self.lease_watch.list) if leases_due and self.lease_watch is not None else _nothing(),
            self.devices.load_rules(),
        )
        self._fleet_listed = True
        for lease in leases:
            self.on_lease("ADDED", lease, live=False)
        self._leases_listed = self._leases_listed or leases_due
        for p in policies:
            self.on_policy("ADDED", p, enqueue=False)
        for r in reports:
            self.on_report("ADDED", r, enqueue=False)
        for n in nodes:
            self.on_node("ADDED", n, enqueue=False)
        for name in [*self.store.freshest_first(), *self.reports_gc.suspect_orphans()]:
            self.queue.add(name)
        self.leadership.loaded()

    async def _list_pods(self) -> None:
        """The start-up pod list, once. Until it is in, a pass only takes out what holds nothing out
        yet (``evaluation/startup.py``): drains and restart-loop checks need the pods. Then every node
        is passed again with them."""
        started = time.monotonic()
        pods = await self.api.run(self.pod_watch.list)
        for i, pod in enumerate(pods, 1):
            self.on_pod("ADDED", pod, enqueue=False)
            if i % POD_BATCH == 0:
                await asyncio.sleep(0)  # 80,000 pods cached at once held the loop for 3.5 s (docs/bench.md)
        self.store.pods.listed()
        settle_heap()
        log.info("listed %d pods in %.1fs: drains and restart-loop checks begin", len(pods), time.monotonic() - started)
        self.first_pass.expect(self.store.nodes)
        for name in self.store.nodes:
            self.queue.add(name)

    async def _watch_pods(self) -> None:
        """List the pods (retried with growing delays), then watch them from that list. Not the watch's
        own first list: its result would be cached in one loop callback, or, cached in batches, have
        the watch's newer events land between the batches and be overwritten by the list's copies."""
        failures = 0
        while True:
            try:
                await self._list_pods()
                break
            except Exception as e:
                failures += 1
                delay = growing_delay(failures, RETRY_BASE_S, RETRY_MAX_S)
                log.warning("listing pods failed (%s); retrying in %.1fs", e, delay)
                await asyncio.sleep(delay)
        self.pod_watch.start(asyncio.get_running_loop())

    async def start(self) -> None:
        """Prime the caches with a full list, so the breaker counts every node before any decision;
        the pods follow in the background."""
        self.store.pods.expect()
        self.first_pass.start()
        started = time.monotonic()
        await self._load()
        listed = time.monotonic() - started
        self.node_watch.start(asyncio.get_running_loop())
        self.report_watch.start(asyncio.get_running_loop())
        if self.lease_watch is not None:
            self.lease_watch.start(asyncio.get_running_loop())
        self._loop = asyncio.get_running_loop()
        self.slice_watch.start()
        # Kueue's Workloads are known before the first drain pass: none of their pods is evicted.
        self.admission = await start_admission(
            self.kueue_mode,
            kube=self.api,
            store=self.store,
            events=self.events,
            active=self.active,
            clock=self.clock,
            gpu_resources=self.gpu_resources,
        )
        self.drainer.mover = self.admission
        self._tasks = [asyncio.create_task(self._worker(i)) for i in range(self.workers)]
        self._tasks.append(asyncio.create_task(self._sweeper()))
        self._tasks.append(asyncio.create_task(self.watchdog.run()))
        self._tasks.append(asyncio.create_task(self._watch_pods()))
        self.ready.set()
        log.info(
            "watching %d GPU nodes, %d reports, %d policies (listed in %.1fs); listing pods",
            len(self.store.nodes),
            len(self.store.reports),
            len(self.store.policy_objs),
            listed,
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
        tasks = [*self._tasks, *([self._lead_task] if self._lead_task is not None else [])]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.events.flush()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.drain_pool.shutdown(wait=False, cancel_futures=True)
        self.events.close()

    # -- slices ----------------------------------------------------------------------------------

    def _on_slice(self, pool: str) -> None:
        """From the slice watch's thread: a node's devices changed (``""``: all of them, after a list)."""
        loop = self._loop
        if loop is None:
            return
        names = [pool] if pool else list(self.store.nodes)
        for n in names:
            if n in self.store.nodes:
                loop.call_soon_threadsafe(self.queue.add, n)

    # -- workers ---------------------------------------------------------------------------------

    async def _worker(self, i: int) -> None:
        while True:
            await self.active.wait()
            name = await self.queue.get()
            if not self.active.is_set():
                self.queue.done(name)
                self.queue.add(name)
                continue
            self.watchdog.started(name)
            with_pods = not self.store.pods.pending  # only such a pass ends the start-up (``firstpass.py``)
            try:
                if name in self.store.nodes:
                    metrics.RECONCILES.inc()
                    again = await self.reconciler.reconcile(name)
                    if again is not None:  # the pass wants the node again (``controller/act/again.py``)
                        self.queue_later(name, again)
                else:
                    await self.reports_gc.collect(name)
                self._failures.pop(name, None)
                if with_pods:
                    self.first_pass.passed(name)
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
                self.watchdog.finished(name)
                self.queue.done(name)
            # A pass that writes nothing never waits, and neither does a queue with work in it: without
            # this, a fleet-wide backlog (every node at start-up) held the loop for 10 s at 10,000
            # nodes, and a new fault's report event waited behind all of it (docs/bench.md).
            await asyncio.sleep(0)

    async def _sweeper(self) -> None:
        """Time moves on without events: silence, probation, sustained heat; and policy status."""
        while True:
            await asyncio.sleep(self.tick)
            await self.active.wait()
            try:
                if self.leadership.take_resync():
                    await self._resync()
                for _ in self._sweep_steps():
                    await asyncio.sleep(0)  # a new fault's report event is not held behind the whole fleet
                await self.policy_status.update()
                await self.devices.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sweep failed")

    def sweep(self) -> None:
        """Queue the nodes whose verdict the clock alone may change."""
        for _ in self._sweep_steps():
            pass

    def _sweep_steps(self) -> Iterator[None]:
        """``sweep``, pausing after every ``SWEEP_BATCH`` nodes: at 10,000 nodes one sweep held the event
        loop for about 80 ms of CPU, at 100,000 it would hold it for most of a second every tick, with
        every watch event (a new fault's report among them) waiting (docs/scaling.md, the fleet probe)."""
        now = self.clock()
        store = self.store
        for k, name in enumerate(list(store.nodes), 1):
            if k % SWEEP_BATCH == 0:
                yield
            if name not in store.nodes:
                continue  # deleted while the sweep paused
            status = store.status(name)  # typed once per version of the report, shared with its pass
            rec = store.records.get(name)
            policy = store.policies.get(status.policy or "")
            if time_dependent(rec, store.reports.get(name), policy, now, store.heard(name), status):
                # A probation's end returns capacity and a drain's deadline finishes a quarantine:
                # both go ahead of a backlog such as thousands of silent nodes (docs/scaling.md).
                self.queue.add(name, urgent=rec is not None and rec.state in TIMED_FIRST)


def settle_heap() -> None:
    """Once the fleet is cached: collect, then freeze what is left out of the cyclic collector's reach.

    The caches are hundreds of thousands of small acyclic objects (750,000 at 10,000 nodes) that live as
    long as the fleet. Every full collection walked all of them, about half a second of CPU at 10,000
    nodes with the event loop stopped; at 100,000 nodes, seconds, with every watch event (a fault's
    report among them) waiting (docs/scaling.md, the fleet probe). Frozen objects are still freed by
    reference counting when the caches drop them; only objects that form cycles would wait for the
    next process, and the caches make none."""
    gc.collect()
    gc.freeze()


async def _nothing() -> list[dict[str, Any]]:
    """What a list already made needs to add: nothing."""
    return []
