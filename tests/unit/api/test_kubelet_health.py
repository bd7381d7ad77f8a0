"""Reading the kubelet's device health from pod status (KEP-4680 ``allocatedResourcesStatus``), shaped as
k8s.io/api core/v1 ``ContainerStatus.allocatedResourcesStatus[]`` (``ResourceStatus``, ``ResourceHealth``)."""

from __future__ import annotations

from typing import Any

from gpuhealth.api.kubelet_health import DeviceHealth, allocated_resources_status, device_uuid, worst


def pod(*statuses: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {"status": {"containerStatuses": list(statuses), "initContainerStatuses": list(init)}}


def status(name: str, *resources: tuple[str, str, str] | tuple[str, str]) -> dict[str, Any]:
    """A container status; each resource (resource name, resourceID[, health])."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for r in resources:
        entry = {"resourceID": r[1], **({"health": r[2]} if len(r) == 3 else {})}
        by_name.setdefault(r[0], []).append(entry)
    return {"name": name, "allocatedResourcesStatus": [{"name": n, "resources": rs} for n, rs in by_name.items()]}


def test_a_replica_suffix_is_not_part_of_the_device() -> None:
    assert device_uuid("GPU-abc::3") == "GPU-abc" and device_uuid("MIG-x") == "MIG-x"
    assert device_uuid("gpu.nvidia.com/node-a/gpu-2") == "gpu.nvidia.com/node-a/gpu-2"


def test_each_device_of_a_container_with_its_health() -> None:
    p = pod(
        status("main", ("nvidia.com/gpu", "GPU-2::1", "Unhealthy"), ("nvidia.com/gpu", "GPU-3", "Healthy")),
        status("other", ("nvidia.com/gpu", "GPU-5")),
    )
    main = allocated_resources_status(p, "main")
    assert main == (
        DeviceHealth("main", "nvidia.com/gpu", "GPU-2::1", "Unhealthy"),
        DeviceHealth("main", "nvidia.com/gpu", "GPU-3", "Healthy"),
    )
    assert main is not None and main[0].device == "GPU-2"
    # An absent health is Unknown (the field is omitempty); every container when none is named.
    every = allocated_resources_status(p)
    assert every is not None and DeviceHealth("other", "nvidia.com/gpu", "GPU-5", "Unknown") in every


def test_a_status_without_the_field_is_not_reported_not_healthy() -> None:
    assert allocated_resources_status(pod({"name": "main", "ready": True}), "main") is None
    assert allocated_resources_status({"status": {}}, "main") is None
    assert allocated_resources_status(pod(status("main", ("nvidia.com/gpu", "GPU-2", "Healthy"))), "side") is None
    # Reported, with nothing in it: known to hold no device.
    assert allocated_resources_status(pod({"name": "main", "allocatedResourcesStatus": []}), "main") == ()


def test_a_sidecar_init_container_counts_and_a_message_is_kept() -> None:
    side = status("side", ("claim:gpu/req", "gpu.nvidia.com/pool/gpu-2", "Unhealthy"))
    side["allocatedResourcesStatus"][0]["resources"][0]["message"] = "ECC error count exceeded threshold"
    (h,) = allocated_resources_status(pod(init=(side,)), "side") or ()
    assert h.message == "ECC error count exceeded threshold" and h.resource == "claim:gpu/req"


def test_the_worst_health_wins() -> None:
    assert worst(["Healthy", "Unhealthy", "Unknown"]) == "Unhealthy"
    assert worst(["Healthy", "Unknown"]) == "Unknown"
    assert worst(["Healthy", "Degraded"]) == "Degraded"
    assert worst(["Healthy"]) == "Healthy" and worst([]) is None
