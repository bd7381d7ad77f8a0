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

from gpuhealth.api import pods as P
from gpuhealth.api.names import Signal
from gpuhealth.api.pods import failure
from gpuhealth.api.policy import Policy
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
