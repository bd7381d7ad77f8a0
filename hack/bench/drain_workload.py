"""The drain storm's workload and its audit-log figures (``--phases drain``, hack/bench/drain.py): which
pods run on the drained nodes, their manifests, and what the operator's pod writes say (evictions per
second, pods evicted or asked twice, the PDB's fewest Ready pods).

Pure, so each piece is unit-tested against hand-made histories (tests/unit/bench/test_resilience.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from devkit.podorder import PodWrite, order_problems

DRAIN_NAMESPACE = "bench-drain"
DRAIN_XID = 74  # NVLink error: a node-scope fault the bench's policy answers with a drain (XID 79 only cordons)
CHECKPOINT = "gpuhealth.dev/checkpoint"
REQUESTED = "gpuhealth.dev/checkpoint-requested"
COMPLETED = "gpuhealth.dev/checkpoint-completed"
GANG_LABEL = "jobset.sigs.k8s.io/jobset-name"  # a gang: checkpointed and evicted together (api/pods.py)
PDB_APP, PDB_REPLICAS = "pdb-app", 3


# -- the drain storm's workload (pure) ----------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadPod:
    name: str
    node: str
    mode: str  # the pod's checkpoint mode: "annotation" (the handshake) or "signal" (finishes on SIGTERM)
    gang: str | None = None


def drain_mix(nodes: Sequence[str], per_node: int) -> list[WorkloadPod]:
    """The drain storm's bare pods, ``per_node`` on each node: two ranks of a gang spanning a pair of
    nodes (annotation mode: the whole gang checkpoints, then leaves together), then alternately a pod
    that acknowledges a checkpoint request and one that finishes on SIGTERM."""
    out: list[WorkloadPod] = []
    for i, node in enumerate(nodes):
        ranks = min(2, per_node) if len(nodes) > 1 else 0
        gang = f"gang-{i // 2:04d}" if i // 2 * 2 + 1 < len(nodes) else None
        if gang is None:
            ranks = 0  # the odd node out has no partner
        for r in range(ranks):
            out.append(WorkloadPod(f"{gang}-{i % 2}-{r}", node, "annotation", gang))
        for k in range(per_node - ranks):
            mode = "annotation" if k % 2 == 0 else "signal"
            out.append(WorkloadPod(f"{'ckpt' if mode == 'annotation' else 'term'}-{node}-{k}", node, mode))
    return out


def pod_manifest(p: WorkloadPod) -> dict[str, Any]:
    labels = {"bench-drain": "true", **({GANG_LABEL: p.gang} if p.gang else {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": p.name,
            "namespace": DRAIN_NAMESPACE,
            "labels": labels,
            "annotations": {CHECKPOINT: p.mode},
        },
        "spec": {
            "nodeName": p.node,
            "containers": [{"name": "work", "image": "train:latest"}],
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def pdb_objects() -> list[dict[str, Any]]:
    """A small Deployment (pods that finish on SIGTERM) on the nodes labelled bench-pdb, and its PDB."""
    labels = {"app": PDB_APP}
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": PDB_APP, "namespace": DRAIN_NAMESPACE},
            "spec": {
                "replicas": PDB_REPLICAS,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels, "annotations": {CHECKPOINT: "signal"}},
                    "spec": {
                        "nodeSelector": {"bench-pdb": "true"},
                        "containers": [{"name": "serve", "image": "serve:latest"}],
                        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                        "terminationGracePeriodSeconds": 0,
                    },
                },
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": PDB_APP, "namespace": DRAIN_NAMESPACE},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
        },
    ]


def eviction_figures(writes: Sequence[PodWrite], t0: float) -> dict[str, Any]:
    """Evictions and checkpoint requests of one drain storm, from the operator's successful pod writes.

    ``evictions_per_s`` is the sustained rate, first eviction to last ((n - 1) / span: n evictions
    have n - 1 gaps); the time from the faults to the last eviction is beside it.
    """
    evicted = sorted(w.at.timestamp() for w in writes if w.kind == "evict")
    requests = sum(1 for w in writes if w.kind == "request")
    span = evicted[-1] - evicted[0] if len(evicted) > 1 else 0.0
    per_s: list[int] = []
    for t in evicted:
        i = int(t - evicted[0])
        per_s.extend([0] * (i + 1 - len(per_s)))
        per_s[i] += 1
    return {
        "evictions": len(evicted),
        "checkpoint_requests": requests,
        "evictions_per_s": round((len(evicted) - 1) / span, 1) if span > 0 else None,
        "peak_evictions_in_a_second": max(per_s, default=0),
        "first_eviction_s": round(evicted[0] - t0, 2) if evicted else None,
        "last_eviction_s": round(evicted[-1] - t0, 2) if evicted else None,
    }


def double_actions(writes: Sequence[PodWrite], needs_request: Callable[[str], bool]) -> list[str]:
    """Pods evicted or asked more than once, or evicted before being asked (devkit/podorder.py)."""
    return order_problems(writes, needs_request)


def min_ready(samples: Iterable[tuple[float, int]], after: float) -> int | None:
    """The fewest Ready pods of the PDB's Deployment at any sample from ``after`` on."""
    inside = [n for t, n in samples if t >= after]
    return min(inside) if inside else None
