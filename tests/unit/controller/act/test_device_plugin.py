"""One bad GPU costs its pods, not the node, on a device-plugin node: through the node pipeline with
the in-memory fake API. No ResourceSlice publishes n1's GPUs, the Node has ``nvidia.com/gpu: 8``, and
the agent's report names the pod holding each GPU (the kubelet's pod-resources API)."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from gpuhealth.api import pods as P
from gpuhealth.api.devices import KEPT_OFF_BY_PLUGIN, KEPT_OFF_BY_TAINT, DeviceState, devices_from_status
from gpuhealth.api.names import GPU_OUT_TAINT_KEY, TAINT_KEY
from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import gpu, report_obj, xid_event
from tests.unit.controller.act._device_support import Clock, runtime
from tests.unit.fake_kube import FakeKube


def pods_on(i: int) -> list[dict[str, str]]:
    return [{"namespace": "ml", "name": f"on-gpu-{i}", "container": "main", "resource": "nvidia.com/gpu"}]


def plugin_report(
    *bad: int, xid: int | None = None, readable: bool = True, error: str = "", seconds: float = 0.0
) -> dict[str, Any]:
    """n1's report: ECC on the ``bad`` GPUs (or XID ``xid`` on them), each GPU's pod named under it."""
    devices = [
        gpu(i, ecc={"volatileUncorrected": 1} if i in bad and xid is None else {}, pods=pods_on(i) if readable else [])
        for i in range(8)
    ]
    xids = [xid_event(xid, seconds - 1, i) for i in bad] if xid is not None else []
    body = report_obj(name="n1", devices=devices, xids=xids, heartbeat=seconds)
    body["spec"]["podResources"] = {"available": readable, **({"error": error} if error else {})}
    return body


def setup(*bad: int, allocatable: int = 8, policy: dict[str, Any] | None = None, **report: Any) -> FakeKube:
    kube = FakeKube()
    kube.add_policy("p", policy or {"safety": {"maxUnhealthyGPUs": 4}, "actions": {"drain": {"maxWait": "1s"}}})
    kube.add_node("n1")
    kube.nodes["n1"]["status"]["allocatable"] = {"nvidia.com/gpu": str(allocatable)}
    kube.add_report(plugin_report(*bad, **report))
    for i in range(8):
        kube.add_pod("ml", f"on-gpu-{i}", "n1", {P.CHECKPOINT_MODE: "annotation"})
    return kube


async def passes(rt: Runtime, n: int = 4) -> None:
    for _ in range(n):
        await rt.reconciler.reconcile("n1")
    await rt.events.flush()


def run(kube: FakeKube, clock: Clock, n: int = 4) -> Runtime:
    async def body() -> Runtime:
        rt = await runtime(kube, clock, slices=False)  # the slice list is in, and publishes nothing
        await passes(rt, n)
        return rt

    return asyncio.run(body())


def taints(kube: FakeKube) -> list[dict[str, Any]]:
    return list(kube.nodes["n1"]["spec"].get("taints") or [])


def touched_pods(kube: FakeKube) -> set[str]:
    return {w[1] for w in kube.writes if w[1].startswith("pod/")}


def messages(kube: FakeKube, reason: str) -> list[str]:
    return [e["message"] for e in kube.events if e["reason"] == reason]


def test_an_ecc_fault_drains_only_its_gpus_pods_and_taints_the_node_without_a_cordon() -> None:
    kube = setup(2)
    run(kube, Clock())
    assert touched_pods(kube) == {"pod/ml/on-gpu-2"}  # the other GPUs' pods are never asked nor evicted
    node = kube.nodes["n1"]
    assert not node["spec"].get("unschedulable")
    assert [(t["key"], t["effect"]) for t in taints(kube)] == [(GPU_OUT_TAINT_KEY, "NoSchedule")]
    status = kube.reports["n1"]["status"]
    assert status["state"] == "Degraded" and status["inServiceGPUs"] == 7
    rec = devices_from_status(status)[2]
    assert rec.out_of_service and rec.kept_off_by == KEPT_OFF_BY_TAINT and not rec.taint_rules
    assert next(d for d in status["devices"] if d["index"] == 2)["keptOffBy"] == "NodeTaint"
    msg = messages(kube, "DeviceQuarantined")[0]
    assert "device plugin route" in msg and "ml/on-gpu-2" in msg and "other GPUs keep their work" in msg
    assert any(f"Tainted {GPU_OUT_TAINT_KEY}=gpu-2" in m for m in messages(kube, "GPUHealthAction"))
    assert not messages(kube, "NodeScopeFallback")


def test_a_gpu_the_plugin_withholds_takes_no_taint() -> None:
    kube = setup(2, xid=48, allocatable=7)  # NVIDIA's plugin dropped GPU 2 on the critical XID
    run(kube, Clock())
    assert not taints(kube) and not kube.nodes["n1"]["spec"].get("unschedulable")
    rec = devices_from_status(kube.reports["n1"]["status"])[2]
    assert rec.out_of_service and rec.kept_off_by == KEPT_OFF_BY_PLUGIN
    assert touched_pods(kube) == {"pod/ml/on-gpu-2"}
    assert "withheld by the device plugin (allocatable nvidia.com/gpu 7 of 8)" in messages(kube, "DeviceQuarantined")[0]


def test_an_xid_seen_before_the_kubelet_lowers_allocatable_takes_no_taint() -> None:
    """The agent reports the XID as soon as NVIDIA's plugin sees it, but the kubelet lowers allocatable
    only at its next node status update (every 10 s by default): the plugin is trusted meanwhile, and
    the taint never goes on once allocatable shows it (the real node: tests/integration/test_device_plugin.py)."""
    kube = setup(2, xid=48, allocatable=8)
    clock = Clock()
    run(kube, clock)
    assert not taints(kube) and not kube.nodes["n1"]["spec"].get("unschedulable")
    rec = devices_from_status(kube.reports["n1"]["status"])[2]
    assert rec.out_of_service and rec.kept_off_by == KEPT_OFF_BY_PLUGIN
    assert touched_pods(kube) == {"pod/ml/on-gpu-2"}
    (msg,) = messages(kube, "DeviceQuarantined")
    assert "withheld by the device plugin, which marks the GPU Unhealthy on this XID" in msg, msg
    assert "allocatable nvidia.com/gpu still 8 of 8 until the kubelet's next node status" in msg, msg
    kube.nodes["n1"]["status"]["allocatable"] = {"nvidia.com/gpu": "7"}  # the kubelet's next status
    clock.t += dt.timedelta(seconds=10)
    run(kube, clock)
    clock.t += dt.timedelta(seconds=60)
    run(kube, clock)
    assert not taints(kube)
    assert devices_from_status(kube.reports["n1"]["status"])[2].kept_off_by == KEPT_OFF_BY_PLUGIN


def test_the_plugin_not_withholding_an_xid_gpu_takes_the_taint() -> None:
    kube = setup(2, xid=48, allocatable=8)  # the plugin's health checks are off (DP_DISABLE_HEALTHCHECKS)
    clock = Clock()
    run(kube, clock)
    assert not taints(kube)  # the kubelet may not have reported it yet
    clock.t += dt.timedelta(seconds=31)  # it would have by now
    run(kube, clock)
    assert [t["key"] for t in taints(kube)] == [GPU_OUT_TAINT_KEY]
    assert devices_from_status(kube.reports["n1"]["status"])[2].kept_off_by == KEPT_OFF_BY_TAINT


def test_an_xid_the_plugin_skips_takes_the_taint_at_once() -> None:
    """NVIDIA's plugin ignores application XIDs (13, 31, 43, 45, 68, 109); gpuhealth holds a GPU out
    for them only when they repeat (RepeatedAppXID), and nothing makes the kubelet withhold it."""
    kube = setup(
        2, xid=109, allocatable=8, policy={"rules": {"xid": {"overrides": [{"code": 109, "action": "drain"}]}}}
    )
    run(kube, Clock())
    assert [t["key"] for t in taints(kube)] == [GPU_OUT_TAINT_KEY]


def test_recovery_lifts_the_taint_and_a_restart_neither_lifts_it_early_nor_evicts_twice() -> None:
    kube = setup(2, policy={"safety": {"maxUnhealthyGPUs": 4, "probation": "1m"}})
    clock = Clock()
    run(kube, clock)
    evictions = [w for w in kube.writes if w[0] == "evict"]
    assert [t["key"] for t in taints(kube)] == [GPU_OUT_TAINT_KEY]
    run(kube, clock)  # a restarted operator: reads the record and the taint again
    assert [w for w in kube.writes if w[0] == "evict"] == evictions
    assert [t["key"] for t in taints(kube)] == [GPU_OUT_TAINT_KEY]
    # The fault clears: probation, then the GPU returns and the taint goes.
    kube.reports["n1"]["spec"] = plugin_report(seconds=30)["spec"]
    clock.t += dt.timedelta(seconds=30)
    run(kube, clock, 2)
    assert devices_from_status(kube.reports["n1"]["status"])[2].state == DeviceState.RECOVERING
    assert [t["key"] for t in taints(kube)] == [GPU_OUT_TAINT_KEY]  # still held out: kept
    kube.reports["n1"]["spec"] = plugin_report(seconds=100)["spec"]
    clock.t += dt.timedelta(seconds=70)
    run(kube, clock, 2)
    rec = devices_from_status(kube.reports["n1"]["status"])[2]
    assert rec.state == DeviceState.IN_SERVICE and not rec.kept_off_by
    assert not taints(kube)
    assert any(f"Removed gpuhealth's taint {GPU_OUT_TAINT_KEY}" in m for m in messages(kube, "GPUHealthAction"))


def test_a_foreign_taint_stays_through_the_episode() -> None:
    kube = setup(2)
    kube.nodes["n1"]["spec"]["taints"] = [{"key": "team/reserved", "effect": "NoSchedule"}]
    run(kube, Clock())
    assert [t["key"] for t in taints(kube)] == ["team/reserved", GPU_OUT_TAINT_KEY]


def test_without_pod_resources_the_node_falls_back_and_says_why() -> None:
    kube = setup(2, readable=False, error="dial unix /var/lib/kubelet/pod-resources/kubelet.sock: permission denied")
    run(kube, Clock())
    assert any(t["key"] == TAINT_KEY for t in taints(kube)) and kube.nodes["n1"]["spec"].get("unschedulable")
    assert not any(t["key"] == GPU_OUT_TAINT_KEY for t in taints(kube))
    why = messages(kube, "NodeScopeFallback")[0]
    assert "cannot read the kubelet's pod-resources socket: dial unix" in why and "permission denied" in why


def test_dry_run_taints_nothing_and_moves_no_pod() -> None:
    kube = setup(2, policy={"mode": "DryRun", "safety": {"maxUnhealthyGPUs": 4}})
    run(kube, Clock())
    assert not taints(kube) and not touched_pods(kube)
    rec = devices_from_status(kube.reports["n1"]["status"])[2]
    assert rec.out_of_service and rec.kept_off_by == KEPT_OFF_BY_TAINT
    msg = messages(kube, "DeviceQuarantined")[0]
    assert msg.startswith("DryRun (policy p): no Node is tainted, no pod is moved.")


def test_a_second_bad_gpu_escalates_to_the_node() -> None:
    kube = setup(2, 5)  # maxBadGPUsPerNode 1
    run(kube, Clock())
    assert any(t["key"] == TAINT_KEY for t in taints(kube)) and kube.nodes["n1"]["spec"].get("unschedulable")
    assert messages(kube, "DeviceEscalated")
