"""A repaired GPU goes back to the scheduler on a device-plugin node: the operator process, the real API
server, KWOK.

A KWOK node with ``nvidia.com/gpu: 8`` and no ResourceSlice; a pod standing in for NVIDIA's device
plugin runs on it with the labels the policy's ``spec.remediation.devicePlugin`` names. XID 48 on GPU 2
and allocatable lowered to 7: the plugin holds GPU 2 ``Unhealthy`` (as NVIDIA's does on a critical
XID). gpuhealth resets it (a Job that KWOK's stage ends in success, ``devkit/kwok/pod-remediation.yaml``),
and after its probation deletes the plugin's pod; the GPU still counts out of service until the test,
standing in for the plugin's new pod, raises allocatable back to 8. Without a plugin pod on the node,
nothing is deleted and a Warning Event and the ladder's record say the GPU stays withheld.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, ensure_namespace, wait_for, xid_event
from tests.integration.conftest import make_nodes, policy_spec
from tests.integration.test_device_plugin_quarantine import device, plugin_spec
from tests.integration.test_remediation_ladder import job_done, jobs_of, ladder, setup_namespace

GPU = "nvidia.com/gpu"
PLUGIN_LABELS = {"app": "nvidia-device-plugin-daemonset"}


def start(kube: Kube, cluster: LocalCluster, group: str, plugin: bool) -> tuple[str, str]:
    """The node, healthy, under a policy that resets and restarts the plugin in ``gpu-<group>``; the
    plugin's pod on it (``plugin``); allocatable 7 and XID 48 on GPU 2. Returns (node, plugin namespace)."""
    (node,) = make_nodes(cluster, group, 1)
    setup_namespace(kube)
    plugin_ns = ensure_namespace(kube, f"gpu-{group}"[:60])
    kube.put_report(node, plugin_spec(plugin_ns, {}))
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"probation": "2s", "maxUnhealthyGPUs": 8},
            actions={"drain": {"checkpointMode": "none", "maxWait": "1s"}},
            remediation={
                "enabled": True,
                "devicePlugin": {"namespace": plugin_ns, "matchLabels": PLUGIN_LABELS, "returnTimeout": "5m"},
            },
        ),
    )
    wait_for(lambda: kube.report(node).get("status", {}).get("state") == "Healthy", timeout=30, what="healthy")
    if plugin:
        body = {
            "metadata": {"name": "nvidia-device-plugin-daemonset-a1", "labels": PLUGIN_LABELS},
            "spec": {"nodeName": node, "containers": [{"name": "nvidia-device-plugin-ctr", "image": "plugin"}]},
        }
        kube.core.create_namespaced_pod(plugin_ns, body)
        wait_for(lambda: phase(kube, plugin_ns) == "Running", timeout=30, what="the plugin's pod running")
    kube.core.patch_node_status(node, {"status": {"allocatable": {GPU: "7"}}})
    wait_for(lambda: kube.node(node)["status"]["allocatable"][GPU] == "7", timeout=10, what="allocatable 7")
    kube.put_report(node, plugin_spec(plugin_ns, {}, xids=[xid_event(48, gpu=2)]))
    wait_for(lambda: device(kube, node, 2).get("keptOffBy") == "DevicePlugin", timeout=30, what="GPU 2 held out")
    (job,) = wait_for(lambda: jobs_of(kube, node), timeout=30, what="GPU 2's reset Job")
    batch = client.BatchV1Api(kube.core.api_client)
    wait_for(
        lambda: job_done(batch.read_namespaced_job(job.metadata.name, job.metadata.namespace), "Complete"),
        timeout=30,
        what="the reset Job succeeded",
    )
    return node, plugin_ns


def phase(kube: Kube, ns: str) -> str | None:
    pods = kube.core.list_namespaced_pod(ns).items
    return pods[0].status.phase if pods and pods[0].metadata.deletion_timestamp is None else None


def in_service(kube: Kube, node: str) -> Any:
    return kube.report(node)["status"].get("inServiceGPUs")


def test_the_operator_restarts_the_plugin_and_counts_the_gpu_back_only_once_allocatable_shows_it(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    node, plugin_ns = start(kube, cluster, group, plugin=True)
    wait_for(lambda: phase(kube, plugin_ns) is None, timeout=40, what="the plugin's pod deleted by the operator")

    # Write-ahead: the record names the pod, the pod is deleted, then the record says so (a write after the
    # delete, so a loaded machine's reader can come between them), and the Event follows.
    def deleted() -> dict[str, Any] | None:
        rec = ladder(kube, node, 2)
        return rec if (rec.get("plugin") or {}).get("deleted") is True else None

    rec = wait_for(deleted, timeout=20, what="the ladder's record of the deleted pod")
    assert rec["phase"] == "RestartingPlugin"
    assert rec["plugin"]["pod"] == f"{plugin_ns}/nvidia-device-plugin-daemonset-a1"
    assert device(kube, node, 2)["state"] == "Recovering" and in_service(kube, node) == 7  # still withheld
    (started,) = wait_for(lambda: kube.node_events(node, "RestartingDevicePlugin"), what="RestartingDevicePlugin")
    assert f"allocatable {GPU} 7 of 8" in started.message and "nvidia-device-plugin-daemonset-a1" in started.message
    (tolerated,) = jobs_of(kube, node)
    assert any(t.key == "gpuhealth.dev/gpu-out" for t in tolerated.spec.template.spec.tolerations)

    # The plugin's new pod registers the GPU again: allocatable 8, and only now the GPU is back.
    kube.core.patch_node_status(node, {"status": {"allocatable": {GPU: "8"}}})
    wait_for(lambda: device(kube, node, 2).get("state") == "InService", timeout=30, what="GPU 2 back in service")
    wait_for(lambda: in_service(kube, node) == 8, timeout=20, what="8 GPUs in service")
    # The GPU's verdict and its finished ladder are two rooms' writes (the node's pass, then the
    # remediator's): a loaded machine showed the first without the second for a moment.
    wait_for(lambda: not ladder(kube, node, 2), timeout=20, what="GPU 2's finished ladder dropped")
    (back,) = wait_for(lambda: kube.node_events(node, "DevicePluginOffersGPU"), what="DevicePluginOffersGPU")
    assert f"allocatable {GPU} 8 of 8" in back.message
    assert not kube.node_events(node, "DevicePluginNotRestarted")


def test_without_a_plugin_pod_the_gpu_stays_withheld_with_a_warning_until_allocatable_shows_it(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    node, plugin_ns = start(kube, cluster, group, plugin=False)
    (warning,) = wait_for(
        lambda: kube.node_events(node, "DevicePluginNotRestarted"), timeout=40, what="the Warning Event"
    )
    assert warning.type == "Warning" and f"no pod of the device plugin (namespace {plugin_ns}" in warning.message
    assert "stays withheld until the device plugin's pod on the node restarts" in warning.message
    rec = ladder(kube, node, 2)
    assert rec["phase"] == "RestartingPlugin" and "no pod of the device plugin" in rec["plugin"]["blocked"]
    assert "stays withheld" in rec["message"] and device(kube, node, 2)["state"] == "Recovering"

    kube.core.patch_node_status(node, {"status": {"allocatable": {GPU: "8"}}})  # a human restarted it
    wait_for(lambda: device(kube, node, 2).get("state") == "InService", timeout=30, what="GPU 2 back in service")
    wait_for(lambda: not ladder(kube, node, 2), timeout=20, what="GPU 2's finished ladder dropped")
