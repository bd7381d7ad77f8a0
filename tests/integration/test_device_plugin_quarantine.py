"""One bad GPU costs its pods, not the node, on a device-plugin node: the operator process, the real
API server, the real scheduler.

A KWOK node with ``nvidia.com/gpu: 8`` (capacity and allocatable, as NVIDIA's device plugin registers
them) and no ResourceSlice runs pods that asked for ``nvidia.com/gpu: 1``; the agent's report names
each pod under its GPU (``spec.devices[].pods``, the kubelet's pod-resources API, here hand-written).
An uncorrected ECC error on GPU 2 must evict only GPU 2's pod, keep the others running, keep new pods
off the node with gpuhealth's NoSchedule taint ``gpuhealth.dev/gpu-out`` (no cordon) and list GPU 2
held out in the status; recovery lifts the taint. An XID 48 on a GPU the plugin already withholds
(allocatable lowered by one, as NVIDIA's plugin does on a critical XID) takes no taint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from devkit import dra
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, ensure_namespace, healthy_spec, wait_for, xid_event
from gpuhealth.api.names import GPU_OUT_TAINT_KEY
from tests.integration.conftest import make_nodes, policy_spec

GPU = "nvidia.com/gpu"


def plugin_spec(
    ns: str, pods: Mapping[int, str], ecc: tuple[int, ...] = (), xids: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A fresh report whose GPU ``i`` is held by pod ``pods[i]``, with ECC errors on the ``ecc`` GPUs."""
    spec = healthy_spec(xids=xids)
    spec["podResources"] = {"available": True}
    for d in spec["devices"]:
        i = d["index"]
        d["pods"] = [{"namespace": ns, "name": pods[i], "container": "main", "resource": GPU}] if i in pods else []
        if i in ecc:
            d["ecc"]["volatileUncorrected"] = 1
    return spec


def device(kube: Kube, node: str, index: int) -> dict[str, Any]:
    status = kube.report(node).get("status") or {}
    return next((d for d in status.get("devices") or [] if d["index"] == index), {})


def gpu_out(kube: Kube, node: str) -> dict[str, Any] | None:
    return next((t for t in kube.taints(node) if t["key"] == GPU_OUT_TAINT_KEY), None)


def deleting(kube: Kube, ns: str, pod: str) -> bool:
    pods = {p.metadata.name: p for p in kube.core.list_namespaced_pod(ns).items}
    return pod not in pods or pods[pod].metadata.deletion_timestamp is not None


def running(kube: Kube, ns: str, pod: str) -> bool:
    p = kube.core.read_namespaced_pod(pod, ns)
    return p.status.phase == "Running" and p.metadata.deletion_timestamp is None


def test_one_bad_gpu_costs_its_pods_not_the_node(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    ns = ensure_namespace(kube, f"dp-{group}"[:60])
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"probation": "2s", "maxUnhealthyGPUs": 8},
            actions={"drain": {"checkpointMode": "none", "maxWait": "1s"}},
        ),
    )
    holders = {i: f"on-gpu-{i}" for i in range(4)}
    for pod in holders.values():
        kube.core.create_namespaced_pod(ns, dra.extended_resource_pod(ns, pod, node, GPU))
    wait_for(
        lambda: all(running(kube, ns, p) for p in holders.values()), timeout=60, what=f"the pods running on {node}"
    )
    kube.put_report(node, plugin_spec(ns, holders))
    wait_for(lambda: kube.report(node).get("status", {}).get("state") == "Healthy", timeout=30, what="healthy")

    # An ECC fault the plugin cannot see: only GPU 2's pod leaves, the node is tainted, not cordoned.
    kube.put_report(node, plugin_spec(ns, holders, ecc=(2,)))
    wait_for(lambda: deleting(kube, ns, "on-gpu-2"), timeout=30, what="GPU 2's pod evicted")
    wait_for(lambda: device(kube, node, 2).get("state") == "Quarantined", timeout=30, what="GPU 2's drain done")
    taint = gpu_out(kube, node)
    assert taint is not None and taint["effect"] == "NoSchedule" and taint["value"] == "gpu-2"
    assert kube.our_taint(node) is None and not kube.node(node)["spec"].get("unschedulable")
    for i in (0, 1, 3):
        assert running(kube, ns, holders[i]), f"GPU {i}'s pod keeps running"
    status = kube.report(node)["status"]
    assert status["state"] == "Degraded" and status["inServiceGPUs"] == 7
    assert device(kube, node, 2)["keptOffBy"] == "NodeTaint" and "taintRule" not in device(kube, node, 2)
    assert "node tainted NoSchedule" in status["message"] and "other GPUs" in status["message"]
    events = " ".join(e.message for e in kube.await_events(node, "DeviceQuarantined"))
    assert "device plugin route" in events and f"{ns}/on-gpu-2" in events
    assert not kube.node_events(node, "NodeScopeFallback")
    # The real scheduler keeps a new GPU pod off the tainted node.
    kube.core.create_namespaced_pod(ns, dra.extended_resource_pod(ns, "fresh", node, GPU))
    assert "untolerated taint" in dra.wait_unschedulable(kube, ns, "fresh")
    kube.core.delete_namespaced_pod("fresh", ns)

    # A restarted operator keeps the taint (GPU 2 is still out) and evicts nothing twice.
    wait_for(lambda: len(kube.node_events(node, "Evicted")) == 1, timeout=20, what="the eviction announced")
    passes = operator.log.read_text().count("every GPU node evaluated")
    operator.kill()
    operator.start()
    wait_for(
        lambda: operator.log.read_text().count("every GPU node evaluated") > passes,
        timeout=30,
        what="the restarted operator's first pass",
    )
    assert gpu_out(kube, node) is not None and device(kube, node, 2)["keptOffBy"] == "NodeTaint"
    assert len(kube.node_events(node, "Evicted")) == 1

    # Recovery: probation, GPU 2 back in service, the taint lifted.
    del holders[2]
    kube.put_report(node, plugin_spec(ns, holders))
    wait_for(lambda: gpu_out(kube, node) is None, timeout=40, what="the gpu-out taint lifted")
    assert device(kube, node, 2).get("state") == "InService" and "keptOffBy" not in device(kube, node, 2)
    wait_for(lambda: kube.report(node)["status"].get("inServiceGPUs") == 8, timeout=20, what="all GPUs in service")

    # XID 48 on GPU 3, which the plugin already withholds (allocatable 7): no taint, only its pod moves.
    kube.core.patch_node_status(node, {"status": {"allocatable": {GPU: "7"}}})
    wait_for(lambda: kube.node(node)["status"]["allocatable"][GPU] == "7", timeout=10, what="allocatable 7")
    kube.put_report(node, plugin_spec(ns, holders, xids=[xid_event(48, gpu=3)]))
    wait_for(lambda: deleting(kube, ns, "on-gpu-3"), timeout=30, what="GPU 3's pod evicted")
    assert device(kube, node, 3)["keptOffBy"] == "DevicePlugin"
    assert gpu_out(kube, node) is None and not kube.node(node)["spec"].get("unschedulable")
    assert running(kube, ns, "on-gpu-0") and running(kube, ns, "on-gpu-1")
    events = " ".join(e.message for e in kube.await_events(node, "DeviceQuarantined"))
    assert f"withheld by the device plugin (allocatable {GPU} 7 of 8)" in events
