"""Mapping a GPU (UUID first, index second) to its DRA device from ResourceSlices."""

from __future__ import annotations

from typing import Any

from gpuhealth.actions.gpudevices import find_device
from gpuhealth.actions.slices import DeviceRef, SlimDevice, slim_slice

DRIVERS = ("gpu.nvidia.com",)


def uuid(i: int) -> str:
    return f"GPU-{i:08d}-0000-0000-0000-000000000000"


def slice_obj(
    node: str,
    gpus: range = range(8),
    driver: str = "gpu.nvidia.com",
    generation: int = 1,
    name: str = "",
    with_uuid: bool = True,
    qualified: bool = False,
    uuid_of: Any = uuid,
) -> dict[str, Any]:
    def attrs(i: int) -> dict[str, Any]:
        prefix = f"{driver}/" if qualified else ""
        a: dict[str, Any] = {f"{prefix}index": {"int": i}, "productName": {"string": "NVIDIA H100 80GB HBM3"}}
        if with_uuid:
            a[f"{prefix}uuid"] = {"string": uuid_of(i)}
        return a

    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{driver}", "managedFields": ["big"]},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{i}", "attributes": attrs(i)} for i in gpus],
        },
    }


def test_slim_keeps_names_uuid_and_index() -> None:
    s = slim_slice(slice_obj("n1", range(2)))
    assert (s.driver, s.pool, s.node, s.generation) == ("gpu.nvidia.com", "n1", "n1", 1)
    assert s.devices == (SlimDevice("gpu-0", uuid(0), 0), SlimDevice("gpu-1", uuid(1), 1))


def test_slim_reads_attributes_qualified_with_the_driver_domain() -> None:
    s = slim_slice(slice_obj("n1", range(1), qualified=True))
    assert s.devices == (SlimDevice("gpu-0", uuid(0), 0),)


def test_uuid_first() -> None:
    # The slice numbers devices differently from NVML: the UUID decides.
    slices = [slim_slice(slice_obj("n1", uuid_of=lambda i: uuid(7 - i)))]
    m = find_device(slices, "n1", DRIVERS, 3, uuid(3))
    assert m.ref == DeviceRef("gpu.nvidia.com", "n1", "gpu-4") and m.reason == ""


def test_index_second_only_where_no_uuid_contradicts() -> None:
    no_uuid = [slim_slice(slice_obj("n1", with_uuid=False))]
    assert find_device(no_uuid, "n1", DRIVERS, 3, uuid(3)).ref == DeviceRef("gpu.nvidia.com", "n1", "gpu-3")
    with_uuid = [slim_slice(slice_obj("n1"))]
    assert find_device(with_uuid, "n1", DRIVERS, 3, "").ref == DeviceRef("gpu.nvidia.com", "n1", "gpu-3")
    m = find_device(with_uuid, "n1", DRIVERS, 3, "GPU-someone-else")
    assert m.ref is None and "not among the 8 devices" in m.reason


def test_only_this_nodes_pool_and_configured_drivers() -> None:
    slices = [slim_slice(slice_obj("n2")), slim_slice(slice_obj("n1", driver="other.example.com"))]
    m = find_device(slices, "n1", DRIVERS, 3, uuid(3))
    assert m.ref is None
    assert "no DRA ResourceSlice of gpu.nvidia.com publishes the GPUs of node n1" in m.reason
    assert find_device(slices, "n1", ("other.example.com",), 3, uuid(3)).ref == DeviceRef(
        "other.example.com", "n1", "gpu-3"
    )


def test_older_pool_generations_are_ignored() -> None:
    slices = [
        slim_slice(slice_obj("n1", range(4), generation=1, name="old")),
        slim_slice(slice_obj("n1", range(4, 8), generation=2, name="new")),
    ]
    assert find_device(slices, "n1", DRIVERS, 2, uuid(2)).ref is None
    assert find_device(slices, "n1", DRIVERS, 5, uuid(5)).ref == DeviceRef("gpu.nvidia.com", "n1", "gpu-5")


def test_ambiguous_match_falls_back_with_a_reason() -> None:
    slices = [
        slim_slice(slice_obj("n1", range(2), name="a")),
        slim_slice(slice_obj("n1", range(2), name="b", driver="gpu.example.org")),
    ]
    m = find_device(slices, "n1", ("gpu.nvidia.com", "gpu.example.org"), 1, uuid(1))
    assert m.ref is None and "matches several DRA devices" in m.reason


def test_device_ref_prints_as_driver_pool_device() -> None:
    assert str(DeviceRef("gpu.nvidia.com", "n1", "gpu-3")) == "gpu.nvidia.com/n1/gpu-3"
