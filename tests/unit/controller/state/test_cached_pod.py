"""The pod cache's form of a pod (``slim.cached_pod``): every fact drains, restart-loop detection and
Kueue's mover read, in read-only slots, the labels and annotations nobody reads left out and the rest
shared by a Job's pods; and the pod index's groups (a gang's group is its workload's, an emptied group
goes). The fleet probe measured the bytes (docs/scaling.md); these hold the form to its readers."""

from __future__ import annotations

import copy
import pickle
import sys
from typing import Any

import pytest

from gpuhealth.api import pods as P
from gpuhealth.api.names import CHECKPOINT_MODE, CHECKPOINT_REQUESTED
from gpuhealth.api.pods import failure, shows_failure
from gpuhealth.api.policy import DrainSettings
from gpuhealth.controller.state.pods import PodIndex
from gpuhealth.controller.state.slim import CachedPod, cached_pod, slim_pod
from gpuhealth.drain import kueue as K
from gpuhealth.drain.plan import plan_drain
from tests.unit.builders import T0

GANG = f"ml/{K.WORKLOAD_LABEL}=job-train"  # Kueue's workload label names the gang (api/pods.py GANG_LABELS)


def rank(
    r: int, job: str = "train", node: str = "n1", restarts: int = 0, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """Rank ``r`` of an indexed Job as the API server sends it (the Job controller's labels, kubectl's)."""
    return {
        "metadata": {
            "name": f"{job}-{r}",
            "namespace": "ml",
            "uid": f"uid-{job}-{r}",
            "resourceVersion": str(100 + r),
            "labels": {
                "app": "llm",
                "batch.kubernetes.io/job-name": job,
                "job-name": job,
                "controller-uid": "c0ffee",
                P.COMPLETION_INDEX: str(r),
                K.WORKLOAD_LABEL: f"job-{job}",
            },
            "annotations": {
                P.COMPLETION_INDEX: str(r),
                CHECKPOINT_MODE: "annotation",
                "kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 500 + "}",
                **(annotations or {}),
            },
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": "c0ffee", "controller": True}
            ],
            "managedFields": [{"manager": "kube-controller-manager"}],
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "train:1"}]},
        "status": {
            "phase": "Running",
            "startTime": "2026-12-03T10:00:00Z",
            "podIP": f"10.0.0.{r}",
            "containerStatuses": [
                {
                    "name": "c",
                    "restartCount": restarts,
                    "ready": True,
                    "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2026-12-03T11:59:00Z"}}
                    if restarts
                    else {},
                }
            ],
        },
    }


def test_a_cached_pod_reads_as_the_full_one_for_every_reader() -> None:
    for r, body in enumerate(
        [rank(0), rank(1, restarts=5), rank(2, annotations={CHECKPOINT_REQUESTED: "2026-12-03T12:00:00Z"})]
    ):
        pod = cached_pod(body)
        assert pod == slim_pod(body)  # the same tree as the slim dict, in slots
        assert P.key(pod) == P.key(body) and P.gang_key(pod) == P.gang_key(body) == GANG
        assert P.workload_key(pod) == P.workload_key(body)
        assert P.is_indexed_job_pod(pod) and not P.is_mirror(pod) and not P.is_deleting(pod)
        assert K.pod_refs(pod) == K.pod_refs(body)
        assert shows_failure(pod) == shows_failure(body) == (r == 1)
        now = T0.replace(year=2026, month=12, day=3)
        assert failure(pod, now, 600) == failure(body, now, 600)
    settings = DrainSettings()
    full = [rank(r, annotations={CHECKPOINT_REQUESTED: "2026-12-03T12:00:00Z"}) for r in range(4)]
    cached = [cached_pod(b) for b in full]
    now = T0.replace(year=2026, month=12, day=3, hour=12, minute=1)
    a = plan_drain("n1", full, {GANG: full}, settings, False, None, now)
    b = plan_drain("n1", cached, {GANG: cached}, settings, False, None, now)
    assert [(s.kind, s.key, s.why) for s in a.steps] == [(s.kind, s.key, s.why) for s in b.steps]
    assert a.record == b.record and a.events == b.events


def test_only_read_labels_and_annotations_are_kept_and_a_jobs_pods_share_them() -> None:
    a, b = cached_pod(rank(0)), cached_pod(rank(7))
    meta = a["metadata"]
    assert set(meta["labels"]) == {"batch.kubernetes.io/job-name", "job-name", P.COMPLETION_INDEX, K.WORKLOAD_LABEL}
    assert set(meta["annotations"]) == {P.COMPLETION_INDEX, CHECKPOINT_MODE}  # not kubectl's copy of the spec
    assert meta["labels"][P.COMPLETION_INDEX] == ""  # read for presence only: the rank is not kept
    assert meta["labels"] is b["metadata"]["labels"] and meta["annotations"] is b["metadata"]["annotations"]
    assert meta["ownerReferences"][0] is b["metadata"]["ownerReferences"][0] and a["spec"] is b["spec"]
    assert "managedFields" not in meta and "podIP" not in a["status"]
    # A pod's own strings are its own (interning them would add an entry per pod, sharing nothing).
    body = rank(3)
    assert cached_pod(body)["metadata"]["uid"] is body["metadata"]["uid"]


def test_a_cached_pod_is_read_only_copies_as_itself_and_is_smaller_than_its_dicts() -> None:
    pod = cached_pod(rank(0))
    with pytest.raises(TypeError):
        pod["metadata"]["deletionTimestamp"] = "now"
    with pytest.raises(TypeError):
        pod.status = {}
    for again in (copy.deepcopy(pod), pickle.loads(pickle.dumps(pod)), copy.copy(pod)):
        assert again == pod and isinstance(again, CachedPod)
    assert "deletionTimestamp" not in pod["metadata"] and pod["metadata"].get("deletionTimestamp") is None
    with pytest.raises(KeyError):
        pod["metadata"]["KEYS"]
    slim = slim_pod(rank(0))
    assert sys.getsizeof(pod) < sys.getsizeof(slim) and sys.getsizeof(pod["metadata"]) < sys.getsizeof(slim["metadata"])
    # A deletion the cache saw is kept on an older copy (state/pods.py: a deletion is never undone).
    assert cached_pod(rank(0), deleted_at="2026-12-03T12:00:00Z")["metadata"]["deletionTimestamp"]


def test_a_gangs_group_is_its_workloads_and_an_emptied_group_goes() -> None:
    index = PodIndex()
    for r in range(3):
        index.put(rank(r, node=f"n{r}"))
    assert index._by_gang[GANG] is index._by_workload[GANG]
    assert [P.key(p) for p in index.gangs()[GANG]] == ["ml/train-0", "ml/train-1", "ml/train-2"]
    plain = {"metadata": {"name": "web", "namespace": "ml", "uid": "w"}, "spec": {"nodeName": "n0"}}
    index.put(plain)
    assert set(index.workloads()) == {GANG, "ml/Pod=web"} and set(index.gangs()) == {GANG}
    for r in range(3):
        index.put(rank(r, node=f"n{r}"), deleted=True)
    index.put(plain, deleted=True)
    assert not index._by_gang and not index._by_workload and not index._by_node and not index.nodes()
