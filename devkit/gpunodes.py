"""Fake GPU nodes as KWOK runs them: Node objects labelled and sized like real 8-GPU H100 nodes (what
NVIDIA's GPU feature discovery labels and the device plugin advertises), so the scheduler places GPU
pods on them and gpuhealth's Node selector picks them up."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GPU_LABELS = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.count": "8",
    "accelerator": "nvidia-h100",
    "type": "kwok",
}


def gpu_node_manifest(
    name: str, gpus: int = 8, labels: Mapping[str, str] | None = None, device_plugin: bool = True
) -> dict[str, Any]:
    """A Node that looks like a real 8-GPU node to the scheduler and to gpuhealth, run by KWOK.
    ``device_plugin=False``: a DRA node, whose GPUs only its driver's ResourceSlices publish (no
    ``nvidia.com/gpu`` resource)."""
    labels = {
        **GPU_LABELS,
        "kubernetes.io/hostname": name,
        "nvidia.com/gpu.count": str(gpus),
        **(labels or {}),
    }
    resources = {"cpu": "64", "memory": "1Ti", "pods": "110"}
    if device_plugin:
        resources["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {"capacity": resources, "allocatable": resources},
    }


def status_write(node: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """A strategic merge patch through ``nodes/status`` as the API server applies it to ``node``, for the
    in-memory Kube ports (the unit tests' ``FakeKube``, the fleet probe's ``MemKube``): the patch's
    metadata is kept and its spec dropped (the Node status strategy resets spec), and its conditions
    are merged into the node's by type, their merge key. Returned as a plain merge patch for the
    port's own merge."""
    new = list((patch.get("status") or {}).get("conditions") or [])
    types = {c["type"] for c in new}
    held = [c for c in (node.get("status") or {}).get("conditions") or [] if c["type"] not in types]
    out: dict[str, Any] = {"status": {**(patch.get("status") or {}), "conditions": held + new}}
    if patch.get("metadata"):
        out["metadata"] = dict(patch["metadata"])
    return out
