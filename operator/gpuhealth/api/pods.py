"""Pure facts about pods that drain and restart-loop detection share: gangs, workloads, checkpoint
annotations, and whether a pod is failing (restarts, failed exits, a crash loop)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from gpuhealth.api.names import CHECKPOINT_COMPLETED, CHECKPOINT_MODE, CHECKPOINT_REQUESTED
from gpuhealth.api.timeutil import parse_time

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
# module, drain/plan.py, drain/kueue.py): the pod cache keeps only these (controller/state/slim.py).
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
