"""Device-scoped findings placed on DRA devices, or turned node scope with a reason."""

from __future__ import annotations

from gpuhealth.actions.placement import place
from gpuhealth.actions.slices import DeviceRef, slim_slice
from gpuhealth.api.names import Action, Scope, Signal
from gpuhealth.evaluation.assess import Finding
from tests.unit.actions.test_slices import slice_obj, uuid
from tests.unit.builders import T0

UUIDS = {i: uuid(i) for i in range(8)}


def f(gpu: int | None, scope: Scope = Scope.DEVICE, signal: Signal = Signal.ECC) -> Finding:
    return Finding(signal, Action.DRAIN, "x", gpu, "", None, T0, scope)


def test_gpu_published_by_a_slice_stays_device_scope() -> None:
    p = place([f(3), f(3, signal=Signal.THERMAL)], "n1", [slim_slice(slice_obj("n1"))], ("gpu.nvidia.com",), UUIDS)
    assert {i: m.refs for i, m in p.refs.items()} == {3: (DeviceRef("gpu.nvidia.com", "n1", "gpu-3"),)}
    assert p.fallbacks == {}
    assert {x.scope for x in p.findings} == {Scope.DEVICE}


def test_device_plugin_node_falls_back_to_node_scope_with_a_reason() -> None:
    p = place(
        [f(3), f(None, Scope.NODE, Signal.GPU_COUNT)], "n1", [slim_slice(slice_obj("n2"))], ("gpu.nvidia.com",), UUIDS
    )
    assert p.refs == {}
    assert "no DRA ResourceSlice of gpu.nvidia.com publishes the GPUs of node n1" in p.fallbacks[3]
    assert [x.scope for x in p.findings] == [Scope.NODE, Scope.NODE]


def test_only_the_unpublished_gpu_falls_back() -> None:
    p = place([f(2), f(6)], "n1", [slim_slice(slice_obj("n1", range(4)))], ("gpu.nvidia.com",), UUIDS)
    assert set(p.refs) == {2} and set(p.fallbacks) == {6}
    assert [x.scope for x in p.findings] == [Scope.DEVICE, Scope.NODE]


def test_found_by_uuid_when_the_index_is_unknown_else_node() -> None:
    by_uuid = Finding(Signal.ECC, Action.DRAIN, "x", None, uuid(5), None, T0, Scope.DEVICE)
    unknown = Finding(Signal.ECC, Action.DRAIN, "x", None, "GPU-nobody", None, T0, Scope.DEVICE)
    p = place([by_uuid, unknown], "n1", [slim_slice(slice_obj("n1"))], ("gpu.nvidia.com",), UUIDS)
    assert {i: m.refs for i, m in p.refs.items()} == {5: (DeviceRef("gpu.nvidia.com", "n1", "gpu-5"),)}
    assert [x.scope for x in p.findings] == [Scope.DEVICE, Scope.NODE]


def test_a_gpu_whose_rule_name_someone_else_holds_falls_back_with_a_reason() -> None:
    slices = [slim_slice(slice_obj("n1"))]
    p = place([f(2), f(6)], "n1", slices, ("gpu.nvidia.com",), UUIDS, taken={"gpuhealth-n1-gpu-6"})
    assert [x.scope for x in p.findings] == [Scope.DEVICE, Scope.NODE]
    assert 6 not in p.refs and 2 in p.refs
    assert "holds the name gpuhealth-n1-gpu-6" in p.fallbacks[6] and "whole node" in p.fallbacks[6]
