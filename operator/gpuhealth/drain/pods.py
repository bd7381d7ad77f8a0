"""Pure facts about pods that drain and restart-loop detection share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuhealth.api.names import CHECKPOINT_COMPLETED, CHECKPOINT_MODE, CHECKPOINT_REQUESTED

__all__ = ["CHECKPOINT_COMPLETED", "CHECKPOINT_MODE", "CHECKPOINT_REQUESTED"]

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"

# Standard labels of multi-pod jobs that live or die together.
GANG_LABELS = (
    "jobset.sigs.k8s.io/jobset-name",
    "training.kubeflow.org/job-name",
    "kueue.x-k8s.io/workload-name",
    "batch.kubernetes.io/job-name",
    "job-name",
)
GANG_OWNER_KINDS = {"JobSet", "PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "TrainJob"}
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # an indexed Job's pod (label or annotation)
TEMPLATE_HASH = "pod-template-hash"  # a ReplicaSet's pods: their Deployment (``workload_key``)
WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"  # set by Kueue on the pods it starts (topology-aware)
WORKLOAD_LABEL = "kueue.x-k8s.io/workload-name"

# Every label and annotation of a pod that drains, restart-loop detection and Kueue's mover read (this
# module, drain/plan.py, drain/kueue.py): the pod cache keeps only these (controller/intake/slim.py).
# Of the presence-only ones just whether they are there is read: their value (an indexed pod's rank,
# a mirror pod's hash) would make every pod's labels its own, where a Job's pods otherwise share one.
READ_LABELS = (*GANG_LABELS, TEMPLATE_HASH, COMPLETION_INDEX, WORKLOAD_LABEL)
READ_ANNOTATIONS = (
    CHECKPOINT_MODE,
    CHECKPOINT_REQUESTED,
    CHECKPOINT_COMPLETED,
    MIRROR_ANNOTATION,
    COMPLETION_INDEX,
    WORKLOAD_ANNOTATION,
)
PRESENCE_ONLY = frozenset({COMPLETION_INDEX, MIRROR_ANNOTATION})


def key(pod: Mapping[str, Any]) -> str:
    m = pod["metadata"]
    return f"{m.get('namespace', '')}/{m['name']}"


def pod_annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return pod["metadata"].get("annotations") or {}


def pod_labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return pod["metadata"].get("labels") or {}


def controller_ref(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return ref  # type: ignore[no-any-return]
    return None


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def is_deleting(pod: Mapping[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def is_daemonset(pod: Mapping[str, Any]) -> bool:
    ref = controller_ref(pod)
    return ref is not None and ref.get("kind") == "DaemonSet"


def is_mirror(pod: Mapping[str, Any]) -> bool:
    return MIRROR_ANNOTATION in pod_annotations(pod)


def is_indexed_job_pod(pod: Mapping[str, Any]) -> bool:
    return COMPLETION_INDEX in pod_annotations(pod) or COMPLETION_INDEX in pod_labels(pod)


def gang_key(pod: Mapping[str, Any]) -> str | None:
    """Pods with the same gang key are checkpointed and evicted together.

    JobSet, Kubeflow training jobs and Kueue workloads by their labels or owners; Jobs only when
    indexed (an indexed Job is a set of ranks; a plain Job's pods are independent).
    """
    ns = pod["metadata"].get("namespace", "")
    lbl = pod_labels(pod)
    for label in GANG_LABELS[:3]:
        if lbl.get(label):
            return f"{ns}/{label}={lbl[label]}"
    ref = controller_ref(pod)
    if ref is not None and ref.get("kind") in GANG_OWNER_KINDS:
        return f"{ns}/{ref['kind']}={ref['name']}"
    if is_indexed_job_pod(pod):
        job = lbl.get("batch.kubernetes.io/job-name") or lbl.get("job-name")
        if not job and ref is not None and ref.get("kind") == "Job":
            job = ref["name"]
        if job:
            return f"{ns}/Job={job}"
    return None


def workload_key(pod: Mapping[str, Any]) -> str:
    """The workload a pod belongs to: Deployment (through its ReplicaSet), StatefulSet, Job, gang, or the pod."""
    ns = pod["metadata"].get("namespace", "")
    gang = gang_key(pod)
    if gang:
        return gang
    ref = controller_ref(pod)
    if ref is None:
        return f"{ns}/Pod={pod['metadata']['name']}"
    name = ref["name"]
    if ref.get("kind") == "ReplicaSet":
        hash_ = pod_labels(pod).get(TEMPLATE_HASH)
        if hash_ and name.endswith("-" + hash_):
            return f"{ns}/Deployment={name[: -len(hash_) - 1]}"
    return f"{ns}/{ref.get('kind')}={name}"
