"""DRA for fake GPU nodes: publish DeviceClasses and ResourceSlices the way NVIDIA's DRA driver does,
and run workloads whose GPUs come from ResourceClaimTemplates, so the real scheduler allocates them.

There is no kubelet and no driver on KWOK nodes: the slices are written here (driver
``gpu.nvidia.com``, pool = node name, devices ``gpu-0..N-1`` with attributes ``index``, ``uuid``,
``productName``), the scheduler allocates claims against them, and KWOK runs the pods. The UUIDs
default to the ones the fake NVML library (devkit/fakenvml) reports, so a real agent on the
node and its slice agree; :func:`report_uuid` is the scheme of the hand-written reports in devkit/k8s.py.
MIG and partitionable nodes are published with :func:`publish` from the shapes in ``dra_shapes``
(static MIG, DynamicMIG counter sets and placements, each driver version's attributes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

from kubernetes import client

from devkit import dra_shapes
from devkit.k8s import Kube, wait_for

DRIVER = "gpu.nvidia.com"
G, V = "resource.k8s.io", "v1"
GPU_CLASS = "gpu.nvidia.com"
EXTENDED_CLASS = "gpu.nvidia.com-extended"
EXTENDED_RESOURCE = "example.com/dra-gpu"


def fake_nvml_uuid(index: int) -> str:
    """The UUID devkit/fakenvml gives GPU ``index`` (the same on every node)."""
    h = (2654435761 * (index + 1)) & 0xFFFFFFFF
    return f"GPU-{h:08x}-fa4e-4a1b-9c2d-{(index + 1) * 0x1111:012x}"


def report_uuid(index: int) -> str:
    """The UUID of GPU ``index`` in the reports devkit/k8s.py writes by hand."""
    return f"GPU-{index:08d}-0000-0000-0000-000000000000"


def node_uuid(node: str, index: int) -> str:
    """A UUID for GPU ``index`` of ``node`` that no other node shares (as on real hardware)."""
    h = hashlib.sha256(node.encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{index:012x}"


def with_node_uuids(spec: dict[str, Any], node: str) -> dict[str, Any]:
    """A report spec whose GPUs carry ``node_uuid(node, i)``."""
    for d in spec.get("devices") or []:
        d["uuid"] = node_uuid(node, d["index"])
    return spec


def device_class(name: str = GPU_CLASS, extended_resource: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}
    if extended_resource:
        spec["extendedResourceName"] = extended_resource
    return {"apiVersion": f"{G}/{V}", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def publish_device_classes(kube: Kube, extended_resource: str = EXTENDED_RESOURCE) -> None:
    """The plain GPU class, and one that serves pods asking for ``extended_resource`` through DRA."""
    for body in (device_class(), device_class(EXTENDED_CLASS, extended_resource)):
        try:
            kube.custom.create_cluster_custom_object(G, V, "deviceclasses", body)
        except client.ApiException as e:
            if e.status != 409:
                raise


def resource_slice(node: str, gpus: int = 8, uuid: Callable[[int], str] = fake_nvml_uuid) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {
                        "index": {"int": i},
                        "uuid": {"string": uuid(i)},
                        "productName": {"string": "NVIDIA H100 80GB HBM3"},
                    },
                }
                for i in range(gpus)
            ],
        },
    }


def publish_slices(
    kube: Kube, nodes: Iterable[str], gpus: int = 8, uuid: Callable[[int], str] = fake_nvml_uuid
) -> list[str]:
    """One ResourceSlice per node, as the driver's kubelet plugin would publish it."""
    names = []
    for node in nodes:
        body = resource_slice(node, gpus, uuid)
        kube.custom.create_cluster_custom_object(G, V, "resourceslices", body)
        names.append(body["metadata"]["name"])
    return names


MIG_CEL = f"device.attributes['{DRIVER}'].type == 'mig'"
FULL_GPU_CEL = f"device.attributes['{DRIVER}'].type == 'gpu'"


def publish(kube: Kube, published: dra_shapes.Published) -> list[str]:
    """Create the slices of one node, shaped as NVIDIA's driver publishes them (``dra_shapes``)."""
    for body in published.slices:
        kube.custom.create_cluster_custom_object(G, V, "resourceslices", body)
    return [s["metadata"]["name"] for s in published.slices]


def claim_template(
    namespace: str, name: str, count: int = 1, device_class_name: str = GPU_CLASS, cel: str = ""
) -> dict[str, Any]:
    """A ResourceClaimTemplate for ``count`` devices of the class; ``cel`` narrows them (``MIG_CEL``
    for a MIG device or placement, ``FULL_GPU_CEL`` for a whole GPU)."""
    body: dict[str, Any] = {
        "apiVersion": f"{G}/{V}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": device_class_name,
                                "allocationMode": "ExactCount",
                                "count": count,
                                **({"selectors": [{"cel": {"expression": cel}}]} if cel else {}),
                            },
                        }
                    ]
                }
            }
        },
    }
    return body


def create_claim_template(kube: Kube, namespace: str, name: str, count: int = 1, cel: str = "") -> None:
    kube.custom.create_namespaced_custom_object(
        G, V, namespace, "resourceclaimtemplates", claim_template(namespace, name, count, cel=cel)
    )


def claim_pod(namespace: str, name: str, template: str, node: str) -> dict[str, Any]:
    """A pod on ``node`` whose GPUs come from a claim generated from ``template``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{"name": "main", "image": "trainer", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def extended_resource_pod(namespace: str, name: str, node: str, resource: str = EXTENDED_RESOURCE) -> dict[str, Any]:
    """A pod that asks for ``resource`` like a device-plugin pod; DRA serves it through the DeviceClass."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "server", "resources": {"limits": {resource: "1"}}}],
        },
    }


def pod_claim(kube: Kube, namespace: str, pod: str) -> dict[str, Any] | None:
    """The ResourceClaim a pod uses (from its status), once the scheduler has allocated it."""
    p = kube.api.sanitize_for_serialization(kube.core.read_namespaced_pod(pod, namespace))
    status = p.get("status") or {}
    names = [c.get("resourceClaimName") for c in status.get("resourceClaimStatuses") or []]
    ext = status.get("extendedResourceClaimStatus") or {}
    names.append(ext.get("resourceClaimName"))
    for n in names:
        if n:
            claim = kube.custom.get_namespaced_custom_object(G, V, namespace, "resourceclaims", n)
            if ((claim.get("status") or {}).get("allocation") or {}).get("devices"):
                return claim  # type: ignore[no-any-return]
    return None


def allocated_devices(claim: dict[str, Any]) -> list[str]:
    results = claim["status"]["allocation"]["devices"]["results"]
    return sorted(r["device"] for r in results)


def wait_allocated(kube: Kube, namespace: str, pod: str, timeout: float = 60.0) -> list[str]:
    """The devices the scheduler allocated to ``pod`` (waits for the allocation and the pod's binding)."""
    claim = wait_for(lambda: pod_claim(kube, namespace, pod), timeout=timeout, what=f"a claim allocated for {pod}")
    wait_for(
        lambda: kube.core.read_namespaced_pod(pod, namespace).spec.node_name,
        timeout=timeout,
        what=f"{pod} bound to a node",
    )
    return allocated_devices(claim)


def wait_unschedulable(kube: Kube, namespace: str, pod: str, timeout: float = 60.0) -> str:
    """The scheduler's message once it has marked ``pod`` unschedulable (it stays Pending)."""

    def message() -> str:
        p = kube.core.read_namespaced_pod(pod, namespace)
        if p.spec.node_name:
            raise AssertionError(f"{pod} was scheduled on {p.spec.node_name}")
        for c in p.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return str(c.message or "unschedulable")
        return ""

    return wait_for(message, timeout=timeout, what=f"{pod} marked unschedulable")


def wait_rule_seen(kube: Kube, name: str, timeout: float = 30.0) -> None:
    """Wait until kube-controller-manager has reported on a DeviceTaintRule (its status condition).

    The scheduler watches the same rules; once the controller manager has seen a rule, the
    scheduler has almost surely seen it too, so the next claim is allocated under it.
    """

    def seen() -> bool:
        rule = kube.custom.get_cluster_custom_object(G, V, "devicetaintrules", name)
        return bool((rule.get("status") or {}).get("conditions"))

    wait_for(seen, timeout=timeout, what=f"DeviceTaintRule {name} observed by the controller manager")
