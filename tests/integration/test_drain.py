"""Checkpoint-aware drain and restart-loop breaking on the real control plane (scheduler, controllers)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, healthy_spec, utcnow, wait_for
from devkit.k8s import ensure_namespace as namespace
from devkit.k8s import xid_event as xid
from devkit.ranks import requested, running
from devkit.workloads import indexed_training_job
from gpuhealth.workload import CheckpointRequest, acknowledge
from tests.integration.conftest import make_nodes, policy_spec


def pods(kube: Kube, ns: str, selector: str) -> list[Any]:
    return [
        p for p in kube.core.list_namespaced_pod(ns, label_selector=selector).items if not p.metadata.deletion_timestamp
    ]


def events(kube: Kube, node: str, reason: str) -> list[Any]:
    return kube.node_events(node, reason)


def test_indexed_training_job_checkpoints_then_moves(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str, tmp_path: Path
) -> None:
    nodes = make_nodes(cluster, group, 3)
    bad = nodes[0]
    ns = namespace(kube, f"train-{group}"[:60])
    kube.apply_policy(
        group, policy_spec(group, safety={"maxUnhealthy": 1}, actions={"drain": {"checkpointTimeout": "2m"}})
    )
    for n in nodes:
        kube.put_report(n, healthy_spec())
    kube.batch.create_namespaced_job(ns, indexed_training_job("llm", bad, node_selector={"gpuhealth-test": group}))
    first = wait_for(lambda: running(kube, ns, "llm", 4), timeout=60, what="4 ranks running")
    assert {p.spec.node_name for p in first} == {bad}

    kube.put_report(bad, healthy_spec(xids=[xid(48)]))
    wait_for(lambda: kube.state(bad) == "Draining", what="Draining")

    asked = wait_for(lambda: requested(kube, ns, "llm"), what="checkpoint requested on all 4 ranks")
    time.sleep(2)
    assert all(p.metadata.deletion_timestamp is None for p in pods(kube, ns, "app=llm")), "no eviction before acks"
    status = kube.report(bad)["status"]["drain"]
    assert status["waitingForCheckpoint"] == 4 and status["total"] == 4
    # Each rank sees the request through its downward-API file and acknowledges through the helper.
    for p in asked:
        f = tmp_path / f"{p.metadata.name}.annotations"
        f.write_text("\n".join(f'{k}="{v}"' for k, v in (p.metadata.annotations or {}).items()))
        req = CheckpointRequest(annotations_file=f)
        assert req.pending() and req.requested_at() is not None
        acknowledge(ns, p.metadata.name, kube.api)
    moved = wait_for(
        lambda: (
            len(p := [x for x in pods(kube, ns, "app=llm") if x.status.phase == "Running" and x.spec.node_name != bad])
            == 4
            and p
        ),
        timeout=90,
        what="4 ranks running again on healthy nodes",
    )
    assert {p.spec.node_name for p in moved} <= set(nodes[1:])
    wait_for(lambda: kube.report(bad)["status"].get("drain", {}).get("phase") == "Completed", what="drain completed")
    wait_for(lambda: kube.state(bad) == "Quarantined", what="quarantined after the drain")
    # Events are posted in the background: wait for all, then check none came twice.
    wait_for(lambda: len(events(kube, bad, "CheckpointRequested")) >= 4, what="4 CheckpointRequested events")
    wait_for(lambda: len(events(kube, bad, "Evicted")) >= 4, what="4 Evicted events")
    time.sleep(1)
    assert len(events(kube, bad, "CheckpointRequested")) == 4
    assert len(events(kube, bad, "Evicted")) == 4


def test_checkpoint_timeout_evicts_anyway(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    nodes = make_nodes(cluster, group, 2)
    bad = nodes[0]
    ns = namespace(kube, f"timeout-{group}"[:60])
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"maxUnhealthy": 1},
            actions={"drain": {"checkpointTimeout": "3s", "onCheckpointTimeout": "Evict"}},
        ),
    )
    for n in nodes:
        kube.put_report(n, healthy_spec())
    kube.batch.create_namespaced_job(ns, indexed_training_job("slow", bad, node_selector={"gpuhealth-test": group}))
    wait_for(lambda: running(kube, ns, "slow", 4), timeout=60, what="running")
    kube.put_report(bad, healthy_spec(xids=[xid(48)]))
    wait_for(lambda: events(kube, bad, "CheckpointTimeout"), timeout=30, what="timeout event")
    wait_for(lambda: len(events(kube, bad, "Evicted")) == 4, timeout=30, what="evicted without ack")


def test_signal_mode_uses_pod_grace_period_and_budget_blocks_then_allows(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    nodes = make_nodes(cluster, group, 2)
    bad = nodes[0]
    ns = namespace(kube, f"signal-{group}"[:60])
    kube.apply_policy(group, policy_spec(group, safety={"maxUnhealthy": 1}))
    for n in nodes:
        kube.put_report(n, healthy_spec())
    job = indexed_training_job("sig", bad, mode="signal", grace=45, node_selector={"gpuhealth-test": group})
    kube.batch.create_namespaced_job(ns, job)
    wait_for(
        lambda: len([x for x in pods(kube, ns, "app=sig") if x.status.phase == "Running"]) == 4,
        timeout=60,
        what="running",
    )
    kube.policy.create_namespaced_pod_disruption_budget(
        ns, {"metadata": {"name": "sig"}, "spec": {"minAvailable": 4, "selector": {"matchLabels": {"app": "sig"}}}}
    )
    wait_for(
        lambda: kube.policy.read_namespaced_pod_disruption_budget("sig", ns).status.observed_generation,
        what="PDB observed",
    )
    # System namespaces are left alone.
    kube.core.create_namespaced_pod(
        "kube-system",
        {
            "metadata": {"name": f"sys-{group}"[:60]},
            "spec": {"nodeName": bad, "containers": [{"name": "c", "image": "x"}]},
        },
    )
    # So are DaemonSet pods (a node agent on every node of the group).
    kube.apps.create_namespaced_daemon_set(
        ns,
        {
            "metadata": {"name": "node-agent"},
            "spec": {
                "selector": {"matchLabels": {"app": "node-agent"}},
                "template": {
                    "metadata": {"labels": {"app": "node-agent"}},
                    "spec": {
                        "nodeSelector": {"gpuhealth-test": group},
                        "containers": [{"name": "a", "image": "agent"}],
                    },
                },
            },
        },
    )
    ds_pod = wait_for(
        lambda: [
            p for p in pods(kube, ns, "app=node-agent") if p.spec.node_name == bad and p.status.phase == "Running"
        ],
        timeout=60,
        what="DaemonSet pod on the node",
    )[0]
    kube.put_report(bad, healthy_spec(xids=[xid(48)]))
    wait_for(lambda: events(kube, bad, "EvictionBlocked"), timeout=30, what="budget blocks the eviction")
    wait_for(lambda: kube.report(bad)["status"].get("drain", {}).get("blockedByBudget", 0) >= 1, what="drain status")
    assert not events(kube, bad, "Evicted")
    kube.policy.patch_namespaced_pod_disruption_budget("sig", ns, {"spec": {"minAvailable": 0}})
    wait_for(lambda: len(events(kube, bad, "Evicted")) == 4, timeout=90, what="evicted once the budget allows")
    # SIGTERM with the pod's own grace period: the eviction did not shorten it.
    terminating = [
        p for p in kube.core.list_namespaced_pod(ns, label_selector="app=sig").items if p.metadata.deletion_timestamp
    ]
    assert terminating and all(p.metadata.deletion_grace_period_seconds == 45 for p in terminating)
    assert kube.core.read_namespaced_pod(f"sys-{group}"[:60], "kube-system").metadata.deletion_timestamp is None
    assert kube.core.read_namespaced_pod(ds_pod.metadata.name, ns).metadata.deletion_timestamp is None
    assert not any("node-agent" in e.message for e in events(kube, bad, "Evicted"))


def _crash(kube: Kube, pod: Any, restarts: int = 5) -> None:
    ns, name = pod.metadata.namespace, pod.metadata.name
    kube.core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {"kwok.x-k8s.io/status": "custom"}}})
    now = utcnow()[:19] + "Z"
    kube.core.patch_namespaced_pod_status(
        name,
        ns,
        {
            "status": {
                "containerStatuses": [
                    {
                        "name": pod.spec.containers[0].name,
                        "image": "x",
                        "imageID": "",
                        "ready": False,
                        "restartCount": restarts,
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "lastState": {
                            "terminated": {"exitCode": 1, "reason": "Error", "finishedAt": now, "startedAt": now}
                        },
                    }
                ]
            }
        },
    )


def test_crashing_workloads_point_at_the_node(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    nodes = make_nodes(cluster, group, 3)
    bad = nodes[0]
    ns = namespace(kube, f"loop-{group}"[:60])
    kube.apply_policy(
        group,
        policy_spec(
            group, safety={"maxUnhealthy": 1}, restartLoop={"minWorkloads": 2, "minRestarts": 3, "window": "10m"}
        ),
    )
    for n in nodes:
        kube.put_report(n, healthy_spec())
    for app in ("svc-a", "svc-b"):
        kube.apps.create_namespaced_deployment(
            ns,
            {
                "metadata": {"name": app},
                "spec": {
                    "replicas": 3,
                    "selector": {"matchLabels": {"app": app}},
                    "template": {
                        "metadata": {"labels": {"app": app}},
                        "spec": {
                            "containers": [
                                {"name": "c", "image": app, "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                            ],
                            "nodeSelector": {"gpuhealth-test": group},
                            "topologySpreadConstraints": [
                                {
                                    "maxSkew": 1,
                                    "topologyKey": "kubernetes.io/hostname",
                                    "whenUnsatisfiable": "DoNotSchedule",
                                    "nodeTaintsPolicy": "Honor",
                                    "labelSelector": {"matchLabels": {"app": app}},
                                }
                            ],
                        },
                    },
                },
            },
        )
    for app in ("svc-a", "svc-b"):

        def on_every_node(app: str = app) -> bool:
            return len([p for p in pods(kube, ns, f"app={app}") if p.status.phase == "Running"]) == 3

        wait_for(on_every_node, timeout=60, what=f"{app} on every node")
    for app in ("svc-a", "svc-b"):
        (victim,) = [p for p in pods(kube, ns, f"app={app}") if p.spec.node_name == bad]
        _crash(kube, victim)
    taint = wait_for(lambda: kube.our_taint(bad), timeout=30, what="node quarantined for the restart loop")
    assert taint["value"] == "RestartLoop"
    ev = wait_for(lambda: kube.node_events(bad, "Quarantined"), what="Quarantined event")[0].message
    assert "svc-a" in ev and "svc-b" in ev and "restarted 5x" in ev
    # The crash-looping pods are evicted from the quarantined node and run elsewhere.
    wait_for(lambda: len(events(kube, bad, "EvictedCrashLooping")) == 2, timeout=30, what="crash-loopers evicted")
    for app in ("svc-a", "svc-b"):

        def elsewhere(app: str = app) -> bool:
            up = [p for p in pods(kube, ns, f"app={app}") if p.status.phase == "Running"]
            return len([p for p in up if p.spec.node_name != bad]) == 3

        wait_for(elsewhere, timeout=60, what=f"{app} runs elsewhere")


def test_flapping_node_waits_for_a_human(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"probation": "1s", "flapping": {"maxQuarantines": 3, "window": "1h"}},
            rules={"xid": {"overrides": [{"code": 79, "action": "cordon"}]}},
        ),
    )
    for i in range(2):
        kube.put_report(node, healthy_spec(xids=[xid(79)]))
        wait_for(lambda: kube.state(node) == "Quarantined", what=f"quarantine {i + 1}")
        kube.put_report(node, healthy_spec(xids=[]))
        wait_for(lambda: kube.state(node) == "Healthy", timeout=20, what=f"recovery {i + 1}")
    old = xid(79)
    kube.put_report(node, healthy_spec(xids=[old]))
    wait_for(lambda: kube.state(node) == "AwaitingRepair", what="third quarantine -> AwaitingRepair")
    time.sleep(4)
    kube.put_report(node, healthy_spec(xids=[old]))  # a GPU reset without reboot: the agent still lists it
    assert kube.state(node) == "AwaitingRepair" and kube.our_taint(node) is not None, "never returned automatically"
    wait_for(lambda: kube.node_events(node, "Flapping"), what="Flapping event")
    kube.core.patch_node(node, {"metadata": {"annotations": {"gpuhealth.dev/release": utcnow()}}})
    wait_for(lambda: kube.state(node) == "Healthy", timeout=30, what="released, probation, healthy")
    wait_for(lambda: kube.our_taint(node) is None, what="taint lifted after the verdict")
    assert "gpuhealth.dev/release" not in (kube.node(node)["metadata"].get("annotations") or {})


def test_an_eviction_planned_from_a_pod_changed_since_is_refused(cluster: LocalCluster, kube: Kube, group: str) -> None:
    """The real API server holds an eviction to the pod's resourceVersion: what keeps a second replica,
    acting for a moment beside the first (Kopf peering is not a lock), from evicting a pod again."""
    from kubernetes.client.rest import ApiException

    from gpuhealth.kube.client import Kube as OperatorKube

    (node,) = make_nodes(cluster, group, 1)
    ns = namespace(kube, f"evict-rv-{group}"[:60])
    pod = kube.core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "p"},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 600,
                "containers": [{"name": "c", "image": "x"}],
            },
        },
    )
    planned = pod.metadata.resource_version
    ops = OperatorKube(kube.api)
    kube.core.patch_namespaced_pod("p", ns, {"metadata": {"annotations": {"seen": "yes"}}})  # changed since
    try:
        ops.evict_pod(ns, "p", pod.metadata.uid, planned)
    except ApiException as e:
        assert e.status == 409, e
    else:
        raise AssertionError("an eviction at a stale resourceVersion must be refused")
    assert kube.core.read_namespaced_pod("p", ns).metadata.deletion_timestamp is None
    current = kube.core.read_namespaced_pod("p", ns).metadata.resource_version
    ops.evict_pod(ns, "p", pod.metadata.uid, current)
    assert kube.core.read_namespaced_pod("p", ns).metadata.deletion_timestamp is not None
    try:  # the same plan, sent again (the other replica): refused, the pod was changed by the eviction
        ops.evict_pod(ns, "p", pod.metadata.uid, current)
    except ApiException as e:
        assert e.status == 409, e
    else:
        raise AssertionError("a second eviction from the same plan must be refused")
