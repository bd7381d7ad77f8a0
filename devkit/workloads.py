"""Workload manifests the demo, the integration tests and the chaos suite run on fake GPU nodes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def indexed_training_job(
    name: str,
    prefer_node: str,
    *,
    mode: str = "annotation",
    ranks: int = 4,
    gpus: int = 2,
    grace: int = 5,
    backoff_limit: int = 20,
    image: str = "trainer",
    namespace: str | None = None,
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """An indexed Job (a gang of ``ranks``) that declares checkpoint ``mode`` and prefers one node.

    The preference (not a requirement) lets the ranks move to another node once gpuhealth drains
    the preferred one. The ranks also prefer each other's node: the scheduler's default spreading
    (PodTopologySpread's system defaults, by hostname, ScheduleAnyway) scores against a node that
    already holds ranks of the same Job, and with three ranks on the preferred node it tied with the
    node preference, so a fourth rank once landed on another node (a chaos run's `job j0 running on`
    wait timed out).
    """
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace,
        "containers": [{"name": "trainer", "image": image, "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "preference": {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": [prefer_node]}
                            ]
                        },
                    }
                ]
            },
            "podAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": {"app": name}},
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            },
        },
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "completionMode": "Indexed",
            "completions": ranks,
            "parallelism": ranks,
            "backoffLimit": backoff_limit,
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": {"gpuhealth.dev/checkpoint": mode}},
                "spec": spec,
            },
        },
    }
