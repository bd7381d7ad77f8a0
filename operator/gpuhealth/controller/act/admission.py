"""gpuhealth as a Kueue AdmissionCheck controller (``spec.controllerName: gpuhealth.dev/healthy-capacity``).

Two duties, decided by ``drain/kueue.py`` (pure) and written here:

- **Admission.** A Workload whose quota Kueue reserved, with our check ``Pending``, gets ``Ready``
  unless its assignment counts on capacity gpuhealth holds out, then ``Retry`` (with the reason, and
  ``requeueAfterSeconds``): Kueue evicts it, releases the quota and requeues it.
- **Moving a running Workload.** The drainer hands its plan over before it evicts (``take``): the
  eviction steps of pods whose Workload uses our check become one ``Retry`` per Workload, after the
  checkpoint handshake of all its pods (or its deadline), instead of evicting pods. Kueue evicts the
  Workload (reason ``AdmissionCheck``), releases its quota and requeues it; the taint keeps it off
  the broken node when it is admitted again.

Restart safety: the handshake lives on the pods (``drain/plan.py``), so a restart between the
acknowledgements and the ``Retry`` finds them and writes the ``Retry`` without asking again; a
``Retry`` is written only to a running Workload whose check is ``Ready`` (after a write the cache
holds the answer, a restarted operator reads the Workload), so never twice; a Workload deleted
meanwhile leaves the cache, and its pods the node. Every write is a server-side apply of our entry
with the Workload's resourceVersion as precondition (409: the watch brings the new one, decide again).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from gpuhealth.api.names import ADMISSION_CHECK_CONTROLLER, KUEUE_API_VERSION
from gpuhealth.api.status import WorkloadMove
from gpuhealth.api.timeutil import format_time, format_time_precise, parse_time
from gpuhealth.controller.intake.kueuewatch import KueueCache, slim_check, slim_workload
from gpuhealth.controller.intake.objectwatch import ObjectWatch, listed
from gpuhealth.controller.state.store import Store
from gpuhealth.drain import kueue as K
from gpuhealth.drain.plan import DrainPlan, Step
from gpuhealth.kube.aio import AsyncKube
from gpuhealth.kube.client import status_of
from gpuhealth.kube.events import EventSink

log = logging.getLogger(__name__)


class AdmissionRoom:
    def __init__(
        self,
        *,
        kube: AsyncKube,
        store: Store,
        events: EventSink,
        active: asyncio.Event,
        clock: Callable[[], dt.datetime],
        gpu_resources: Sequence[str] = K.GPU_RESOURCES,
    ) -> None:
        self.kube = kube
        self.gpu_resources = tuple(gpu_resources)
        self.store = store
        self.events = events
        self.active = active
        self.clock = clock
        self.cache = KueueCache()
        self._due: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.workload_watch = ObjectWatch(
            "workloads",
            lambda slim: listed(kube.sync.list_workloads_rv(slim)),
            kube.sync.watch_workloads,
            functools.partial(slim_workload, resources=self.gpu_resources),
            self.on_workload,
            self.replace_workloads,
        )
        self.check_watch = ObjectWatch(
            "admissionchecks",
            lambda slim: listed(kube.sync.list_admission_checks_rv(slim)),
            kube.sync.watch_admission_checks,
            slim_check,
            self.on_check,
            self.replace_checks,
        )

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """List both kinds (a 403 or 404 here is raised: the caller decides whether Kueue is on)."""
        checks = await self.kube.run(self.check_watch.list)
        workloads = await self.kube.run(self.workload_watch.list)
        for c in checks:
            self.on_check("ADDED", c)
        for w in workloads:
            self.on_workload("ADDED", w)
        loop = asyncio.get_running_loop()
        self.check_watch.start(loop)
        self.workload_watch.start(loop)
        self._task = asyncio.create_task(self._worker())

    async def stop(self) -> None:
        self.workload_watch.stop()
        self.check_watch.stop()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # -- feeders (the watches) -------------------------------------------------------------------

    def _queue(self, key: str) -> None:
        self._due.add(key)
        self._wake.set()

    def on_workload(self, event: str | None, body: dict[str, Any]) -> None:
        key = K.key(body)
        if event == "DELETED":
            self.cache.drop_workload(key)
            self._due.discard(key)
            return
        self.cache.put_workload(body)
        if self._wants_admission(body):
            self._queue(key)

    def replace_workloads(self, items: list[dict[str, Any]]) -> None:
        fresh = {K.key(w) for w in items}
        for key in [k for k in self.cache.workloads if k not in fresh]:
            self.on_workload("DELETED", self.cache.workloads[key])
        for w in items:
            self.on_workload("MODIFIED", w)

    def on_check(self, event: str | None, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        if event == "DELETED":
            self.cache.checks.pop(name, None)
            return
        if self.cache.put_check(body):
            self._queue(f"check:{name}")
            for key, wl in self.cache.workloads.items():  # a check that just became ours
                if self._wants_admission(wl):
                    self._queue(key)

    def replace_checks(self, items: list[dict[str, Any]]) -> None:
        self.cache.checks.clear()
        for c in items:
            self.on_check("MODIFIED", c)

    def _wants_admission(self, wl: dict[str, Any]) -> bool:
        check = K.check_of(wl, self.cache.checks)
        return (
            check is not None and check.get("state") == K.PENDING and K.reserved(wl) and not K.condition(wl, "Evicted")
        )

    # -- the worker ------------------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.active.wait()  # a standby replica decides nothing
            due, self._due = self._due, set()
            for key in sorted(due):
                try:
                    if key.startswith("check:"):
                        await self._activate(key.removeprefix("check:"))
                    else:
                        await self.admit(key)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    log.warning("admission check work on %s failed (%s); retrying", key, e)
                    asyncio.get_running_loop().call_later(2.0, self._queue, key)

    async def _activate(self, name: str) -> None:
        """Kueue admits nothing through an inactive check: ours says Active as long as we run."""
        check = self.cache.checks.get(name)
        if check is None:
            return
        gen = check["metadata"].get("generation")
        if any(c.get("status") == "True" and c.get("observedGeneration") == gen for c in check["status"]["conditions"]):
            return
        body = {
            "apiVersion": KUEUE_API_VERSION,
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "status": {
                "conditions": [
                    {
                        "type": "Active",
                        "status": "True",
                        "reason": "Active",
                        "message": "gpuhealth answers this check with the capacity it holds out",
                        "lastTransitionTime": format_time(self.clock()),
                        "observedGeneration": gen,
                    }
                ]
            },
        }
        await self.kube.apply_admission_check_status(name, body)

    def _capacity(self) -> list[K.NodeCapacity]:
        out = []
        for name, node in self.store.nodes.items():
            rec = self.store.records.get(name)
            held = self.store.gpus_out(name)
            if rec is not None and rec.out_of_service:
                why = f"{rec.state}: {rec.reason}"
            else:
                why = f"{held} GPUs held out one by one" if held else ""
            labels = (node.get("metadata") or {}).get("labels") or {}
            out.append(K.NodeCapacity(name, labels, self.store.gpus_of(name), held, why))
        return out

    async def _flavors(self, names: list[str]) -> dict[str, dict[str, str] | None]:
        out: dict[str, dict[str, str] | None] = {}
        for name in names:
            try:
                flavor = await self.kube.get_resource_flavor(name)
            except Exception as e:
                if status_of(e) != 404:
                    raise
                out[name] = None
                continue
            out[name] = dict((flavor.get("spec") or {}).get("nodeLabels") or {})
        return out

    async def admit(self, key: str) -> None:
        wl = self.cache.workloads.get(key)
        if wl is None or not self._wants_admission(wl):
            return
        check = K.check_of(wl, self.cache.checks)
        assert check is not None
        in_use: dict[str, int] = {}
        for other_key, other in self.cache.workloads.items():
            if other_key != key and K.reserved(other):
                for flavor, n in K.gpu_demand(other, self.gpu_resources).items():
                    in_use[flavor] = in_use.get(flavor, 0) + n
        flavors = await self._flavors(sorted(K.gpu_demand(wl, self.gpu_resources)))
        verdict = K.admission_verdict(wl, flavors, self._capacity(), in_use, self.gpu_resources)
        if await self._write(wl, check["name"], verdict) and verdict.state == K.RETRY:
            self._workload_event(wl, "Warning", "CapacityHeldOut", verdict.message)

    async def _write(self, wl: dict[str, Any], check: str, verdict: K.Verdict) -> bool:
        body = K.check_apply(wl, check, verdict, self.clock())
        meta = wl["metadata"]
        try:
            fresh = await self.kube.apply_workload_status(meta["namespace"], meta["name"], body)
        except Exception as e:
            code = status_of(e)
            if code == 404:
                self.cache.drop_workload(K.key(wl))  # deleted meanwhile: forgotten
                return False
            if code == 409:
                return False  # changed under us: the watch brings the new version, decided again
            raise
        self.cache.refresh_workload(slim_workload(fresh, self.gpu_resources))
        log.info("workload %s: check %s -> %s (%s)", K.key(wl), check, verdict.state, verdict.message)
        return True

    def _workload_event(self, wl: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = wl["metadata"]
        self.events(
            "Workload", meta["name"], meta.get("uid", ""), type_, reason, message, KUEUE_API_VERSION, meta["namespace"]
        )

    # -- moving running Workloads (the drainer's hook) -------------------------------------------

    def movable(self, pod: Any) -> str | None:
        """The Workload gpuhealth moves instead of evicting this pod: one that uses our check and holds
        quota (running, or already on its way out after our Retry)."""
        wl = self.cache.workload_of(pod)
        if wl is None or K.check_of(wl, self.cache.checks) is None or not K.reserved(wl):
            return None
        return K.key(wl)

    async def take(self, node: str, plan: DrainPlan, cause: str, now: dt.datetime) -> list[Step]:
        """Carry out the plan's Workload moves; return the steps left for the pod path."""
        moves = K.split_moves(plan.steps, self.movable)
        record: dict[str, WorkloadMove] = plan.record.setdefault("workloads", {})
        for key, steps in sorted(moves.workloads.items()):
            wl = self.cache.workloads.get(key)
            if wl is None:
                continue
            move = record.setdefault(key, WorkloadMove(workload=key, uid=wl["metadata"].get("uid", "")))
            for step in steps:
                prec = plan.record.setdefault("pods", {}).get(step.pod["metadata"]["uid"])
                if prec is not None:
                    prec["workload"] = key
            check = K.check_of(wl, self.cache.checks)
            assert check is not None
            if K.running(wl) and check.get("state") == K.READY:
                message = K.move_message(node, cause, steps[0].why)
                if await self._write(wl, check["name"], K.Verdict(K.RETRY, message)):
                    move["retriedAt"] = format_time_precise(now)
                    move["message"] = message
                    self._workload_event(wl, "Warning", "MovedByGpuhealth", message)
                    self.events("Node", node, node, "Normal", "WorkloadMoved", f"Asked Kueue to move {key}: {message}")
            fresh = self.cache.workloads.get(key) or wl
            state = (K.check_of(fresh, self.cache.checks) or {}).get("state", "")
            move["state"] = "Evicted" if K.condition(fresh, "Evicted") else str(state)
            if K.move_overdue(parse_time(move.get("retriedAt")), now):
                moves.pod_steps.extend(steps)  # Kueue has not moved it: its pods take the pod path
                if not move.get("fellBack"):
                    move["fellBack"] = True
                    self.events(
                        "Node",
                        node,
                        node,
                        "Warning",
                        "WorkloadNotMoved",
                        f"Kueue has not moved {key} within {K.MOVE_TIMEOUT_S}s of gpuhealth's Retry: evicting its pods",
                    )
        return moves.pod_steps


MODES = ("auto", "on", "off")


async def start_admission(
    mode: str,
    *,
    kube: AsyncKube,
    store: Store,
    events: EventSink,
    active: asyncio.Event,
    clock: Callable[[], dt.datetime],
    gpu_resources: Sequence[str] = K.GPU_RESOURCES,
) -> AdmissionRoom | None:
    """The room, started: ``on`` always (a failure to read Kueue's objects stops the operator), ``auto``
    when the API server serves Kueue's API and the operator may read it, ``off`` never. ``gpu_resources``:
    the quota resource names that count GPUs (``--gpu-resources``)."""
    if mode == "off":
        return None
    if mode == "auto":
        try:
            served = await kube.kueue_served()
        except Exception as e:
            log.warning("could not tell whether Kueue is installed (%s): its admission check stays off", e)
            return None
        if not served:
            return None
        if not await kube.kueue_allowed():
            log.info("Kueue is installed but this operator's RBAC does not include it: the admission check stays off")
            return None
    room = AdmissionRoom(kube=kube, store=store, events=events, active=active, clock=clock, gpu_resources=gpu_resources)
    try:
        await room.start()
    except Exception as e:
        if mode == "on":
            raise
        log.warning("Kueue is installed but its Workloads cannot be read (%s): the admission check stays off", e)
        return None
    log.info(
        "Kueue admission check %s on: %d of its checks, %d workloads",
        ADMISSION_CHECK_CONTROLLER,
        len(room.cache.checks),
        len(room.cache.workloads),
    )
    return room


__all__ = ["ADMISSION_CHECK_CONTROLLER", "MODES", "AdmissionRoom", "start_admission"]
