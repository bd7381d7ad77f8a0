"""Drains only the pods that hold a bad GPU, with the node drain's plan and its one execution path.

A GPU in ``Draining`` moves the pods that hold any of its DRA devices (its full device, each MIG
device or placement), nothing else on the node. Which pods
hold it comes from ResourceClaims (``status.allocation.devices.results``, ``status.reservedFor``) and
from the pods' own claim fields, kept in the pod cache (``drain/claims.py``). Claims are *listed*
while a device drain runs, not reflected: device drains are rare and short, and a claim reflector
would hold every claim of the cluster in memory all the time for them. One list serves every node
for ``CLAIMS_TTL_S``.

The pods found go through exactly the node drain's logic: ``drain.plan.plan_drain`` (checkpoint
handshake, whole gangs, timeouts) and ``Drainer.execute`` (PodDisruptionBudget retries with growing
delays, Events). Progress lives per GPU in ``status.deviceDrains["<index>"]``, written before the
first request (through ``status_writes.py``), so a restarted operator neither asks twice nor evicts
twice. Device drains take no ``maxConcurrentDrains`` slot: they move the pods of one GPU, and the
GPU budget already bounds how many GPUs leave at once. While the node itself is Draining, its drain
moves every pod and the device drains wait for it.

On a device-plugin node (``DeviceRecord.via_plugin``: no DRA device) the pods holding the GPU are
those the agent's report names under it (``Report.holders``: the kubelet's pod-resources API, the
GPU's own and its MIG devices'), and the drain goes through the same plan and execution path. While
the report cannot name them (the agent lost the pod-resources socket) the drain waits.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpuhealth.api import pods as P
from gpuhealth.api.devices import DeviceRecord, DeviceState
from gpuhealth.api.names import Mode, State
from gpuhealth.api.report import Report
from gpuhealth.api.status import DrainRecord, Record, drain_is_current
from gpuhealth.api.timeutil import format_time
from gpuhealth.controller import metrics
from gpuhealth.controller.act import status_writes
from gpuhealth.controller.act.again import Again, soonest
from gpuhealth.controller.act.drainer import Drainer
from gpuhealth.controller.act.passes import NodePass
from gpuhealth.controller.state.store import Store
from gpuhealth.drain.claims import pods_holding
from gpuhealth.drain.plan import plan_drain
from gpuhealth.evaluation.findings import Assessment
from gpuhealth.evaluation.rules import fatal
from gpuhealth.kube.aio import AsyncKube
from gpuhealth.kube.events import EventSink

CLAIMS_TTL_S = 1.0


def _current(record: DrainRecord | None, rec: DeviceRecord) -> DrainRecord:
    """The GPU's drain record if it belongs to its current Draining episode, else a blank one."""
    if record and drain_is_current(record, rec):
        return record
    return DrainRecord()


def _draining(records: Sequence[DeviceRecord]) -> dict[int, DeviceRecord]:
    """The GPUs to drain: Draining, with a device (or, on a device-plugin node, the report) to find
    their pods by."""
    return {r.index: r for r in records if r.state == DeviceState.DRAINING and (r.device or r.via_plugin)}


def _plugin_holders(report: Report | None, index: int) -> set[str] | None:
    """The pods (``namespace/name``) the agent's report names as holding GPU ``index`` (its own and
    its MIG devices'); None while the report cannot name them (no report, or the agent could not
    read the kubelet's pod-resources API this pass): the drain then waits, it never completes on
    an unknown."""
    if report is None or report.pod_resources is None or not report.pod_resources.available:
        return None
    return {f"{h.namespace}/{h.name}" for h in report.holders(index)}


class DeviceDrainer:
    def __init__(
        self,
        *,
        kube: AsyncKube,
        store: Store,
        drainer: Drainer,
        events: EventSink,
    ) -> None:
        self.kube = kube
        self.store = store
        self.drainer = drainer
        self.events = events
        self._claims: list[dict[str, Any]] = []
        self._claims_at = -1e9

    async def claims(self, fresh: bool = False) -> list[dict[str, Any]]:
        """The cluster's ResourceClaims, listed at most once per CLAIMS_TTL_S unless ``fresh``."""
        if fresh or time.monotonic() - self._claims_at > CLAIMS_TTL_S:
            self._claims = await self.kube.list_resource_claims()
            self._claims_at = time.monotonic()
        return self._claims

    async def _write(self, name: str, drains: Mapping[str, DrainRecord | None]) -> None:
        entries = {k: None if v is None else dict(v) for k, v in drains.items()}
        await status_writes.record(self.kube, self.store, name, {"deviceDrains": entries})

    def fold(self, p: NodePass, records: Sequence[DeviceRecord]) -> dict[str, Any]:
        """``status.deviceDrains`` entries to drop in the node's own status patch: the drains of GPUs
        that ``records`` (this pass's decision) no longer hold Draining. A GPU whose drain completed
        moves to Quarantined and loses its drain record in one write, not two (docs/scaling.md, the
        device path at 10,000 nodes). Every pass that reaches ``run`` has written this first, and ``run``
        reads only the records of Draining GPUs, which this keeps."""
        draining = _draining(records)
        stale = {str(i): None for i in p.found.device_drains if i not in draining}
        return {"deviceDrains": stale} if stale else {}

    async def run(self, p: NodePass, node: Record, records: Sequence[DeviceRecord]) -> Again:
        """Drain the pods that hold each Draining GPU; returns when the node wants its next pass."""
        name, policy, now, a = p.name, p.policy, p.now, p.assessment
        # Copies (the pass's are read only); only the Draining GPUs' are read, which ``fold`` keeps.
        drains = {i: DrainRecord(**d) for i, d in p.found.device_drains.items()}
        draining = _draining(records)
        if not draining or node.state == State.DRAINING or policy.mode != Mode.ENFORCE:
            return None
        again: Again = None
        pods = self.store.pods.on(name)
        current = {i: _current(drains.get(i), r) for i, r in draining.items()}
        # A drain judges who holds the GPU on claims listed after it started: a list cached from before
        # a pod's claim was allocated would find nobody and complete the drain at once. A GPU held out on
        # the device-plugin route has no claim: the agent's report names its pods.
        dra = [i for i, r in draining.items() if not r.via_plugin]
        claims = await self.claims(fresh=any(not current[i].get("startedAt") for i in dra)) if dra else []
        for index, rec in sorted(draining.items()):
            record = current[index]
            if record.get("phase") == "Completed":
                continue
            holding = _plugin_holders(p.report, index) if rec.via_plugin else pods_holding(rec.refs(), claims, pods)
            if holding is None:
                again = soonest(again, 1.0)  # the report cannot name the GPU's pods now: ask again
                continue
            ahead = None
            if not record.get("startedAt"):
                record = ahead = DrainRecord(phase="Running", startedAt=format_time(now), fatal=False, pods={})
            # Every device of the GPU: its full device and each MIG device or placement (above).
            mine = [p for p in pods if P.key(p) in holding]
            gpu_fatal = fatal(Assessment(findings=tuple(f for f in a.findings if f.gpu == index)))
            settings = policy.drain_for(rec.reason)  # patient for a slow fault that moves at the next checkpoint
            plan = plan_drain(name, mine, self.store.pods.gangs(), settings, gpu_fatal, record, now)
            if ahead is not None and not (plan.complete and not plan.steps):
                # Recorded before the first request, so a restart resumes this drain (and its timeouts
                # count from its start). A drain that is complete with nothing to ask or evict writes
                # its outcome once, below.
                await self._write(name, {str(index): ahead})
            cause = f"GPU {index}" + (f" ({rec.uuid})" if rec.uuid else "") + f": {rec.reason}: {rec.message}"
            new_record = await self.drainer.execute(name, plan, now, cause)
            if plan.complete:
                metrics.DEVICE_ACTIONS.labels("drain", rec.reason, str(policy.mode)).inc()
                self.events(
                    "Node",
                    name,
                    name,
                    "Normal",
                    "DeviceDrainFinished",
                    f"GPU {index}"
                    + (f" ({rec.uuid})" if rec.uuid else "")
                    + f": all {new_record.get('total', 0)} pods that held it have left "
                    f"({new_record.get('evicted', 0)} evicted); the node's other pods were not touched",
                )
            if new_record != record:
                await self._write(name, {str(index): new_record})
            # Complete: the GPU's state machine moves on with the completed drain; else every second.
            again = soonest(again, 0.05 if plan.complete else 1.0)
        return again
