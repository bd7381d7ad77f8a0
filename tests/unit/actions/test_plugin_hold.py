"""A GPU held out on a device-plugin node: placed without a DRA device (its pods come from the
report), and kept off new work by the plugin's own withholding or gpuhealth's gpu-out taint. Pure."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from gpuhealth.actions.nodes import Marks, plan_node
from gpuhealth.actions.placement import PluginNode, place
from gpuhealth.actions.plugin_hold import (
    awaiting_kubelet,
    gpu_out_tainted,
    kept_off_by,
    kept_off_words,
    plugin_sees,
)
from gpuhealth.actions.slices import slim_slice
from gpuhealth.api.devices import KEPT_OFF_BY_PLUGIN, KEPT_OFF_BY_TAINT, DeviceRecord, DeviceState
from gpuhealth.api.names import GPU_OUT_TAINT_KEY, TAINT_KEY, Action, Scope, Signal, State
from gpuhealth.api.nodes import plugin_gpus, plugin_withholds
from gpuhealth.api.report import PodResources
from gpuhealth.evaluation.assess import Finding
from gpuhealth.evaluation.findings import Instance
from tests.unit.actions.test_slices import slice_obj, uuid
from tests.unit.builders import T0

UUIDS = {i: uuid(i) for i in range(8)}
DRIVERS = ("gpu.nvidia.com",)
READABLE = PluginNode(PodResources(True))


def f(gpu: int | None, scope: Scope = Scope.DEVICE, instance: Instance | None = None) -> Finding:
    return Finding(Signal.ECC, Action.DRAIN, "x", gpu, "", None, T0, scope, instance)


def node(capacity: int | None = 8, allocatable: int | None = 8, taints: list[dict[str, Any]] | None = None) -> Any:
    status: dict[str, Any] = {}
    if capacity is not None:
        status["capacity"] = {"nvidia.com/gpu": str(capacity), "cpu": "96"}
    if allocatable is not None:
        status["allocatable"] = {"nvidia.com/gpu": str(allocatable)}
    return {"metadata": {"name": "n1", "resourceVersion": "5"}, "spec": {"taints": taints or []}, "status": status}


# -- placement ---------------------------------------------------------------------------------------


def test_a_gpu_no_slice_publishes_stays_device_scope_on_a_device_plugin_node() -> None:
    p = place([f(3), f(None, Scope.NODE)], "n1", [], DRIVERS, UUIDS, plugin=READABLE)
    assert p.plugin == {3} and p.refs == {} and p.fallbacks == {}
    assert [x.scope for x in p.findings] == [Scope.DEVICE, Scope.NODE]


def test_a_gpu_a_slice_publishes_takes_the_dra_path_even_with_a_plugin() -> None:
    p = place([f(3)], "n1", [slim_slice(slice_obj("n1"))], DRIVERS, UUIDS, plugin=READABLE)
    assert p.plugin == frozenset() and set(p.refs) == {3}


def test_slices_that_publish_other_gpus_of_the_node_are_no_device_plugin_node() -> None:
    p = place([f(6)], "n1", [slim_slice(slice_obj("n1", range(4)))], DRIVERS, UUIDS, plugin=READABLE)
    assert p.plugin == frozenset() and 6 in p.fallbacks and p.findings[0].scope == Scope.NODE


@pytest.mark.parametrize(
    ("pods", "words"),
    [
        (
            PodResources(False, "dial unix /var/lib/kubelet/pod-resources/kubelet.sock: permission denied"),
            "the agent cannot read the kubelet's pod-resources socket: dial unix /var/lib/kubelet/pod-resources/"
            "kubelet.sock: permission denied",
        ),
        (None, "the agent does not report which pods hold each GPU"),
    ],
)
def test_without_pod_resources_the_gpu_falls_back_and_the_reason_says_why(
    pods: PodResources | None, words: str
) -> None:
    p = place([f(3)], "n1", [], DRIVERS, UUIDS, plugin=PluginNode(pods))
    assert p.plugin == frozenset() and p.findings[0].scope == Scope.NODE
    assert words in p.fallbacks[3] and "no DRA ResourceSlice of gpu.nvidia.com" in p.fallbacks[3]
    assert p.fallbacks[3].endswith("the whole node is quarantined instead")


def test_a_device_plugin_mig_node_keeps_its_reason_unless_the_report_names_the_holders() -> None:
    mig = ("nvidia.com/mig-3g.40gb",)
    unreadable = place([f(2)], "n1", [], DRIVERS, UUIDS, plugin_mig=mig, plugin=PluginNode(PodResources(False), mig))
    assert "partitioned with MIG and published through the device plugin" in unreadable.fallbacks[2]
    one = Instance(1, 0, "MIG-aaaa", "3g.40gb")
    readable = place(
        [f(2, instance=one)], "n1", [], DRIVERS, UUIDS, plugin_mig=mig, plugin=PluginNode(PodResources(True), mig)
    )
    assert readable.plugin == {2} and readable.fallbacks == {}
    widened = readable.findings[0]
    assert widened.scope == Scope.DEVICE and widened.instance is None
    assert "through the device plugin" in widened.detail and "the whole GPU is held out instead" in widened.detail


def test_no_plugin_keeps_todays_fallback() -> None:
    p = place([f(3)], "n1", [], DRIVERS, UUIDS)
    assert p.plugin == frozenset() and "(device plugin only?)" in p.fallbacks[3]


# -- keeping new work off ----------------------------------------------------------------------------


def test_the_plugin_withholds_when_allocatable_dropped_by_the_gpus_out() -> None:
    assert plugin_gpus(node(8, 7)) == (8, 7)
    assert plugin_withholds(node(8, 7), 1) and not plugin_withholds(node(8, 7), 2)
    assert not plugin_withholds(node(8, 8), 1)
    assert plugin_gpus(node(None, None)) is None and not plugin_withholds(node(None, None), 1)
    assert plugin_gpus(node(8, None)) == (8, 8)  # no allocatable reported: nothing withheld


def test_kept_off_by() -> None:
    assert kept_off_by(node(8, 7), 0) == ""
    assert kept_off_by(node(8, 7), 1) == KEPT_OFF_BY_PLUGIN
    assert kept_off_by(node(8, 8), 1) == KEPT_OFF_BY_TAINT  # the plugin cannot know: ECC, heat, PCIe, ...
    assert kept_off_by(node(8, 7), 2) == KEPT_OFF_BY_TAINT  # it withholds one of the two
    assert kept_off_by(node(8, 7), 1, mig=True) == KEPT_OFF_BY_TAINT  # nvidia.com/gpu does not count MIG devices
    tainted = node(8, 7, [{"key": GPU_OUT_TAINT_KEY, "value": "gpu-2", "effect": "NoSchedule"}])
    assert gpu_out_tainted(tainted) and kept_off_by(tainted, 1) == KEPT_OFF_BY_TAINT  # on until none is out
    assert "allocatable nvidia.com/gpu 7 of 8" in kept_off_words(node(8, 7), KEPT_OFF_BY_PLUGIN)
    assert "NoSchedule" in kept_off_words(node(8, 7), KEPT_OFF_BY_TAINT)


def test_an_xid_the_plugin_sees_is_trusted_to_it_until_the_kubelet_could_have_reported_it() -> None:
    assert plugin_sees("XID48") and plugin_sees("XID79") and plugin_sees("XID154")
    assert not plugin_sees("XID13") and not plugin_sees("XID109")  # NVIDIA's plugin skips them
    assert not plugin_sees("EccUncorrected") and not plugin_sees("RepeatedAppXID") and not plugin_sees("XID")

    def out(reason: str, ago: float) -> DeviceRecord:
        return DeviceRecord(2, state=DeviceState.DRAINING, reason=reason, since=T0 - dt.timedelta(seconds=ago))

    assert awaiting_kubelet([out("XID48", 0)], T0) and awaiting_kubelet([out("XID48", 29)], T0)
    assert not awaiting_kubelet([out("XID48", 30)], T0)  # the kubelet would have reported it by now
    assert not awaiting_kubelet([out("XID48", 0), out("EccUncorrected", 0)], T0)  # one the plugin cannot see
    assert not awaiting_kubelet([], T0)
    assert kept_off_by(node(8, 8), 1, awaiting=True) == KEPT_OFF_BY_PLUGIN
    assert kept_off_by(node(8, 8), 1, mig=True, awaiting=True) == KEPT_OFF_BY_TAINT
    tainted = node(8, 8, [{"key": GPU_OUT_TAINT_KEY, "value": "gpu-2", "effect": "NoSchedule"}])
    assert kept_off_by(tainted, 1, awaiting=True) == KEPT_OFF_BY_TAINT  # once on, on for the episode
    words = kept_off_words(node(8, 8), KEPT_OFF_BY_PLUGIN)
    assert "marks the GPU Unhealthy on this XID" in words and "still 8 of 8" in words


# -- the taint on the Node ---------------------------------------------------------------------------

FOREIGN = {"key": "team/reserved", "effect": "NoSchedule"}


def marks(gpu_out: bool, state: State = State.DEGRADED, value: str = "gpu-2") -> Marks:
    return Marks(state=state, quarantine=False, gpu_out=gpu_out, gpu_out_value=value)


def test_the_gpu_out_taint_is_placed_beside_foreign_taints_without_a_cordon() -> None:
    plan = plan_node(node(taints=[FOREIGN]), marks(True))
    assert plan.actions == ("gpu-out-taint",) and plan.patch is not None
    assert plan.patch["spec"] == {
        "taints": [FOREIGN, {"key": GPU_OUT_TAINT_KEY, "value": "gpu-2", "effect": "NoSchedule"}]
    }
    assert plan.patch["metadata"]["resourceVersion"] == "5"


def test_the_gpu_out_taint_stays_is_renamed_and_is_lifted_leaving_foreign_taints() -> None:
    ours = {"key": GPU_OUT_TAINT_KEY, "value": "gpu-2", "effect": "NoSchedule"}
    on = node(taints=[FOREIGN, ours])
    assert (
        plan_node(
            {**on, "metadata": {**on["metadata"], "labels": {"gpuhealth.dev/state": "Degraded"}}}, marks(True)
        ).patch
        is None
    )
    renamed = plan_node(on, marks(True, value="gpus-2.5"))
    assert renamed.actions == ("gpu-out-retaint",)
    lifted = plan_node(on, marks(False, State.HEALTHY))
    assert lifted.actions == ("gpu-out-untaint",) and lifted.patch is not None
    assert lifted.patch["spec"] == {"taints": [FOREIGN]}


def test_a_node_quarantine_keeps_the_gpu_out_taint_beside_its_own() -> None:
    ours = {"key": GPU_OUT_TAINT_KEY, "value": "gpu-2", "effect": "NoSchedule"}
    m = Marks(state=State.QUARANTINED, quarantine=True, reason="XID79", gpu_out=True, gpu_out_value="gpu-2")
    plan = plan_node(node(taints=[ours]), m)
    assert plan.patch is not None
    assert [t["key"] for t in plan.patch["spec"]["taints"]] == [GPU_OUT_TAINT_KEY, TAINT_KEY]
