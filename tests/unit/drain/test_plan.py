"""The pure drain planner and the gang rule: what is asked, what is evicted, and when."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpuhealth.api.names import CHECKPOINT_COMPLETED, CHECKPOINT_MODE, CHECKPOINT_REQUESTED
from gpuhealth.api.pods import gang_key, workload_key
from gpuhealth.api.policy import DrainSettings
from gpuhealth.api.status import DrainRecord
from gpuhealth.api.timeutil import format_time
from gpuhealth.drain.plan import plan_drain

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
NODE = "gpu-a"


def pod(
    name: str,
    *,
    ns: str = "ml",
    node: str = NODE,
    mode: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner: tuple[str, str] | None = None,
    deleting: bool = False,
    phase: str = "Running",
) -> dict[str, Any]:
    ann = dict(annotations or {})
    if mode is not None:
        ann[CHECKPOINT_MODE] = mode
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels or {}}
    meta["annotations"] = ann
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = format_time(T0)
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": phase}}


def kinds(plan: Any) -> list[tuple[str, str]]:
    return sorted((s.kind, s.pod["metadata"]["name"]) for s in plan.steps)


# -- gang_key ---------------------------------------------------------------------------------------


def test_gang_key_names_jobsets_training_jobs_and_kueue_workloads_by_label() -> None:
    assert gang_key(pod("a", labels={"jobset.sigs.k8s.io/jobset-name": "js"})) == "ml/jobset.sigs.k8s.io/jobset-name=js"
    assert gang_key(pod("a", labels={"kueue.x-k8s.io/workload-name": "w"})) == "ml/kueue.x-k8s.io/workload-name=w"
    assert gang_key(pod("a", owner=("PyTorchJob", "pt"))) == "ml/PyTorchJob=pt"


def test_only_an_indexed_job_is_a_gang() -> None:
    ranks = {"batch.kubernetes.io/job-name": "train", "batch.kubernetes.io/job-completion-index": "0"}
    assert gang_key(pod("r0", labels=ranks, owner=("Job", "train"))) == "ml/Job=train"
    plain = pod("p", labels={"batch.kubernetes.io/job-name": "batch"}, owner=("Job", "batch"))
    assert gang_key(plain) is None
    assert workload_key(plain) == "ml/Job=batch"


def test_a_deployments_pod_is_its_deployments_workload_not_a_gang() -> None:
    p = pod("web-5d9c8-x", labels={"pod-template-hash": "5d9c8"}, owner=("ReplicaSet", "web-5d9c8"))
    assert gang_key(p) is None
    assert workload_key(p) == "ml/Deployment=web"
    assert workload_key(pod("lone")) == "ml/Pod=lone"


# -- plan_drain -------------------------------------------------------------------------------------


def test_a_pod_that_checkpoints_is_asked_first_and_evicted_only_after_its_acknowledgement() -> None:
    s = DrainSettings()
    p = pod("train", mode="annotation")
    first = plan_drain(NODE, [p], {}, s, False, None, T0)
    assert kinds(first) == [("request", "train")]
    assert first.record["phase"] == "Running" and not first.complete
    asked = pod("train", mode="annotation", annotations={CHECKPOINT_REQUESTED: format_time(T0)})
    waiting = plan_drain(NODE, [asked], {}, s, False, first.record, T0 + dt.timedelta(seconds=5))
    assert kinds(waiting) == [] and waiting.record["waitingForCheckpoint"] == 1
    acked = pod(
        "train",
        mode="annotation",
        annotations={
            CHECKPOINT_REQUESTED: format_time(T0),
            CHECKPOINT_COMPLETED: format_time(T0 + dt.timedelta(seconds=10)),
        },
    )
    done = plan_drain(NODE, [acked], {}, s, False, waiting.record, T0 + dt.timedelta(seconds=20))
    assert kinds(done) == [("evict", "train")]
    assert done.steps[0].why == "checkpoint acknowledged"


def test_a_checkpoint_that_never_comes_is_evicted_at_the_timeout_and_announced_once() -> None:
    s = DrainSettings(checkpoint_timeout_s=60)
    asked = pod("train", mode="annotation", annotations={CHECKPOINT_REQUESTED: format_time(T0)})
    rec = plan_drain(NODE, [asked], {}, s, False, None, T0).record
    late = plan_drain(NODE, [asked], {}, s, False, rec, T0 + dt.timedelta(seconds=61))
    assert kinds(late) == [("evict", "train")]
    assert [e[1] for e in late.events] == ["CheckpointTimeout"]
    again = plan_drain(NODE, [asked], {}, s, False, late.record, T0 + dt.timedelta(seconds=62))
    assert [e[1] for e in again.events] == []


def test_wait_on_timeout_keeps_the_pod_and_says_so_once() -> None:
    s = DrainSettings(checkpoint_timeout_s=60, on_checkpoint_timeout="Wait")
    asked = pod("train", mode="annotation", annotations={CHECKPOINT_REQUESTED: format_time(T0)})
    rec = plan_drain(NODE, [asked], {}, s, False, None, T0).record
    late = plan_drain(NODE, [asked], {}, s, False, rec, T0 + dt.timedelta(seconds=61))
    assert kinds(late) == [] and [e[1] for e in late.events] == ["CheckpointOverdue"]
    again = plan_drain(NODE, [asked], {}, s, False, late.record, T0 + dt.timedelta(seconds=90))
    assert kinds(again) == [] and again.events == []


def test_a_gang_moves_together_its_ranks_on_healthy_nodes_too() -> None:
    ranks = [
        pod(
            f"r{i}", node=NODE if i == 0 else f"gpu-{i}", labels={"jobset.sigs.k8s.io/jobset-name": "js"}, mode="signal"
        )
        for i in range(3)
    ]
    plan = plan_drain(
        NODE, [ranks[0]], {"ml/jobset.sigs.k8s.io/jobset-name=js": ranks}, DrainSettings(), False, None, T0
    )
    assert kinds(plan) == [("evict", "r0"), ("evict", "r1"), ("evict", "r2")]
    assert plan.record["total"] == 1  # only this node's pods count towards its drain


def test_a_gang_that_survives_rank_loss_loses_only_the_rank_on_the_bad_node() -> None:
    ranks = [
        pod(f"r{i}", node=NODE if i == 0 else "gpu-b", labels={"jobset.sigs.k8s.io/jobset-name": "js"}) for i in (0, 1)
    ]
    s = DrainSettings(gang_survives_rank_loss=True)
    plan = plan_drain(NODE, [ranks[0]], {"ml/jobset.sigs.k8s.io/jobset-name=js": ranks}, s, True, None, T0)
    assert kinds(plan) == [("evict", "r0")]


def test_a_pod_without_a_checkpoint_waits_for_max_wait_unless_the_fault_is_fatal() -> None:
    s = DrainSettings(max_wait_s=300)
    p = pod("batch")
    assert kinds(plan_drain(NODE, [p], {}, s, False, None, T0)) == []
    rec = plan_drain(NODE, [p], {}, s, False, None, T0).record
    assert kinds(plan_drain(NODE, [p], {}, s, False, rec, T0 + dt.timedelta(seconds=301))) == [("evict", "batch")]
    fatal = plan_drain(NODE, [p], {}, s, True, None, T0)
    assert kinds(fatal) == [("evict", "batch")] and "fatal" in fatal.steps[0].why


def test_daemonsets_system_namespaces_finished_and_deleting_pods_are_not_evicted() -> None:
    s = DrainSettings()
    left_alone = [
        pod("ds", owner=("DaemonSet", "agent")),
        pod("dns", ns="kube-system"),
        pod("done", phase="Succeeded"),
        pod("going", deleting=True, mode="signal"),
    ]
    plan = plan_drain(NODE, left_alone, {}, s, True, None, T0)
    assert kinds(plan) == []
    assert not plan.complete  # the deleting pod is still there


def test_a_drain_is_complete_when_no_drainable_pod_is_left_and_its_record_survives_a_restart() -> None:
    s = DrainSettings()
    p = pod("web", mode="signal")
    plan = plan_drain(NODE, [p], {}, s, False, None, T0)
    assert kinds(plan) == [("evict", "web")]
    rec = plan.record
    rec["pods"]["uid-web"]["evictedAt"] = format_time(T0)
    # A restarted operator plans from the persisted record: the pod evicted already is not evicted again.
    again = plan_drain(NODE, [p], {}, s, False, rec, T0 + dt.timedelta(seconds=1))
    assert kinds(again) == []
    done = plan_drain(NODE, [], {}, s, False, again.record, T0 + dt.timedelta(seconds=2))
    assert done.complete and done.record["phase"] == "Completed" and done.record["evicted"] == 1


def test_a_refused_eviction_waits_for_its_retry_time() -> None:
    s = DrainSettings()
    p = pod("web", mode="signal")
    rec = plan_drain(NODE, [p], {}, s, False, None, T0).record
    rec["pods"]["uid-web"]["retryAt"] = format_time(T0 + dt.timedelta(seconds=30))
    assert kinds(plan_drain(NODE, [p], {}, s, False, rec, T0 + dt.timedelta(seconds=10))) == []
    assert kinds(plan_drain(NODE, [p], {}, s, False, rec, T0 + dt.timedelta(seconds=31))) == [("evict", "web")]


def test_force_delete_replaces_the_eviction_once_allowed_and_due() -> None:
    s = DrainSettings(allow_force_delete=True, force_delete_after_s=600, max_wait_s=300)
    p = pod("stuck")
    rec = plan_drain(NODE, [p], {}, s, False, None, T0).record
    plan = plan_drain(NODE, [p], {}, s, False, rec, T0 + dt.timedelta(seconds=601))
    assert kinds(plan) == [("force-delete", "stuck")]


def test_a_gang_that_has_left_the_node_asks_nothing_of_its_replacements_elsewhere() -> None:
    # The ranks on the bad node are terminating (evicted, or their Kueue Workload moved); the Job has
    # already started replacements on a healthy node: those are not this drain's to ask or evict.
    ranks = {"batch.kubernetes.io/job-name": "train", "batch.kubernetes.io/job-completion-index": "0"}
    old = [pod(f"old{i}", mode="annotation", labels=ranks, owner=("Job", "train"), deleting=True) for i in range(2)]
    new = [pod(f"new{i}", mode="annotation", labels=ranks, owner=("Job", "train"), node="gpu-b") for i in range(2)]
    plan = plan_drain(NODE, old, {"ml/Job=train": old + new}, DrainSettings(), False, None, T0)
    assert kinds(plan) == []
    assert not plan.complete  # the old ranks are still on the node until they are gone


def test_a_leaving_gangs_member_whose_eviction_a_budget_refused_is_still_evicted() -> None:
    ranks = {"batch.kubernetes.io/job-name": "train", "batch.kubernetes.io/job-completion-index": "0"}
    here = pod("r0", mode="signal", labels=ranks, owner=("Job", "train"), deleting=True)
    blocked = pod("r1", mode="signal", labels=ranks, owner=("Job", "train"), node="gpu-b")
    fresh = pod("r1-new", mode="signal", labels=ranks, owner=("Job", "train"), node="gpu-c")
    record = {
        "phase": "Running",
        "startedAt": format_time(T0),
        "pods": {
            "uid-r0": {"pod": "ml/r0", "node": NODE, "evictedAt": format_time(T0)},
            "uid-r1": {"pod": "ml/r1", "node": "gpu-b", "blocked": 1},
        },
    }
    plan = plan_drain(NODE, [here], {"ml/Job=train": [here, blocked, fresh]}, DrainSettings(), False, record, T0)  # type: ignore[arg-type]
    assert kinds(plan) == [("evict", "r1")]


# -- a gang across two draining nodes ----------------------------------------------------------------


def test_a_gang_member_asked_by_the_other_nodes_running_drain_is_not_asked_again() -> None:
    """Node b's drain started 7 s after node a's, which asked the whole gang already: b must not ask
    a second time (the bench's drain storm saw every cross-node rank asked twice under load)."""
    gang = {"jobset.sigs.k8s.io/jobset-name": "js"}
    asked = {CHECKPOINT_REQUESTED: format_time(T0 + dt.timedelta(seconds=1))}
    ranks = [
        pod("r0", node="gpu-a", mode="annotation", labels=gang, annotations=asked),
        pod("r1", node="gpu-b", mode="annotation", labels=gang, annotations=asked),
    ]
    members = {gang_key(ranks[0]) or "": ranks}
    b_started = T0 + dt.timedelta(seconds=8)
    record = DrainRecord(phase="Running", startedAt=format_time(b_started), pods={})
    now = b_started + dt.timedelta(seconds=1)
    settings = DrainSettings()
    alone = plan_drain("gpu-b", [ranks[1]], members, settings, False, record, now)
    assert kinds(alone) == [("request", "r0"), ("request", "r1")]  # before: a's request looked stale
    seen = plan_drain(
        "gpu-b",
        [ranks[1]],
        members,
        settings,
        False,
        record,
        now,
        other_drains={"gpu-a": T0},
    )
    assert kinds(seen) == []  # waiting for the acknowledgements of a's request
    done = {**asked, CHECKPOINT_COMPLETED: format_time(T0 + dt.timedelta(seconds=2))}
    acked = [
        pod(r["metadata"]["name"], node=r["spec"]["nodeName"], mode="annotation", labels=gang, annotations=done)
        for r in ranks
    ]
    evict = plan_drain(
        "gpu-b",
        [acked[1]],
        {gang_key(acked[0]) or "": acked},
        settings,
        False,
        record,
        now,
        other_drains={"gpu-a": T0},
    )
    assert kinds(evict) == [("evict", "r0"), ("evict", "r1")]


def test_a_patient_drain_asks_waits_for_the_acknowledgement_and_never_forces() -> None:
    """moveRunningWork: AtNextCheckpoint (a slow, not broken, fault): no eviction without an ack."""
    s = DrainSettings(checkpoint_timeout_s=60, max_wait_s=300, allow_force_delete=True, force_delete_after_s=600)
    patient = s.patient()
    asked = pod("train", mode="annotation", annotations={CHECKPOINT_REQUESTED: format_time(T0)})
    plain = pod("batch")
    rec = plan_drain(NODE, [asked, plain], {}, patient, False, None, T0).record
    day = T0 + dt.timedelta(days=1)
    late = plan_drain(NODE, [asked, plain], {}, patient, False, rec, day)
    assert kinds(late) == [] and not late.complete  # neither the unacknowledged nor the plain pod goes
    assert [e[1] for e in late.events] == ["CheckpointOverdue"]
    acked = pod(
        "train",
        mode="annotation",
        annotations={CHECKPOINT_REQUESTED: format_time(T0), CHECKPOINT_COMPLETED: format_time(day)},
    )
    assert kinds(plan_drain(NODE, [acked, plain], {}, patient, False, late.record, day)) == [("evict", "train")]
