"""Pure facts and decisions about Kueue Workloads, for gpuhealth as an AdmissionCheck controller.

Kueue (``kueue.x-k8s.io/v1beta2``) admits a Workload in two steps: it reserves quota (condition
``QuotaReserved``, ``status.admission`` with the flavors and, under topology-aware scheduling, the
nodes), then waits until every AdmissionCheck of the ClusterQueue is ``Ready``. gpuhealth answers for
its check (``spec.controllerName: gpuhealth.dev/healthy-capacity``):

- at admission, ``Ready`` unless the assignment counts on capacity gpuhealth holds out, else
  ``Retry`` with the reason (Kueue evicts, releases the quota and requeues);
- for a running Workload whose pods sit on a node or GPU gpuhealth takes out, after the checkpoint
  handshake of all its pods, ``Retry`` instead of evicting the pods: Kueue moves the whole Workload.

Writes are server-side apply patches of our entry in ``status.admissionChecks`` only (a list map by
``name``), with the Workload's resourceVersion as precondition.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.api import pods as P
from gpuhealth.api.names import GPU_RESOURCE, KUEUE_API_VERSION
from gpuhealth.api.nodes import count_of
from gpuhealth.api.timeutil import format_time
from gpuhealth.drain.plan import Step

HOSTNAME = "kubernetes.io/hostname"
WORKLOAD_ANNOTATION, WORKLOAD_LABEL = P.WORKLOAD_ANNOTATION, P.WORKLOAD_LABEL  # how a pod names its Workload
PENDING, READY, RETRY, REJECTED = "Pending", "Ready", "Retry", "Rejected"
ADMISSION_REQUEUE_S = 30  # an admission refused for held-out capacity is tried again after this
MAX_MESSAGE = 32768  # the CRD's limit on status.admissionChecks[].message
# A Workload still on the node this long after our Retry (Kueue down, or not acting on it) has its
# pods evicted after all: the pod path is the safety net, never a node left draining for ever.
MOVE_TIMEOUT_S = 300
GPU_RESOURCES = (GPU_RESOURCE,)  # the default quota names that count GPUs (``--gpu-resources``)


def key(wl: Mapping[str, Any]) -> str:
    m = wl["metadata"]
    return f"{m.get('namespace', '')}/{m['name']}"


def _status(wl: Mapping[str, Any]) -> Mapping[str, Any]:
    return wl.get("status") or {}


def condition(wl: Mapping[str, Any], type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") == "True" for c in _status(wl).get("conditions") or [])


def reserved(wl: Mapping[str, Any]) -> bool:
    """Quota reserved and not finished: the admission an AdmissionCheck answers for."""
    return condition(wl, "QuotaReserved") and not condition(wl, "Finished")


def running(wl: Mapping[str, Any]) -> bool:
    """Admitted (all checks Ready), not finished and not being evicted: a Workload gpuhealth may move."""
    return reserved(wl) and condition(wl, "Admitted") and not condition(wl, "Evicted")


def check_of(wl: Mapping[str, Any], checks: Iterable[str]) -> Mapping[str, Any] | None:
    """The Workload's entry for one of gpuhealth's AdmissionChecks, if its ClusterQueue uses one."""
    names = set(checks)
    for c in _status(wl).get("admissionChecks") or []:
        if c.get("name") in names:
            return c  # type: ignore[no-any-return]
    return None


def owner_key(namespace: str, kind: str, name: str) -> str:
    return f"{namespace}/{kind}={name}"


def workload_owner(wl: Mapping[str, Any]) -> str | None:
    """The object the Workload stands for (a Job for Kueue's batch/job integration)."""
    m = wl["metadata"]
    for ref in m.get("ownerReferences") or []:
        if ref.get("controller"):
            return owner_key(m.get("namespace", ""), str(ref.get("kind")), str(ref.get("name")))
    return None


def pod_refs(pod: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(Workload key named on the pod, its controller's owner key): how a pod is matched to a Workload."""
    ns = pod["metadata"].get("namespace", "")
    named = P.pod_annotations(pod).get(WORKLOAD_ANNOTATION) or P.pod_labels(pod).get(WORKLOAD_LABEL)
    ref = P.controller_ref(pod)
    owner = owner_key(ns, str(ref.get("kind")), str(ref.get("name"))) if ref else None
    return (f"{ns}/{named}" if named else None), owner


# -- admission --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeCapacity:
    """A GPU node as the admission decision sees it: GPUs, those gpuhealth holds out, and why."""

    name: str
    labels: Mapping[str, str]
    gpus: int
    out: int = 0
    why: str = ""


@dataclass(frozen=True)
class Verdict:
    state: str  # Ready or Retry
    message: str
    requeue_after_s: int | None = None


def hosts(assignment: Mapping[str, Any]) -> list[str] | None:
    """The nodes of a podSet's topology assignment (v1beta2's compact slices), when its lowest
    level is the hostname; None without one (or above node level)."""
    ta = assignment.get("topologyAssignment") or {}
    levels = list(ta.get("levels") or [])
    if HOSTNAME not in levels:
        return None
    at = levels.index(HOSTNAME)
    out: list[str] = []
    for s in ta.get("slices") or []:
        values = (s.get("valuesPerLevel") or [])[at] if len(s.get("valuesPerLevel") or []) > at else {}
        count = int(s.get("domainCount") or 0)
        if values.get("universal") is not None:
            out.extend([str(values["universal"])] * max(count, 1))
        elif ind := values.get("individual"):
            out.extend(f"{ind.get('prefix') or ''}{r}{ind.get('suffix') or ''}" for r in ind.get("roots") or [])
    return out


def gpu_usage(wl: Mapping[str, Any], resources: Collection[str] = GPU_RESOURCES) -> dict[str, dict[str, int]]:
    """GPUs the admission assigns, per flavor and quota resource name (each podSet's ``resourceUsage``).

    ``resources``: the quota names that stand for GPUs: the device plugin's ``nvidia.com/gpu``, and
    where Kueue accounts DRA claims, the names its ``deviceClassMappings`` give GPU DeviceClasses.
    """
    usage: dict[str, dict[str, int]] = {}
    for psa in (_status(wl).get("admission") or {}).get("podSetAssignments") or []:
        for resource in resources:
            flavor = (psa.get("flavors") or {}).get(resource)
            used = count_of((psa.get("resourceUsage") or {}).get(resource))
            if flavor and used:
                per = usage.setdefault(flavor, {})
                per[resource] = per.get(resource, 0) + used
    return usage


def gpu_demand(wl: Mapping[str, Any], resources: Collection[str] = GPU_RESOURCES) -> dict[str, int]:
    """GPUs the admission assigns, per flavor, whatever quota name counts them."""
    return {flavor: sum(per.values()) for flavor, per in gpu_usage(wl, resources).items()}


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _held(nodes: Iterable[NodeCapacity]) -> str:
    out = [n for n in nodes if n.out]
    shown = ", ".join(f"{n.name} ({n.out} GPUs: {n.why})" for n in out[:3])
    return shown + (f" and {len(out) - 3} more" if len(out) > 3 else "")


def admission_verdict(
    wl: Mapping[str, Any],
    flavors: Mapping[str, Mapping[str, str] | None],
    nodes: Sequence[NodeCapacity],
    in_use: Mapping[str, int],
    resources: Collection[str] = GPU_RESOURCES,
) -> Verdict:
    """Ready, or Retry when the assignment counts on capacity gpuhealth holds out.

    ``flavors``: each assigned ResourceFlavor's ``nodeLabels`` (None: the flavor could not be read).
    ``in_use``: GPUs other admitted Workloads hold per flavor. With a topology assignment down to
    nodes, any assigned node held out means Retry; otherwise the flavor's nodes are those matching its
    ``nodeLabels``, and Retry means the GPUs gpuhealth has not held out, less those in use, cannot
    hold what this Workload was given: Kueue's quota still counts the held-out GPUs. A node's held-out
    GPUs (``NodeCapacity.out``) are the same GPUs whether a node taint or DeviceTaintRules hold them
    out, so device-plugin and DRA quota names (``resources``) count against the same number.
    """
    by_name = {n.name: n for n in nodes}
    for psa in (_status(wl).get("admission") or {}).get("podSetAssignments") or []:
        assigned = hosts(psa)
        if assigned is None:
            continue
        bad = [by_name[h] for h in dict.fromkeys(assigned) if h in by_name and by_name[h].out]
        if bad:
            return Verdict(
                RETRY,
                f"podSet {psa.get('name')}: the topology assignment includes capacity gpuhealth holds out: "
                f"{_held(bad)}",
                ADMISSION_REQUEUE_S,
            )
    for flavor, per in sorted(gpu_usage(wl, resources).items()):
        need = sum(per.values())
        selector = flavors.get(flavor)
        if selector is None:
            continue  # an unreadable flavor is Kueue's to judge, not a reason to hold a job back
        members = [n for n in nodes if _matches(n.labels, selector)]
        held = sum(n.out for n in members)
        if not held:
            continue
        total = sum(n.gpus for n in members)
        free = total - held - in_use.get(flavor, 0)
        if need > free:
            return Verdict(
                RETRY,
                f"flavor {flavor}: {need} {' + '.join(sorted(per))} assigned, but gpuhealth holds out {held} of the "
                f"flavor's {total} ({_held(members)}) and {in_use.get(flavor, 0)} are in use: {max(free, 0)} left",
                ADMISSION_REQUEUE_S,
            )
    return Verdict(READY, "no capacity gpuhealth holds out is assigned")


def check_apply(wl: Mapping[str, Any], check: str, verdict: Verdict, now: dt.datetime) -> dict[str, Any]:
    """The server-side apply body that sets our check's entry, only if the Workload is unchanged."""
    entry: dict[str, Any] = {
        "name": check,
        "state": verdict.state,
        "message": verdict.message[:MAX_MESSAGE],
        "lastTransitionTime": format_time(now),
    }
    if verdict.requeue_after_s is not None:
        entry["requeueAfterSeconds"] = verdict.requeue_after_s
    m = wl["metadata"]
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": m["name"],
            "namespace": m.get("namespace", ""),
            "resourceVersion": m.get("resourceVersion"),
        },
        "status": {"admissionChecks": [entry]},
    }


# -- moving a running Workload ----------------------------------------------------------------------


@dataclass
class Moves:
    """A drain plan's eviction steps split: pods left to evict, and Workloads to move by ``Retry``."""

    pod_steps: list[Step] = field(default_factory=list)
    workloads: dict[str, list[Step]] = field(default_factory=dict)  # workload key -> its pods' steps


def split_moves(steps: Sequence[Step], workload_for: Callable[[Mapping[str, Any]], str | None]) -> Moves:
    """Evictions of pods whose Workload gpuhealth can move become one move per Workload; checkpoint
    requests and everything else stay as they are. ``workload_for`` names a pod's movable Workload."""
    moves = Moves()
    for step in steps:
        wl = workload_for(step.pod) if step.kind == "evict" else None
        if wl is None:
            moves.pod_steps.append(step)
        else:
            moves.workloads.setdefault(wl, []).append(step)
    return moves


def move_overdue(retried_at: dt.datetime | None, now: dt.datetime) -> bool:
    """Whether Kueue has had long enough to act on our Retry."""
    return retried_at is not None and (now - retried_at).total_seconds() >= MOVE_TIMEOUT_S


def move_message(node: str, cause: str, why: str) -> str:
    """What the Workload is told (our check's message): the node, the fault (GPU, reason) and why now."""
    why = why.removesuffix(": evicting anyway")  # the plan's words for pods; this Workload is moved instead
    return f"gpuhealth is taking {node} out of service ({cause}); {why}: moving the Workload as a whole"
