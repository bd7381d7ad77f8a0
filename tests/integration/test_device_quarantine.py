"""Per-GPU quarantine end to end: the operator process, the real API server, the real scheduler.

A DRA node (slices published as NVIDIA's driver would, with the UUIDs the hand-written reports
use) runs pods whose GPUs come from ResourceClaimTemplates. An uncorrected ECC error on one GPU
must take out that GPU only (a DeviceTaintRule, no cordon, no node taint), move only the pod that
holds it (checkpoint first), keep the scheduler off it, and give it back after probation.
"""

from __future__ import annotations

from typing import Any

from devkit import dra
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, ensure_namespace, healthy_spec, utcnow, wait_for
from gpuhealth.api.names import CHECKPOINT_COMPLETED, CHECKPOINT_REQUESTED
from tests.integration.conftest import make_dra_node, make_nodes, policy_spec

TAINT = "gpuhealth.dev/unhealthy"


def ecc(*bad: int) -> dict[str, Any]:
    spec = healthy_spec()
    for i in bad:
        spec["devices"][i]["ecc"]["volatileUncorrected"] = 1
    return spec


def rules_of(kube: Kube, node: str) -> dict[str, dict[str, Any]]:
    items = kube.custom.list_cluster_custom_object(dra.G, dra.V, "devicetaintrules").get("items") or []
    return {r["metadata"]["name"]: r for r in items if r["spec"]["deviceSelector"].get("pool") == node}


def device(kube: Kube, node: str, index: int) -> dict[str, Any]:
    status = kube.report(node).get("status") or {}
    return next((d for d in status.get("devices") or [] if d["index"] == index), {})


def pod_annotations(kube: Kube, ns: str, pod: str) -> dict[str, str]:
    return dict(kube.core.read_namespaced_pod(pod, ns).metadata.annotations or {})


def gone_or_deleting(kube: Kube, ns: str, pod: str) -> bool:
    pods = {p.metadata.name: p for p in kube.core.list_namespaced_pod(ns).items}
    return pod not in pods or pods[pod].metadata.deletion_timestamp is not None


def test_one_bad_gpu_costs_one_gpu(cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str) -> None:
    (node,) = make_nodes(cluster, group, 1)
    ns = ensure_namespace(kube, f"dq-{group}"[:60])
    dra.publish_device_classes(kube)
    dra.publish_slices(kube, [node], uuid=dra.report_uuid)
    dra.create_claim_template(kube, ns, "one-gpu", 1)
    kube.put_report(node, healthy_spec())
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"probation": "2s", "maxUnhealthyGPUs": 8},
            actions={"drain": {"checkpointMode": "annotation"}},
        ),
    )
    held: dict[str, str] = {}
    for i in range(3):
        kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, f"rank-{i}", "one-gpu", node))
        (dev,) = dra.wait_allocated(kube, ns, f"rank-{i}")
        held[f"rank-{i}"] = dev
    bad = int(held["rank-0"].removeprefix("gpu-"))
    rule = f"gpuhealth-{node}-gpu-{bad}"
    other = (bad + 1) % 8
    foreign: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": f"sre-{group}"[:60]},
        "spec": {
            "deviceSelector": {"driver": dra.DRIVER, "pool": node, "device": f"gpu-{other}"},
            "taint": {"key": "example.com/suspect", "value": "fan", "effect": "None"},
        },
    }
    kube.custom.create_cluster_custom_object(dra.G, dra.V, "devicetaintrules", foreign)

    kube.put_report(node, ecc(bad))
    wait_for(lambda: rule in rules_of(kube, node), timeout=30, what="a DeviceTaintRule for the bad GPU")
    ours = {n for n, r in rules_of(kube, node).items() if n != foreign["metadata"]["name"]}
    assert ours == {rule}
    spec = rules_of(kube, node)[rule]["spec"]
    assert spec["deviceSelector"] == {"driver": dra.DRIVER, "pool": node, "device": f"gpu-{bad}"}
    taint = {k: spec["taint"][k] for k in ("key", "value", "effect")}  # the API server adds timeAdded
    assert taint == {"key": TAINT, "value": "EccUncorrected", "effect": "NoSchedule"}
    assert device(kube, node, bad).get("taintRule") == rule
    status = kube.report(node)["status"]
    assert status["state"] == "Degraded" and status["reason"] == "DeviceQuarantined"
    assert status["inServiceGPUs"] == 7
    assert kube.our_taint(node) is None and not kube.node(node)["spec"].get("unschedulable")

    # Only the pod holding the bad GPU is asked to checkpoint, and evicted once it has.
    wait_for(lambda: CHECKPOINT_REQUESTED in pod_annotations(kube, ns, "rank-0"), timeout=30, what="checkpoint asked")
    kube.core.patch_namespaced_pod("rank-0", ns, {"metadata": {"annotations": {CHECKPOINT_COMPLETED: utcnow()}}})
    wait_for(lambda: gone_or_deleting(kube, ns, "rank-0"), timeout=30, what="the pod on the bad GPU evicted")
    for pod in ("rank-1", "rank-2"):
        assert CHECKPOINT_REQUESTED not in pod_annotations(kube, ns, pod)
        assert not gone_or_deleting(kube, ns, pod)
    wait_for(lambda: device(kube, node, bad).get("state") == "Quarantined", timeout=30, what="device drain done")
    events = " ".join(e.message for e in kube.await_events(node, "DeviceQuarantined"))
    assert f"GPU {bad} ({dra.report_uuid(bad)})" in events and rule in events

    # The real scheduler keeps new claims off the bad GPU; the node still takes work.
    dra.wait_rule_seen(kube, rule)
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "fresh", "one-gpu", node))
    assert dra.wait_allocated(kube, ns, "fresh") != [f"gpu-{bad}"]
    dra.create_claim_template(kube, ns, "eight-gpus", 8)
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "whole-node", "eight-gpus", node))
    dra.wait_unschedulable(kube, ns, "whole-node")  # 8 GPUs: one of them is held out
    assert 'gpuhealth_device_actions_total{action="taint",mode="Enforce",reason="EccUncorrected"}' in (
        operator.metrics()
    )
    kube.core.delete_namespaced_pod("whole-node", ns)

    # Return to service after probation: gpuhealth deletes its rule, never the foreign one.
    kube.put_report(node, healthy_spec())
    wait_for(lambda: rule not in rules_of(kube, node), timeout=40, what="the rule deleted after probation")
    assert device(kube, node, bad).get("state") == "InService"
    assert foreign["metadata"]["name"] in rules_of(kube, node)
    wait_for(lambda: kube.report(node)["status"].get("inServiceGPUs") == 8, timeout=20, what="all GPUs in service")

    # Two bad GPUs: more than devices.maxBadGPUsPerNode (1), so the node is quarantined.
    kube.put_report(node, ecc(bad, other))
    wait_for(lambda: kube.our_taint(node) is not None, timeout=30, what="escalation to the node")
    kube.await_events(node, "DeviceEscalated")
    assert foreign["metadata"]["name"] in rules_of(kube, node)
    kube.custom.delete_cluster_custom_object(dra.G, dra.V, "devicetaintrules", foreign["metadata"]["name"])


def test_a_gpu_no_slice_publishes_takes_the_node_and_the_event_says_why(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.put_report(node, healthy_spec())
    kube.apply_policy(group, policy_spec(group, safety={"maxUnhealthyGPUs": 8}))
    kube.put_report(node, ecc(2))
    wait_for(lambda: kube.our_taint(node) is not None, timeout=30, what="node quarantine")
    msgs = wait_for(
        lambda: [e.message for e in kube.node_events(node, "NodeScopeFallback")], timeout=20, what="fallback Event"
    )
    assert "no DRA ResourceSlice" in msgs[0] and "device plugin only" in msgs[0]
    assert not rules_of(kube, node)


def test_dry_run_writes_an_informational_rule(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    dra.publish_slices(kube, [node], uuid=dra.report_uuid)
    kube.put_report(node, healthy_spec())
    kube.apply_policy(group, policy_spec(group, mode="DryRun", safety={"maxUnhealthyGPUs": 8}))
    kube.put_report(node, ecc(4))
    rule = f"gpuhealth-{node}-gpu-4"
    wait_for(lambda: rule in rules_of(kube, node), timeout=30, what="a DryRun rule")
    assert rules_of(kube, node)[rule]["spec"]["taint"]["effect"] == "None"
    assert kube.our_taint(node) is None


def test_operator_killed_between_the_record_and_the_rule_converges_once(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    ns = ensure_namespace(kube, f"dk-{group}"[:60])
    dra.publish_device_classes(kube)
    dra.publish_slices(kube, [node], uuid=dra.report_uuid)
    dra.create_claim_template(kube, ns, "one-gpu", 1)
    kube.put_report(node, healthy_spec())
    kube.apply_policy(
        group,
        policy_spec(group, safety={"maxUnhealthyGPUs": 8}, actions={"drain": {"checkpointMode": "annotation"}}),
    )
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "rank-0", "one-gpu", node))
    (dev,) = dra.wait_allocated(kube, ns, "rank-0")
    bad = int(dev.removeprefix("gpu-"))
    rule = f"gpuhealth-{node}-gpu-{bad}"
    kube.put_report(node, ecc(bad))
    asked = wait_for(
        lambda: pod_annotations(kube, ns, "rank-0").get(CHECKPOINT_REQUESTED), timeout=30, what="checkpoint asked"
    )
    assert asked and rule in rules_of(kube, node)
    # Events are posted in the background: let the request's land before the kill.
    wait_for(lambda: len(kube.node_events(node, "CheckpointRequested")) == 1, timeout=20, what="request announced")
    # Killed after the status write, before the rule write: the record stays, the rule is lost.
    operator.kill()
    kube.custom.delete_cluster_custom_object(dra.G, dra.V, "devicetaintrules", rule)
    assert device(kube, node, bad).get("taintRule") == rule
    operator.start()
    wait_for(lambda: rule in rules_of(kube, node), timeout=30, what="the rule written after the restart")
    kube.core.patch_namespaced_pod("rank-0", ns, {"metadata": {"annotations": {CHECKPOINT_COMPLETED: utcnow()}}})
    wait_for(lambda: gone_or_deleting(kube, ns, "rank-0"), timeout=30, what="the pod evicted")
    wait_for(lambda: device(kube, node, bad).get("state") == "Quarantined", timeout=30, what="device drain done")
    assert list(rules_of(kube, node)) == [rule]
    assert len(kube.node_events(node, "CheckpointRequested")) == 1, "asked once, not again after the restart"
    wait_for(lambda: len(kube.node_events(node, "Evicted")) == 1, timeout=20, what="eviction announced")
    assert len(kube.node_events(node, "Evicted")) == 1, "evicted once"


def test_a_pod_asking_for_an_extended_resource_through_dra_is_drained_like_a_claim(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    node = make_dra_node(cluster, group, f"{group}-dra-only"[:63])
    ns = ensure_namespace(kube, f"dx-{group}"[:60])
    dra.publish_device_classes(kube)
    dra.publish_slices(kube, [node], gpus=2, uuid=dra.report_uuid)  # the driver publishes two of its 8 GPUs
    kube.put_report(node, healthy_spec())
    kube.apply_policy(group, policy_spec(group, safety={"maxUnhealthyGPUs": 8}, actions={"drain": {"maxWait": "1s"}}))
    for name in ("plugin-style-a", "plugin-style-b"):
        kube.core.create_namespaced_pod(ns, dra.extended_resource_pod(ns, name, node))
    held = {name: dra.wait_allocated(kube, ns, name)[0] for name in ("plugin-style-a", "plugin-style-b")}
    bad = int(held["plugin-style-a"].removeprefix("gpu-"))
    kube.put_report(node, ecc(bad))
    wait_for(lambda: gone_or_deleting(kube, ns, "plugin-style-a"), timeout=30, what="the pod on the bad GPU moved")
    assert not gone_or_deleting(kube, ns, "plugin-style-b")
    assert kube.our_taint(node) is None and f"gpuhealth-{node}-gpu-{bad}" in rules_of(kube, node)
