"""The existing fleet's GPU work: a checkpointing training job on one node, a device-plugin inference
Deployment on the rest, and 8 one-GPU DRA pods on the DRA node with the thermal fault."""

from __future__ import annotations

from typing import Any

from devkit import dra
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, wait_for
from devkit.workloads import indexed_training_job
from hack.demo import kueue
from hack.demo.common import NS, claim_deployment, running

GPU_PRESENT = "nvidia.com/gpu.present"


def dra_serving(node: str) -> list[dict[str, Any]]:
    """Eight 1-GPU pods on ``node`` whose GPUs come from DRA claims (the real scheduler allocates them)."""
    return [dra.claim_template(NS, "one-gpu", 1), claim_deployment("dra-serving", "one-gpu", node, 8)]


def run_workloads(
    cluster: LocalCluster, kube: Kube, training_node: str, queued: bool = False, image: str | None = None
) -> None:
    """GPU work: a checkpointing training job (4 ranks) on one node, an inference Deployment on the rest.

    ``queued``: the training job runs under Kueue (``hack/demo/kueue.py``), through a queue with
    gpuhealth's AdmissionCheck whose flavor stands for the GPU nodes. ``image``: the ranks' image when
    they run in real containers (a real node's), instead of KWOK's name-only one."""
    cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}])
    wait_for(lambda: kube.core.read_namespaced_service_account("default", NS), what="namespace ready")
    job = indexed_training_job("llm-pretrain", training_node, image=image or "llm-trainer:1.4", namespace=NS)
    if queued:
        kueue.create_queue(cluster, {GPU_PRESENT: "true"})
        job = kueue.queued(job)
    cluster.apply_objects([job])
    wait_for(lambda: len(running(kube, "llm-pretrain")) == 4, timeout=90, what="training ranks running")
    cluster.apply_objects(
        [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "inference", "namespace": NS},
                "spec": {
                    "replicas": 8,
                    "selector": {"matchLabels": {"app": "inference"}},
                    "template": {
                        "metadata": {"labels": {"app": "inference"}},
                        "spec": {
                            "containers": [
                                {
                                    "name": "server",
                                    "image": "inference:latest",
                                    "resources": {"limits": {"nvidia.com/gpu": "4"}},
                                }
                            ],
                        },
                    },
                },
            }
        ]
    )
    wait_for(lambda: len(running(kube, "inference")) >= 8, timeout=90, what="inference pods running")
