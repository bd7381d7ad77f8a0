"""Pure restart-loop detection: is this node, one GPU of it or one MIG instance the common cause of
several workloads failing?

Several distinct workloads failing on one node within the window, while the same workloads run
fine on other nodes, point at the node, not at the workloads. Where the devices the failing pods
hold are known (``sites``: the GPUs and MIG devices each pod holds through its DRA claims), the
evidence narrows to what they share: every failing pod on one MIG device of which the agent lists
the instance, that MIG device (the finding carries the instance, as a repeated application XID
confined to it does); every failing pod on one GPU (several of its instances, or its full device),
that GPU. A failing pod whose devices are not known (no DRA claim, device-plugin MIG, a GPU the
slices do not map), or pods on several GPUs, keep the finding the node's.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuhealth.api.names import Signal
from gpuhealth.api.policy import Policy
from gpuhealth.api.timeutil import parse_time
from gpuhealth.drain import pods as P
from gpuhealth.drain.plan import Step
from gpuhealth.evaluation.assess import Finding
from gpuhealth.evaluation.findings import Instance


@dataclass(frozen=True)
class Site:
    """A device a pod holds: GPU ``gpu`` (``uuid``), its DRA ``device`` (``driver/pool/device``) and,
    for a MIG device the agent lists, the instance it is."""

    gpu: int
    uuid: str = ""
    device: str = ""
    instance: Instance | None = None


def failure(pod: Mapping[str, Any], now: dt.datetime, window_s: float) -> tuple[int, dt.datetime] | None:
    """(restarts, since) if the pod is failing within the window, else None."""
    status = pod.get("status") or {}
    window = dt.timedelta(seconds=window_s)
    restarts = 0
    last: dt.datetime | None = None
    crashloop = False
    for cs in status.get("containerStatuses") or []:
        restarts = max(restarts, int(cs.get("restartCount") or 0))
        term = (cs.get("lastState") or {}).get("terminated") or (cs.get("state") or {}).get("terminated") or {}
        finished = parse_time(term.get("finishedAt"))
        if finished is not None and term.get("exitCode", 0) != 0:
            last = max(last, finished) if last else finished
        if ((cs.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff":
            crashloop = True
    if status.get("phase") == "Failed":
        restarts = max(restarts, 1)
        last = last or parse_time(status.get("startTime"))
    if last is None and not crashloop:
        return None
    if last is not None and now - last > window:
        return None
    return restarts, (last or now)


def shows_failure(pod: Mapping[str, Any]) -> bool:
    """Whether anything restart-loop detection reads of the pod could count, at any time: a restart, a
    failed exit, a crash loop, a Failed phase; or no status to tell (a deletion known only by name).
    A pod that shows none changes no node's restart-loop finding by arriving or leaving."""
    status = pod.get("status")
    if not isinstance(status, Mapping):
        return True
    if status.get("phase") == "Failed":
        return True
    for cs in status.get("containerStatuses") or []:
        if int(cs.get("restartCount") or 0) > 0:
            return True
        for key in ("state", "lastState"):
            state = cs.get(key) or {}
            if (state.get("terminated") or {}).get("exitCode", 0) != 0 or state.get("waiting"):
                return True
    return False


def restart_loop_finding(
    policy: Policy,
    node: str,
    node_pods: Sequence[Mapping[str, Any]],
    workload_pods: Mapping[str, Sequence[Mapping[str, Any]]],
    now: dt.datetime,
    sites: Mapping[str, frozenset[Site]] | None = None,
) -> Finding | None:
    """The restart-loop finding of ``node``, the node's unless ``sites`` (pod key -> the devices it
    holds) place every failing pod on one GPU or one MIG device (see the module docstring)."""
    if not policy.restart_loop_enabled:
        return None
    failing: dict[str, list[tuple[str, int, dt.datetime]]] = {}
    for pod in node_pods:
        f = failure(pod, now, policy.restart_loop_window_s)
        if f is None:
            continue
        restarts, since = f
        if restarts < policy.restart_loop_min_restarts and (pod.get("status") or {}).get("phase") != "Failed":
            continue
        failing.setdefault(P.workload_key(pod), []).append((P.key(pod), restarts, since))
    evidence = []
    for wk, items in sorted(failing.items()):
        elsewhere = [
            p
            for p in workload_pods.get(wk, [])
            if (p.get("spec") or {}).get("nodeName") not in (node, None, "")
            and (p.get("status") or {}).get("phase") == "Running"
            and failure(p, now, policy.restart_loop_window_s) is None
        ]
        if elsewhere:
            evidence.append((wk, items))
    if len(evidence) < policy.restart_loop_min_workloads:
        return None
    since = min(s for _, items in evidence for _, _, s in items)
    parts = [
        f"{wk}: " + ", ".join(f"{pod} restarted {n}x" for pod, n, _ in items) + " (runs fine elsewhere)"
        for wk, items in evidence
    ]
    where = shared_site([pod for _, items in evidence for pod, _, _ in items], sites or {})
    if where is None:
        on, gpu, uuid, instance = "this node", None, "", None
    else:
        gpu, uuid, instance = where.gpu, where.uuid, where.instance
        on = "its " + instance.words() if instance is not None else "this GPU"
    detail = f"{len(evidence)} workloads keep failing on {on} since {since:%H:%M:%SZ}: " + "; ".join(parts)
    return Finding(
        Signal.RESTART_LOOP,
        policy.restart_loop_action,
        detail[:900],
        gpu=gpu,
        uuid=uuid,
        since=since,
        instance=instance,
    )


def shared_site(pods: Sequence[str], sites: Mapping[str, frozenset[Site]]) -> Site | None:
    """What every pod of ``pods`` sits on: the one MIG device they all hold (its ``instance`` set), or
    their one GPU (``instance`` None); None where a pod's devices are unknown or span GPUs."""
    held = [sites.get(p) or frozenset() for p in pods]
    if not pods or not all(held):
        return None
    union = frozenset().union(*held)
    if len({s.gpu for s in union}) != 1:
        return None
    if len(union) == 1 and next(iter(union)).instance is not None:
        return next(iter(union))
    first = min(union, key=lambda s: s.device)
    return Site(first.gpu, first.uuid)


def crashloop_evictions(policy: Policy, node_pods: Sequence[Mapping[str, Any]], now: dt.datetime) -> list[Step]:
    """Evictions for pods that keep failing on a quarantined node, so their controllers place them
    elsewhere; they go through the drain's one eviction path (Eviction API, budgets respected)."""
    steps = []
    for pod in node_pods:
        if P.is_deleting(pod) or P.is_terminal(pod) or P.is_daemonset(pod):
            continue
        if pod["metadata"].get("namespace") in policy.drain.system_namespaces:
            continue
        f = failure(pod, now, policy.restart_loop_window_s)
        if f is None or f[0] < policy.restart_loop_min_restarts:
            continue
        message = (
            f"Evicted {P.key(pod)} (restarted {f[0]}x on this quarantined node) so its controller places it elsewhere"
        )
        steps.append(Step("evict", pod, "crash-looping", reason="EvictedCrashLooping", message=message))
    return steps
