"""A GPU held out is all of its DRA devices, through the node pipeline with the in-memory fake API:
static MIG, partitionable placements, re-partitioning while held out, a kill between two rule writes,
the record's round trip, the drain's selection, device-plugin MIG, a MIG GPU's validation waiting
for every instance."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Mapping
from typing import Any

from devkit import dra_shapes as S
from gpuhealth.actions.placement import place
from gpuhealth.actions.slices import slim_slice
from gpuhealth.api import pods as P
from gpuhealth.api.devices import DeviceRecord, DeviceRef, DeviceState, devices_from_status
from gpuhealth.api.names import Action, Scope, Signal
from gpuhealth.api.nodes import device_plugin_mig
from gpuhealth.controller import metrics
from gpuhealth.controller.act.device_rules import desired_rules
from gpuhealth.controller.process.runtime import Runtime
from gpuhealth.drain.claims import pods_holding
from gpuhealth.evaluation.assess import Finding
from tests.unit.builders import T0, at, gpu, report_obj
from tests.unit.fake_kube import FakeKube

MIG2 = ("gpu-2-mig-3g40gb-9-0", "gpu-2-mig-3g40gb-9-4")


def uuid(i: int) -> str:
    return f"GPU-{i:04d}"  # what tests/unit/builders.py's reports say


def ecc_on(*bad: int) -> dict[str, Any]:
    return report_obj(
        name="n1", devices=[gpu(i, ecc={"volatileUncorrected": 1}) if i in bad else gpu(i) for i in range(8)]
    )


def static_mig(
    layout: tuple[tuple[str, int], ...] = (("3g.40gb", 0), ("3g.40gb", 4)), generation: int = 1
) -> S.Published:
    gpus = [S.Gpu(i, uuid(i), layout if i == 2 else ()) for i in range(8)]
    return S.static_slices("n1", gpus, generation=generation)


def claim(name: str, device: str, pod: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml"},
        "status": {
            "allocation": {"devices": {"results": [{"driver": S.DRIVER, "pool": "n1", "device": device}]}},
            "reservedFor": [{"resource": "pods", "name": pod, "uid": f"uid-ml-{pod}"}],
        },
    }


class Clock:
    def __init__(self) -> None:
        self.t = at(10)

    def __call__(self) -> dt.datetime:
        return self.t


def setup(pub: S.Published, bad: int, pods: Mapping[str, str]) -> FakeKube:
    kube = FakeKube()
    kube.add_policy("p", {"safety": {"maxUnhealthyGPUs": 4}, "actions": {"drain": {"maxWait": "1s"}}})
    kube.add_node("n1")
    kube.add_report(ecc_on(bad))
    kube.slices = pub.slices
    for pod, device in pods.items():
        kube.add_pod("ml", pod, "n1", {P.CHECKPOINT_MODE: "annotation"})
        kube.claims.append(claim(f"c-{pod}", device, pod))
    return kube


async def runtime(kube: FakeKube, clock: Clock) -> Runtime:
    rt = Runtime(kube, clock=clock, workers=1)
    rt.slice_watch.cache.replace([slim_slice(s) for s in kube.slices])
    await rt._load()
    await rt._list_pods()
    return rt


def record(kube: FakeKube, index: int) -> DeviceRecord:
    return devices_from_status(kube.reports["n1"]["status"])[index]


def ours(kube: FakeKube) -> dict[str, str]:
    return {n: r["spec"]["deviceSelector"]["device"] for n, r in kube.rules.items()}


def test_static_mig_gpu_holds_out_exactly_its_mig_devices_and_drains_only_their_pods() -> None:
    kube = setup(static_mig(), 2, {"mig-a": MIG2[0], "mig-b": MIG2[1], "full-0": "gpu-0"})
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        for _ in range(3):
            await rt.reconciler.reconcile("n1")
        await rt.devices.sweep()
        await rt.events.flush()

    asyncio.run(body())
    assert ours(kube) == {f"gpuhealth-n1-{d}": d for d in MIG2}
    assert {r["metadata"]["labels"]["gpuhealth.dev/device-kind"] for r in kube.rules.values()} == {"mig"}
    rec = record(kube, 2)
    assert rec.devices == tuple(f"{S.DRIVER}/n1/{d}" for d in MIG2) and rec.partitions == rec.devices
    assert rec.taint_rules == tuple(f"gpuhealth-n1-{d}" for d in MIG2)
    status = kube.reports["n1"]["status"]
    assert status["state"] == "Degraded" and status["inServiceGPUs"] == 7  # the partitioned GPU counts once
    entry = next(d for d in status["devices"] if d["index"] == 2)
    assert entry["taintRule"] == rec.taint_rules[0] and entry["device"] == rec.devices[0]  # the previous fields
    node = kube.nodes["n1"]
    assert not node["spec"].get("unschedulable") and not node["spec"].get("taints")
    touched = {w[1] for w in kube.writes if w[1].startswith("pod/")}
    assert touched == {"pod/ml/mig-a", "pod/ml/mig-b"}
    msg = next(e["message"] for e in kube.events if e["reason"] == "DeviceQuarantined")
    assert f"GPU 2 ({uuid(2)})" in msg and f"its 2 MIG devices {MIG2[0]}, {MIG2[1]}" in msg
    assert f"DeviceTaintRules gpuhealth-n1-{MIG2[0]}, gpuhealth-n1-{MIG2[1]}" in msg
    assert metrics.REGISTRY.get_sample_value("gpuhealth_device_rules", {"policy": "p", "kind": "mig"}) == 2


def test_partitionable_gpu_holds_out_its_full_device_and_every_placement() -> None:
    pub = S.partitionable_slices("n1", [S.Gpu(i, uuid(i)) for i in range(2)])
    placement = "gpu-0-mig-1g10gb-19-3"
    kube = setup(pub, 0, {"on-placement": placement, "on-gpu-1": "gpu-1-mig-3g40gb-9-4"})
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        for _ in range(3):
            await rt.reconciler.reconcile("n1")

    asyncio.run(body())
    assert set(ours(kube).values()) == pub.devices[uuid(0)] and len(kube.rules) == 15
    assert kube.rules["gpuhealth-n1-gpu-0"]["metadata"]["labels"]["gpuhealth.dev/device-kind"] == "gpu"
    assert {w[1] for w in kube.writes if w[1].startswith("pod/")} == {"pod/ml/on-placement"}
    assert record(kube, 0).device == f"{S.DRIVER}/n1/gpu-0"  # the full device first


def test_a_gpu_repartitioned_while_held_out_holds_out_its_new_devices_and_lets_the_vanished_go() -> None:
    kube = setup(static_mig(), 2, {})
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")
        assert set(ours(kube).values()) == set(MIG2)
        # The driver republishes GPU 2 as one 7g.80gb in a new pool generation (the old slice lingers).
        kube.slices = kube.slices + static_mig((("7g.80gb", 0),), generation=2).slices
        rt.slice_watch.cache.replace([slim_slice(s) for s in kube.slices])
        clock.t += dt.timedelta(seconds=1)
        await rt.reconciler.reconcile("n1")
        await rt.events.flush()

    asyncio.run(body())
    assert ours(kube) == {"gpuhealth-n1-gpu-2-mig-7g80gb-0-0": "gpu-2-mig-7g80gb-0-0"}
    assert record(kube, 2).devices == (f"{S.DRIVER}/n1/gpu-2-mig-7g80gb-0-0",)
    msg = next(e["message"] for e in kube.events if e["reason"] == "DeviceSetChanged")
    assert "now also held out gpu-2-mig-7g80gb-0-0" in msg and MIG2[0] in msg


def test_slices_that_vanish_while_a_gpu_is_held_out_keep_its_recorded_rules() -> None:
    kube = setup(static_mig(), 2, {})
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")
        rt.slice_watch.cache.replace([])  # the driver restarts
        clock.t += dt.timedelta(seconds=1)
        await rt.reconciler.reconcile("n1")
        await rt.devices.sweep()

    asyncio.run(body())
    assert set(ours(kube).values()) == set(MIG2)


def test_a_pool_being_republished_keeps_the_recorded_devices_beside_the_new() -> None:
    kube = setup(static_mig(), 2, {})
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")
        # Generation 2 spans two slices; only the first has arrived (it holds one new 1g.10gb device).
        layout = (("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4))
        gpus = [S.Gpu(i, uuid(i), layout if i == 2 else ()) for i in range(8)]
        first = S.static_slices("n1", gpus, generation=2, slices=2).slices[:1]
        rt.slice_watch.cache.replace([slim_slice(s) for s in kube.slices + first])
        clock.t += dt.timedelta(seconds=1)
        await rt.reconciler.reconcile("n1")

    asyncio.run(body())
    held = set(ours(kube).values())
    assert set(MIG2) <= held and len(held) > 2  # the old devices stay while the pool is incomplete


class Killed(BaseException):
    """SIGKILL: nothing after it runs, no handler catches it."""


class KilledAfter(FakeKube):
    def __init__(self, creates: int) -> None:
        super().__init__()
        self.left = creates

    def create_device_taint_rule(self, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.left == 0:
            raise Killed()
        self.left -= 1
        return super().create_device_taint_rule(body)


def test_killed_between_two_rule_writes_converges_with_one_rule_per_device() -> None:
    pub = S.partitionable_slices("n1", [S.Gpu(i, uuid(i)) for i in range(2)], profiles=["3g.40gb", "7g.80gb"])
    kube = KilledAfter(2)
    kube.add_policy("p", {"safety": {"maxUnhealthyGPUs": 4}})
    kube.add_node("n1")
    kube.add_report(ecc_on(1))
    kube.slices = pub.slices
    clock = Clock()

    async def first() -> None:
        rt = await runtime(kube, clock)
        try:
            await rt.reconciler.reconcile("n1")
            raise AssertionError("not killed")
        except Killed:
            pass

    asyncio.run(first())
    assert len(kube.rules) == 2 and len(record(kube, 1).taint_rules) == 4  # the record names all four
    kube.left = -1  # restarted: no more kills

    async def restarted() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")
        await rt.reconciler.reconcile("n1")

    asyncio.run(restarted())
    assert sorted(ours(kube).values()) == sorted(pub.devices[uuid(1)])
    creates = [w[1] for w in kube.writes if w[0] == "create"]
    assert len(creates) == len(set(creates)) == 4  # each rule created once, never a duplicate request


def test_the_record_round_trips_and_reads_the_previous_versions_single_fields() -> None:
    rec = DeviceRecord(
        2,
        uuid(2),
        DeviceState.QUARANTINED,
        "EccUncorrected",
        since=T0,
        devices=(f"{S.DRIVER}/n1/{MIG2[0]}", f"{S.DRIVER}/n1/{MIG2[1]}"),
        partitions=(f"{S.DRIVER}/n1/{MIG2[0]}", f"{S.DRIVER}/n1/{MIG2[1]}"),
        taint_rules=(f"gpuhealth-n1-{MIG2[0]}", f"gpuhealth-n1-{MIG2[1]}"),
    )
    entry = rec.to_status()
    assert entry["devices"] == list(rec.devices) and entry["taintRules"] == list(rec.taint_rules)
    assert entry["device"] == rec.devices[0] and entry["taintRule"] == rec.taint_rules[0]
    assert DeviceRecord.from_status(entry) == rec
    old = {"index": 3, "state": "Quarantined", "device": f"{S.DRIVER}/n1/gpu-3", "taintRule": "gpuhealth-n1-gpu-3"}
    back = DeviceRecord.from_status(old)
    assert (
        back is not None and back.devices == (f"{S.DRIVER}/n1/gpu-3",) and back.taint_rules == ("gpuhealth-n1-gpu-3",)
    )
    assert back.refs() == (DeviceRef(S.DRIVER, "n1", "gpu-3"),)
    assert "devices" not in DeviceRecord(4).to_status()  # a GPU in service lists nothing


def test_rule_planning_gives_one_rule_per_device_of_every_gpu_held_out() -> None:
    held = DeviceRecord(2, uuid(2), DeviceState.DRAINING, "XID48", devices=("d/n1/a", "d/n1/b"), partitions=("d/n1/b",))
    back = DeviceRecord(3, uuid(3), DeviceState.IN_SERVICE, devices=("d/n1/c",))
    rules = desired_rules([held, back], dry_run=True, taken={"gpuhealth-n1-a-x"})
    assert [r["spec"]["deviceSelector"]["device"] for r in rules] == ["a", "b"]
    assert [r["metadata"]["labels"]["gpuhealth.dev/device-kind"] for r in rules] == ["gpu", "mig"]
    assert {r["spec"]["taint"]["effect"] for r in rules} == {"None"}


def test_drain_selects_the_pods_on_any_of_the_gpus_devices() -> None:
    claims = [
        claim("a", MIG2[0], "pa"),
        claim("b", MIG2[1], "pb"),
        claim("c", "gpu-0", "pc"),
        claim("d", "gpu-3-mig-1g10gb-19-0", "pd"),
    ]
    refs = [DeviceRef(S.DRIVER, "n1", d) for d in MIG2]
    assert pods_holding(refs, claims) == {"ml/pa", "ml/pb"}


def test_device_plugin_mig_is_node_scope_and_says_why() -> None:
    node = {
        "metadata": {"labels": {}},
        "status": {"capacity": {"nvidia.com/mig-3g.40gb": "2", "nvidia.com/mig-1g.10gb": "0"}},
    }
    assert device_plugin_mig(node) == ("nvidia.com/mig-3g.40gb",)
    single = {
        "metadata": {
            "labels": {
                "nvidia.com/mig.strategy": "single",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb",
            }
        }
    }
    assert device_plugin_mig(single) == ("nvidia.com/gpu as MIG 3g.40gb, single strategy",)
    assert device_plugin_mig({"metadata": {}, "status": {"capacity": {"nvidia.com/gpu": "8"}}}) == ()
    f = Finding(Signal.ECC, Action.DRAIN, "x", 2, "", None, T0, Scope.DEVICE)
    p = place([f], "n1", [], (S.DRIVER,), {2: uuid(2)}, plugin_mig=device_plugin_mig(node))
    assert p.findings[0].scope == Scope.NODE and p.refs == {}
    assert "published through the device plugin (nvidia.com/mig-3g.40gb)" in p.fallbacks[2]
    assert "no per-device API" in p.fallbacks[2] and "whole node is quarantined" in p.fallbacks[2]


def test_a_mig_gpu_is_validated_only_once_every_instance_is_free_and_alone() -> None:
    """A MIG-enabled GPU held out whole climbs the ladder; its validation (like its reset) waits while
    a pod holds ANY of its instances (the cache missed it: the API is re-read), not only the first, and
    then runs ONE Job for that GPU alone (DCGM diagnoses a MIG GPU only with every instance idle)."""
    kube = FakeKube()
    kube.add_policy(
        "p",
        {
            "safety": {"maxUnhealthyGPUs": 4, "probation": "2s"},
            "remediation": {"enabled": True},
            "validation": {"enabled": True},
        },
    )
    kube.add_node("n1")
    kube.add_report(ecc_on(2))
    kube.slices = static_mig().slices
    clock = Clock()

    def validations() -> list[dict[str, Any]]:
        return [j for (_, n), j in kube.jobs.items() if n.startswith("gpuhealth-validate-")]

    async def body() -> None:
        rt = await runtime(kube, clock)
        for _ in range(4):
            await rt.reconciler.reconcile("n1")
            clock.t += dt.timedelta(seconds=1)
        assert record(kube, 2).taint_rules == tuple(f"gpuhealth-n1-{d}" for d in MIG2)
        ((ns, reset),) = kube.jobs
        kube.finish_job(ns, reset, "Complete")
        kube.add_pod("ml", "late", "n1")  # on the GPU's second instance: in the API, not in the cache
        kube.claims = [claim("c-late", MIG2[1], "late")]
        clean = report_obj(
            name="n1", devices=[gpu(i) for i in range(8)], heartbeat=(clock.t - Clock().t).total_seconds()
        )
        kube.reports["n1"]["spec"] = clean["spec"]
        rt.on_report("MODIFIED", dict(kube.reports["n1"]), enqueue=False)
        for _ in range(5):
            await rt.reconciler.reconcile("n1")
            clock.t += dt.timedelta(seconds=1)
        assert not validations(), "no diagnostic while a pod holds one of the GPU's instances"
        await rt.events.flush()
        blocked = [e["message"] for e in kube.events if e["reason"] == "RemediationBlocked"]
        assert any("ml/late" in m and MIG2[1] in m for m in blocked)
        kube.claims = []
        del kube.pods[("ml", "late")]
        for _ in range(3):
            await rt.reconciler.reconcile("n1")
            clock.t += dt.timedelta(seconds=1)

    asyncio.run(body())
    (job,) = validations()
    assert job["metadata"]["labels"]["gpuhealth.dev/gpu"] == "2"
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPU"] == "2" and env["GPU_UUID"] == uuid(2)
