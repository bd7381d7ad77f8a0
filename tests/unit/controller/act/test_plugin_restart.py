"""A repaired GPU goes back to the scheduler on a device-plugin node: through the node pipeline with the
in-memory fake API. n1 has ``nvidia.com/gpu`` 8, allocatable 7 (NVIDIA's plugin dropped GPU 2 on XID 48
and holds it Unhealthy until it restarts), no ResourceSlice, and the device plugin's pod in gpu-operator.
GPU 2 is reset, goes through its probation, the plugin's pod is deleted (write-ahead, once, even across
a kill) and the GPU returns only once allocatable is 8 again; without a pod or a permission, or past
the timeout, a Warning Event and the ladder's record say it stays withheld."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
from typing import Any

from gpuhealth.api.devices import DeviceState, devices_from_status
from gpuhealth.api.names import GPU_OUT_TAINT_KEY
from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import gpu, report_obj, xid_event
from tests.unit.controller.act._device_support import Clock, runtime
from tests.unit.fake_kube import FakeKube

NS = "gpuhealth-remediation"
PLUGIN_NS = "gpu-operator"
PLUGIN_POD = "nvidia-device-plugin-daemonset-a1"
POLICY: dict[str, Any] = {
    "safety": {"maxUnhealthyGPUs": 4, "probation": "2s"},
    "remediation": {"enabled": True, "devicePlugin": {"returnTimeout": "30s"}},
}


def add_plugin_pod(kube: FakeKube, name: str = PLUGIN_POD) -> None:
    kube.add_pod(PLUGIN_NS, name, "n1")
    meta = kube.pods[PLUGIN_NS, name]["metadata"]
    meta["labels"] = {"app": "nvidia-device-plugin-daemonset"}
    meta["ownerReferences"] = [{"kind": "DaemonSet", "name": "nvidia-device-plugin-daemonset", "controller": True}]


def setup(kube: FakeKube | None = None, plugin: bool = True, policy: dict[str, Any] | None = None) -> FakeKube:
    kube = kube or FakeKube()
    kube.add_policy("p", policy or POLICY)
    kube.add_node("n1")
    kube.nodes["n1"]["status"]["allocatable"] = {"nvidia.com/gpu": "7"}
    body = report_obj(name="n1", devices=[gpu(i, pods=[]) for i in range(8)], xids=[xid_event(48, -1, 2)])
    body["spec"]["podResources"] = {"available": True}
    kube.add_report(body)
    if plugin:
        add_plugin_pod(kube)
    return kube


class Run:
    """The operator's passes over n1, the agent's heartbeat kept fresh, the Node fed to the cache."""

    def __init__(self, kube: FakeKube, clock: Clock) -> None:
        self.kube, self.clock = kube, clock

    async def start(self) -> Runtime:
        return await runtime(self.kube, self.clock, slices=False)

    async def passes(self, rt: Runtime, n: int, step_s: float = 1.0) -> None:
        for _ in range(n):
            self.kube.reports["n1"]["spec"]["heartbeatTime"] = self.clock.t.isoformat().replace("+00:00", "Z")
            rt.on_report("MODIFIED", copy.deepcopy(self.kube.reports["n1"]), enqueue=False)
            rt.on_node("MODIFIED", copy.deepcopy(self.kube.nodes["n1"]), enqueue=False)
            await rt.reconciler.reconcile("n1")
            self.clock.t += dt.timedelta(seconds=step_s)
        await rt.events.flush()

    async def reset_done(self, rt: Runtime) -> None:
        """Through the reset: its Job created (tolerating gpu-out), finished, the GPU on probation."""
        await self.passes(rt, 3)
        ((ns, name),) = self.kube.jobs
        tolerations = self.kube.jobs[ns, name]["spec"]["template"]["spec"]["tolerations"]
        assert {"key": GPU_OUT_TAINT_KEY, "operator": "Exists"} in tolerations
        self.kube.finish_job(ns, name, "Complete")
        await self.passes(rt, 3)


def ladder(kube: FakeKube) -> dict[str, Any]:
    return dict((kube.reports["n1"].get("status") or {}).get("remediation", {}).get("2") or {})


def state(kube: FakeKube) -> DeviceState:
    return devices_from_status(kube.reports["n1"]["status"])[2].state


def pod_deletes(kube: FakeKube) -> list[str]:
    return [w[1] for w in kube.writes if w[0] == "delete" and w[1].startswith("pod/")]


def messages(kube: FakeKube, reason: str) -> list[str]:
    return [e["message"] for e in kube.events if e["reason"] == reason]


def test_the_plugin_is_restarted_once_and_the_gpu_returns_only_when_allocatable_shows_it() -> None:
    kube = setup()
    clock = Clock()
    run = Run(kube, clock)

    async def body() -> None:
        rt = await run.start()
        await run.reset_done(rt)
        assert ladder(kube)["phase"] in ("Succeeded", "RestartingPlugin") and state(kube) == DeviceState.RECOVERING
        await run.passes(rt, 4)  # probation over: the plugin's pod is recorded, then deleted
        rec = ladder(kube)
        assert rec["phase"] == "RestartingPlugin"
        assert rec["plugin"]["pod"] == f"{PLUGIN_NS}/{PLUGIN_POD}" and rec["plugin"]["deleted"] is True
        assert pod_deletes(kube) == [f"pod/{PLUGIN_NS}/{PLUGIN_POD}"]
        add_plugin_pod(kube, "nvidia-device-plugin-daemonset-b2")  # its DaemonSet's new pod
        await run.passes(rt, 5)  # allocatable still 7: the GPU is held, nothing deleted again
        assert state(kube) == DeviceState.RECOVERING and pod_deletes(kube) == [f"pod/{PLUGIN_NS}/{PLUGIN_POD}"]
        kube.nodes["n1"]["status"]["allocatable"] = {"nvidia.com/gpu": "8"}  # the new plugin registered it
        await run.passes(rt, 2)

    asyncio.run(body())
    assert state(kube) == DeviceState.IN_SERVICE and not ladder(kube)
    assert kube.reports["n1"]["status"]["inServiceGPUs"] == 8
    started = messages(kube, "RestartingDevicePlugin")
    assert len(started) == 1 and "allocatable nvidia.com/gpu 7 of 8" in started[0] and PLUGIN_POD in started[0]
    assert ["8 of 8" in m for m in messages(kube, "DevicePluginOffersGPU")] == [True]
    assert not messages(kube, "DevicePluginNotRestarted") and not messages(kube, "DevicePluginWithholdsGPU")
    # Only the device plugin's pod, and only the old one.
    assert (PLUGIN_NS, "nvidia-device-plugin-daemonset-b2") in kube.pods and (PLUGIN_NS, PLUGIN_POD) not in kube.pods


class KilledAt(FakeKube):
    """The process dies at the device plugin's pod delete: ``before`` it reaches the API, or right
    after the API deleted the pod (the DaemonSet's new pod appears) but before ``deleted`` is recorded."""

    def __init__(self, after: bool) -> None:
        super().__init__()
        self.after, self.killed = after, False

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        if self.killed:
            return super().delete_pod(namespace, name, uid)
        self.killed = True
        if self.after:
            super().delete_pod(namespace, name, uid)
            add_plugin_pod(self, "nvidia-device-plugin-daemonset-b2")
        raise RuntimeError("SIGKILL")


def killed_at_the_delete(after: bool) -> FakeKube:
    kube = KilledAt(after)
    setup(kube)
    clock = Clock()
    run = Run(kube, clock)

    async def body() -> None:
        rt = await run.start()
        await run.reset_done(rt)
        with contextlib.suppress(RuntimeError):
            await run.passes(rt, 5)
        assert kube.killed
        rec = ladder(kube)
        assert rec["phase"] == "RestartingPlugin" and rec["plugin"]["pod"] == f"{PLUGIN_NS}/{PLUGIN_POD}"
        assert "deleted" not in rec["plugin"]  # the write-ahead record, the delete not yet recorded done
        for _ in range(2):  # two restarts: the first deletes the recorded pod (or finds it gone), the second nothing
            rt = await run.start()
            await run.passes(rt, 3)
        assert ladder(kube)["plugin"]["deleted"] is True

    asyncio.run(body())
    return kube


def test_a_kill_before_the_delete_reaches_the_api_deletes_the_recorded_pod_once_after_the_restart() -> None:
    kube = killed_at_the_delete(after=False)
    assert pod_deletes(kube) == [f"pod/{PLUGIN_NS}/{PLUGIN_POD}"]  # the killed call never reached the API
    assert (PLUGIN_NS, PLUGIN_POD) not in kube.pods


def test_a_kill_after_the_delete_never_deletes_the_daemonsets_new_pod() -> None:
    kube = killed_at_the_delete(after=True)
    assert (PLUGIN_NS, "nvidia-device-plugin-daemonset-b2") in kube.pods  # its uid is not the recorded one
    assert pod_deletes(kube) == [f"pod/{PLUGIN_NS}/{PLUGIN_POD}"] * 2  # the second answered 404: done


def withheld_run(kube: FakeKube, n: int = 6) -> None:
    clock = Clock()
    run = Run(kube, clock)

    async def body() -> None:
        rt = await run.start()
        await run.reset_done(rt)
        await run.passes(rt, n)
        assert state(kube) == DeviceState.RECOVERING, "withheld by the plugin: not counted returned"
        kube.nodes["n1"]["status"]["allocatable"] = {"nvidia.com/gpu": "8"}  # a human restarted the plugin
        await run.passes(rt, 2)
        assert state(kube) == DeviceState.IN_SERVICE

    asyncio.run(body())


def test_without_a_plugin_pod_the_gpu_stays_withheld_and_says_so_until_allocatable_shows_it() -> None:
    kube = setup(plugin=False)
    withheld_run(kube)
    assert not pod_deletes(kube)
    (msg,) = messages(kube, "DevicePluginNotRestarted")
    assert "no pod of the device plugin (namespace gpu-operator, labels app=nvidia-device-plugin-daemonset)" in msg
    assert "stays withheld until the device plugin's pod on the node restarts" in msg
    assert "kubectl delete pod -n gpu-operator -l app=nvidia-device-plugin-daemonset" in msg


def test_a_403_is_a_warning_and_a_status_line_never_a_silent_loss() -> None:
    kube = setup()
    kube.refuse_pod_deletes[PLUGIN_NS] = 403
    clock = Clock()
    run = Run(kube, clock)

    async def body() -> None:
        rt = await run.start()
        await run.reset_done(rt)
        await run.passes(rt, 6)

    asyncio.run(body())
    rec = ladder(kube)
    assert rec["phase"] == "RestartingPlugin" and "403 Forbidden" in rec["plugin"]["blocked"]
    assert "stays withheld" in rec["message"] and state(kube) == DeviceState.RECOVERING
    assert len(messages(kube, "DevicePluginNotRestarted")) == 1
    assert pod_deletes(kube) == [f"pod/{PLUGIN_NS}/{PLUGIN_POD}"]  # tried once, refused, not again
    assert (PLUGIN_NS, PLUGIN_POD) in kube.pods


def test_allocatable_not_back_in_time_is_one_warning_and_the_gpu_still_waits() -> None:
    kube = setup()
    withheld_run(kube, n=40)  # 30s returnTimeout
    (msg,) = messages(kube, "DevicePluginWithholdsGPU")
    assert f"{PLUGIN_NS}/{PLUGIN_POD}" in msg and "allocatable nvidia.com/gpu 7 of 8" in msg
    assert pod_deletes(kube) == [f"pod/{PLUGIN_NS}/{PLUGIN_POD}"]
