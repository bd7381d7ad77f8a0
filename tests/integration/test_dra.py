"""Per-device quarantine's building blocks against the real control plane and its real scheduler.

Slices are published for KWOK nodes as NVIDIA's DRA driver would; pods get GPUs through
ResourceClaimTemplates (or an extended resource served by a DeviceClass) and the real scheduler
allocates them. Everything gpuhealth does here goes through its own Kube port.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from kubernetes import client

from devkit import dra
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, ensure_namespace, wait_for
from gpuhealth.actions.devicetaints import build_rule, plan_rules, rule_name
from gpuhealth.actions.slices import DeviceRef
from gpuhealth.api.devices import DeviceRecord, DeviceState, devices_from_status, devices_to_status
from gpuhealth.controller.intake.slicewatch import SliceWatch
from gpuhealth.drain.claims import pods_holding
from gpuhealth.kube.client import Kube as OperatorKube
from gpuhealth.kube.credentials import api_client
from tests.integration.conftest import make_dra_node, make_nodes, policy_spec

DRIVERS = (dra.DRIVER,)


def operator_kube(cluster: LocalCluster) -> OperatorKube:
    return OperatorKube(api_client(str(cluster.kubeconfig)))


def all_rules(kube: Kube) -> list[dict[str, Any]]:
    return list(kube.custom.list_cluster_custom_object(dra.G, dra.V, "devicetaintrules").get("items") or [])


def scheduled_pods(kube: Kube, ns: str) -> list[dict[str, Any]]:
    pods = kube.api.sanitize_for_serialization(kube.core.list_namespaced_pod(ns)).get("items") or []
    return [p for p in pods if (p.get("spec") or {}).get("nodeName")]


def hold_still(kube: Kube, group: str) -> None:
    """A Paused policy for the test's nodes, seen by the running operator: it then leaves their rules
    alone (these tests write gpuhealth's rules by hand; an operator would delete such a rule on a node
    no policy governs, as an orphan)."""
    kube.apply_policy(group, policy_spec(group, mode="Paused"))
    wait_for(
        lambda: (kube.get_policy(group).get("status") or {}).get("nodes") == 1,
        timeout=30,
        what="the operator counts the node under the Paused policy",
    )


def test_slice_reflector_maps_gpus_from_the_real_api(cluster: LocalCluster, kube: Kube, group: str) -> None:
    (node,) = make_nodes(cluster, group, 1)
    w = SliceWatch(operator_kube(cluster))
    w.start()
    try:
        assert w.cache.synced.wait(30)
        assert w.cache.find(node, DRIVERS, 3, dra.fake_nvml_uuid(3)).ref is None  # no slice yet: node scope
        (name,) = dra.publish_slices(kube, [node])
        ref = wait_for(
            lambda: w.cache.find(node, DRIVERS, 3, dra.fake_nvml_uuid(3)).ref, what="gpu-3 seen through the watch"
        )
        assert ref == DeviceRef(dra.DRIVER, node, "gpu-3")
        kube.custom.delete_cluster_custom_object(dra.G, dra.V, "resourceslices", name)
        wait_for(lambda: w.cache.find(node, DRIVERS, 3, dra.fake_nvml_uuid(3)).ref is None, what="slice deletion seen")
        assert "no DRA ResourceSlice" in w.cache.find(node, DRIVERS, 3, dra.fake_nvml_uuid(3)).reason
    finally:
        w.stop()


def test_device_taint_rule_steers_the_real_scheduler_and_foreign_rules_stay(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    hold_still(kube, group)
    ns = ensure_namespace(kube, f"dra-{group}"[:60])
    dra.publish_device_classes(kube)
    dra.publish_slices(kube, [node])
    dra.create_claim_template(kube, ns, "one-gpu", 1)
    dra.create_claim_template(kube, ns, "eight-gpus", 8)
    ours = operator_kube(cluster)
    gpu3 = DeviceRef(dra.DRIVER, node, "gpu-3")

    created = ours.create_device_taint_rule(build_rule(gpu3, "EccUncorrected", index=3, uuid=dra.fake_nvml_uuid(3)))
    assert created["metadata"]["name"] == rule_name(gpu3)
    try:
        ours.create_device_taint_rule(build_rule(gpu3, "EccUncorrected"))
        raise AssertionError("a second create of the same rule must be refused")
    except client.ApiException as e:
        assert e.status == 409  # idempotent by name: a restarted operator cannot duplicate it

    dra.wait_rule_seen(kube, rule_name(gpu3))
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "whole-node", "eight-gpus", node))
    assert "cannot allocate" in dra.wait_unschedulable(kube, ns, "whole-node")

    allocated: dict[str, str] = {}
    for i in range(7):
        kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, f"one-{i}", "one-gpu", node))
        (device,) = dra.wait_allocated(kube, ns, f"one-{i}")
        allocated[device] = f"{ns}/one-{i}"
    assert sorted(allocated) == sorted(f"gpu-{i}" for i in range(8) if i != 3)
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "one-more", "one-gpu", node))
    dra.wait_unschedulable(kube, ns, "one-more")  # gpu-3 is free but tainted

    claims = ours.list_resource_claims()
    pods = scheduled_pods(kube, ns)
    assert pods_holding([DeviceRef(dra.DRIVER, node, "gpu-5")], claims, pods) == {allocated["gpu-5"]}
    assert pods_holding([DeviceRef(dra.DRIVER, node, "gpu-5")], claims) == {allocated["gpu-5"]}  # reservedFor alone
    assert pods_holding([gpu3], claims, pods) == set()

    # Someone else's rule, on a device gpuhealth also cares about, with the informational effect.
    foreign: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": f"sre-{group}"[:60], "labels": {"team": "sre"}},
        "spec": {
            "deviceSelector": {"driver": dra.DRIVER, "pool": node, "device": "gpu-5"},
            "taint": {"key": "example.com/suspect", "value": "fan", "effect": "None"},
        },
    }
    kube.custom.create_cluster_custom_object(dra.G, dra.V, "devicetaintrules", foreign)
    assert [r["metadata"]["name"] for r in ours.list_device_taint_rules() if node in r["metadata"]["name"]] == [
        rule_name(gpu3)
    ]

    # Return to service: nothing desired any more. The plan deletes gpuhealth's rule only.
    plan = plan_rules([], all_rules(kube))
    assert rule_name(gpu3) in [n for n, _ in plan.delete]
    assert foreign["metadata"]["name"] not in [n for n, _ in plan.delete]
    for name, uid in plan.delete:
        if node in name:
            ours.delete_device_taint_rule(name, uid)
    names = {r["metadata"]["name"] for r in all_rules(kube)}
    assert foreign["metadata"]["name"] in names and rule_name(gpu3) not in names
    assert dra.wait_allocated(kube, ns, "one-more") == ["gpu-3"]  # the scheduler may use it again
    assert not kube.core.read_namespaced_pod("whole-node", ns).spec.node_name  # 8 GPUs are not free
    kube.custom.delete_cluster_custom_object(dra.G, dra.V, "devicetaintrules", foreign["metadata"]["name"])


def test_dry_run_rule_is_informational(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    hold_still(kube, group)
    ns = ensure_namespace(kube, f"dra-{group}"[:60])
    dra.publish_device_classes(kube)
    dra.publish_slices(kube, [node], gpus=1)
    dra.create_claim_template(kube, ns, "one-gpu", 1)
    ours = operator_kube(cluster)
    gpu0 = DeviceRef(dra.DRIVER, node, "gpu-0")
    rule = ours.create_device_taint_rule(build_rule(gpu0, "XID48", dry_run=True))
    assert rule["spec"]["taint"]["effect"] == "None"
    dra.wait_rule_seen(kube, rule["metadata"]["name"])
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "p", "one-gpu", node))
    assert dra.wait_allocated(kube, ns, "p") == ["gpu-0"]  # DryRun keeps the GPU in allocation
    ours.delete_device_taint_rule(rule["metadata"]["name"], rule["metadata"]["uid"])


def test_pod_asking_for_an_extended_resource_is_found_through_its_claim(
    cluster: LocalCluster, kube: Kube, group: str
) -> None:
    node = make_dra_node(cluster, group, f"{group}-dra-only"[:63])
    ns = ensure_namespace(kube, f"dra-{group}"[:60])
    dra.publish_device_classes(kube)
    dra.publish_slices(kube, [node], gpus=2)
    kube.core.create_namespaced_pod(ns, dra.extended_resource_pod(ns, "plugin-style", node))
    (device,) = dra.wait_allocated(kube, ns, "plugin-style")
    ours = operator_kube(cluster)
    held = pods_holding([DeviceRef(dra.DRIVER, node, device)], ours.list_resource_claims(), scheduled_pods(kube, ns))
    assert held == {f"{ns}/plugin-style"}


def test_per_gpu_records_round_trip_through_the_status_subresource(
    cluster: LocalCluster, kube: Kube, group: str
) -> None:
    name = f"{group}-status"[:63]
    kube.put_report(name, {})
    t = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    records = [
        DeviceRecord(0, uuid=dra.fake_nvml_uuid(0)),
        DeviceRecord(3, dra.fake_nvml_uuid(3), DeviceState.DRAINING, "EccUncorrected", "GPU 3: 2 ECC", t, "ecc", (t,)),
    ]
    ours = operator_kube(cluster)
    stored = ours.patch_report_status(name, {"status": {"devices": devices_to_status(records)}})
    assert devices_from_status(stored["status"]) == {r.index: r for r in records}
    try:
        ours.patch_report_status(name, {"status": {"devices": [{"index": 1, "state": "Broken"}]}})
        raise AssertionError("an unknown device state must be refused")
    except client.ApiException as e:
        assert e.status == 422 and "status.devices[0].state" in json.loads(e.body)["message"]
