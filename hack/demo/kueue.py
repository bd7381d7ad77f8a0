"""`make demo KUEUE=1`: the training job runs under the real Kueue manager, with gpuhealth's
AdmissionCheck on its ClusterQueue, so the XID 79 moves it as a whole through Kueue.

Kueue starts the way the Kueue integration tests start it (``devkit/kueue.py``: a plain
process beside the local control plane, its webhooks reached by URL). The demo writes a
ResourceFlavor for the GPU nodes, gpuhealth's AdmissionCheck
(``spec.controllerName: gpuhealth.dev/healthy-capacity``), a ClusterQueue using both and a LocalQueue
in the demo's namespace; the training job joins it with the ``kueue.x-k8s.io/queue-name`` label.
When its node fails, gpuhealth asks the ranks for a checkpoint, then sets its check on the Workload
to ``Retry`` instead of evicting pods: Kueue evicts the Workload (reason ``AdmissionCheck``),
requeues it and admits it again, and the ranks start from their checkpoint on healthy nodes.

:class:`WorkloadWatch` polls the Workload and turns what changed into timeline rows (``rows``, pure);
:func:`summary_fields` and :func:`misses` are what the summary records and requires, read from the
Workload and the Node's Events.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from devkit.cluster import LocalCluster
from devkit.k8s import Kube, wait_for
from devkit.kueue import CONTROLLER, KG, KV, Kueue, cond, evictions, our_check, workload
from hack.demo.common import NS, Timeline

FLAVOR = "demo-gpu"
CHECK = "gpuhealth"
CLUSTER_QUEUE = "demo-gpus"
LOCAL_QUEUE = "training"
QUOTA = 16  # nvidia.com/gpu: two nodes' worth, the training job takes 8
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
POLL_S = 0.3


def start(cluster: LocalCluster) -> Kueue:
    """Kueue's manager, CRDs and webhooks on the demo's control plane (built on first use)."""
    return Kueue(cluster).start()


def queue_objects(node_labels: dict[str, str]) -> list[dict[str, Any]]:
    """The flavor of the GPU nodes, gpuhealth's AdmissionCheck, a ClusterQueue with both, and the
    LocalQueue the training job names."""
    return [
        {
            "apiVersion": f"{KG}/{KV}",
            "kind": "ResourceFlavor",
            "metadata": {"name": FLAVOR},
            "spec": {"nodeLabels": dict(node_labels)},
        },
        {
            "apiVersion": f"{KG}/{KV}",
            "kind": "AdmissionCheck",
            "metadata": {"name": CHECK},
            "spec": {"controllerName": CONTROLLER},
        },
        {
            "apiVersion": f"{KG}/{KV}",
            "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
                "resourceGroups": [
                    {
                        "coveredResources": ["nvidia.com/gpu"],
                        "flavors": [{"name": FLAVOR, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": QUOTA}]}],
                    }
                ],
                "admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]},
            },
        },
        {
            "apiVersion": f"{KG}/{KV}",
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": NS},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
    ]


def create_queue(cluster: LocalCluster, node_labels: dict[str, str]) -> None:
    """Write the queue and wait until Kueue calls it active (gpuhealth has made its check Active)."""
    cluster.apply_objects(queue_objects(node_labels))

    def active() -> bool:
        out = cluster.kubectl("get", "clusterqueue", CLUSTER_QUEUE, "-o", "json").stdout
        conds = json.loads(out).get("status", {}).get("conditions") or []
        return any(c["type"] == "Active" and c["status"] == "True" for c in conds)

    wait_for(active, timeout=60, what="the ClusterQueue active (gpuhealth's AdmissionCheck Active)")


def queued(job: dict[str, Any]) -> dict[str, Any]:
    """``job`` joined to the LocalQueue; created suspended, Kueue starts it once admitted."""
    job["metadata"].setdefault("labels", {})[QUEUE_LABEL] = LOCAL_QUEUE
    job["spec"]["suspend"] = True
    return job


# -- what the Workload says, and the timeline rows it makes -------------------------------------------


@dataclass(frozen=True)
class WorkloadView:
    """The parts of a Workload the timeline and the summary tell."""

    name: str
    reserved: bool
    admitted: bool
    evicted: bool
    evicted_reason: str
    check_state: str
    check_message: str
    retries: int
    evictions: int  # every eviction Kueue counted (status.schedulingStats)
    moves: int  # those for an admission check's Retry: gpuhealth's moves


def view(wl: dict[str, Any] | None, check: str = CHECK) -> WorkloadView | None:
    if wl is None:
        return None
    ours = our_check(wl, check)
    reason = next(
        (c.get("reason", "") for c in (wl.get("status") or {}).get("conditions") or [] if c["type"] == "Evicted"), ""
    )
    stats = evictions(wl)
    return WorkloadView(
        name=wl["metadata"]["name"],
        reserved=cond(wl, "QuotaReserved"),
        admitted=cond(wl, "Admitted"),
        evicted=cond(wl, "Evicted"),
        evicted_reason=reason if cond(wl, "Evicted") else "",
        check_state=str(ours.get("state", "")),
        check_message=str(ours.get("message", "")),
        retries=int(ours.get("retryCount") or 0),
        evictions=sum(int(e.get("count") or 0) for e in stats),
        moves=sum(int(e.get("count") or 0) for e in stats if e.get("reason") == "AdmissionCheck"),
    )


def rows(prev: WorkloadView | None, cur: WorkloadView, retry_why: str = "") -> list[str]:
    """What changed between two polls of the Workload, in words, in the order it happened; one row per
    change, none twice. A ``Retry`` Kueue acted on before the poll saw it shows only in the check's
    ``retryCount``: ``retry_why`` is then its message (from gpuhealth's Event on the Workload)."""
    out: list[str] = []
    was = prev or WorkloadView(cur.name, False, False, False, "", "", "", 0, 0, 0)
    wl = f"Workload {NS}/{cur.name}"
    if cur.reserved and not was.reserved:
        again = " again" if cur.evictions else ""
        out.append(f"Kueue: {wl} reserved quota{again} in ClusterQueue {CLUSTER_QUEUE}; gpuhealth's check Pending")
    retried = cur.retries > was.retries or (cur.check_state == "Retry" and was.check_state != "Retry")
    if retried and was.check_state != "Retry":
        why = cur.check_message if cur.check_state == "Retry" else retry_why
        out.append(f"gpuhealth's admission check on {wl} -> Retry: {why}")
    if cur.check_state == "Ready" and was.check_state != "Ready":
        out.append(f"gpuhealth's admission check on {wl} -> Ready: {cur.check_message}")
    if (cur.evicted and not was.evicted) or (cur.evictions > was.evictions and not was.evicted):
        reason = cur.evicted_reason or ("AdmissionCheck" if cur.moves > was.moves else "?")
        out.append(f"Kueue: evicted {wl} (reason {reason}): the Job suspended, its quota released, requeued")
    if cur.admitted and not cur.evicted and not (was.admitted and not was.evicted):
        if cur.moves:
            out.append(
                f"Kueue: {wl} admitted again after {cur.moves} move(s): the Job resumes, its ranks start "
                "from their checkpoint off the failed node"
            )
        else:
            out.append(f"Kueue: {wl} admitted: the Job starts")
    return out


class WorkloadWatch:
    """Polls the training job's Workload every ``POLL_S`` and adds a timeline row for each change."""

    def __init__(self, kube: Kube, timeline: Timeline, job: str) -> None:
        self.kube = kube
        self.timeline = timeline
        self.job = job
        self.last: WorkloadView | None = None

    def poll(self) -> None:
        now = time.time()
        cur = view(workload(self.kube, NS, self.job))
        if cur is None:
            return
        why = ""
        if cur.retries > (self.last.retries if self.last else 0) and cur.check_state != "Retry":
            why = self._retry_message(cur.name)
        for i, row in enumerate(rows(self.last, cur, why)):
            self.timeline.add(row, now + i * 1e-4)  # rows of one poll in the order they happened
        self.last = cur

    def _retry_message(self, name: str) -> str:
        """The message of gpuhealth's latest Event on the Workload (its Retry's reason)."""
        evs = self.kube.core.list_namespaced_event(NS, field_selector=f"involvedObject.name={name}").items
        ours = [e for e in evs if e.reason in ("MovedByGpuhealth", "CapacityHeldOut")]
        never = dt.datetime.min.replace(tzinfo=dt.UTC)
        latest = max(ours, key=lambda e: e.event_time or e.last_timestamp or e.first_timestamp or never, default=None)
        return str(latest.message) if latest is not None else "(Kueue acted on it before this poll)"

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # a transient API error: the next poll sees the change
                self.poll()
            time.sleep(POLL_S)


# -- the summary ---------------------------------------------------------------------------------------


def summary_fields(wl: dict[str, Any] | None, moved_events: int, ranks_evicted: int) -> dict[str, Any]:
    """The summary's Kueue fields, from the Workload and the failed node's Events."""
    v = view(wl)
    return {
        "kueue": True,
        "workload": f"{NS}/{v.name}" if v else None,
        "workload_moves": v.moves if v else 0,
        "workload_readmitted": bool(v and v.moves and v.admitted and not v.evicted and v.check_state == "Ready"),
        "workload_check_retries": v.retries if v else 0,
        "workload_moved_events": moved_events,
        "training_ranks_evicted_by_gpuhealth": ranks_evicted,
    }


def misses(summary: dict[str, Any]) -> list[str]:
    """What the Kueue story must have left in the cluster; each miss in words (none without Kueue)."""
    if not summary.get("kueue"):
        return []
    out = []
    if summary.get("workload_moves") != 1:
        out.append(f"the Workload was moved {summary.get('workload_moves')} times by Kueue, expected once")
    if not summary.get("workload_readmitted"):
        out.append("the Workload was not admitted again (with gpuhealth's check Ready) after its move")
    if summary.get("workload_moved_events") != 1:
        out.append(f"{summary.get('workload_moved_events')} WorkloadMoved Events on the failed node, expected 1")
    if summary.get("training_ranks_evicted_by_gpuhealth"):
        out.append(
            f"gpuhealth evicted {summary['training_ranks_evicted_by_gpuhealth']} training ranks itself; "
            "under Kueue it moves the Workload instead"
        )
    return out
