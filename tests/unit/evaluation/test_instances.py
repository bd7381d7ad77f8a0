"""Faults confined to one MIG instance (issue #23 item 3): application XIDs counted per instance,
an instance finding placed on its MIG device alone or widened to its GPU with the reason, the
per-GPU record holding only that partition out, and the node pipeline on the in-memory fake API."""

from __future__ import annotations

import asyncio
from typing import Any

from devkit import dra_shapes as S
from gpuhealth.actions.placement import place
from gpuhealth.actions.slices import slim_slice
from gpuhealth.api.devices import DeviceRecord, DeviceRef, DeviceState
from gpuhealth.api.names import Action, Scope, Signal
from gpuhealth.api.report import parse_report
from gpuhealth.evaluation.assess import NodeView, assess
from gpuhealth.evaluation.devices import DeviceInputs, decide_devices, held_instances
from gpuhealth.evaluation.findings import Finding, Instance
from gpuhealth.evaluation.repeats import instance_scoped
from tests.unit.builders import T0, at, gpu, iso, make_policy, report_obj
from tests.unit.controller.act.test_partitions import MIG2, Clock, claim, record, runtime, static_mig, uuid

DRIVERS = (S.DRIVER,)
MIG_A = S.mig_uuid(uuid(2), "3g.40gb", 0)  # what static_mig() publishes for MIG2[0] ...
MIG_B = S.mig_uuid(uuid(2), "3g.40gb", 4)  # ... and MIG2[1]
MIG_DEVICES = [
    {"index": 0, "uuid": MIG_A, "gpuInstanceId": 1, "computeInstanceId": 0, "profile": "3g.40gb"},
    {"index": 1, "uuid": MIG_B, "gpuInstanceId": 2, "computeInstanceId": 0, "profile": "3g.40gb"},
]


def xid(code: int, s: float, gi: int | None = None, ci: int | None = None, gpu_index: int = 2) -> dict[str, Any]:
    ev: dict[str, Any] = {"xid": code, "time": iso(s), "source": "nvml", "gpu": gpu_index}
    if gi is not None:
        ev["gpuInstanceId"] = gi
    if ci is not None:
        ev["computeInstanceId"] = ci
    return ev


def mig_report(xids: list[dict[str, Any]], mig: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices = [
        gpu(i, migMode="Enabled", migDevices=mig if mig is not None else MIG_DEVICES) if i == 2 else gpu(i)
        for i in range(8)
    ]
    return report_obj(name="n1", devices=devices, xids=xids)


def repeats(xids: list[dict[str, Any]], mig: list[dict[str, Any]] | None = None) -> list[Finding]:
    a = assess(make_policy(), parse_report(mig_report(xids, mig)), NodeView("n1"), at(60))
    return [f for f in a.findings if f.signal == Signal.APP_XID_REPEATED]


# -- counting --------------------------------------------------------------------------------------


def test_repeats_on_one_instance_give_a_finding_confined_to_it_naming_it() -> None:
    (f,) = repeats([xid(13, s, 1, 0) for s in (1, 20, 40)])
    assert f.gpu == 2 and f.code == 13 and f.scope == Scope.DEVICE and f.action == Action.DRAIN
    assert f.instance == Instance(1, 0, MIG_A, "3g.40gb")
    assert f"on one MIG instance, MIG device GI 1 CI 0 (3g.40gb, {MIG_A})" in f.detail
    assert f.describe().startswith(f"GPU 2 ({uuid(2)}): application XID 13 repeated 3 times")


def test_one_each_over_instances_does_not_add_up_although_the_gpu_sum_would() -> None:
    spread = [xid(13, 1, 1, 0), xid(13, 20, 2, 0), xid(13, 40, 1, 0)]
    assert repeats(spread) == []
    # The same three XIDs unattributed are the GPU's, as on a GPU without MIG.
    (gpu_wide,) = repeats([xid(13, s) for s in (1, 20, 40)])
    assert gpu_wide.instance is None and "on one GPU" in gpu_wide.detail


def test_unattributed_and_attributed_xids_are_counted_apart() -> None:
    assert repeats([xid(13, 1), xid(13, 20), xid(13, 40, 1, 0)]) == []
    assert repeats([xid(13, 1, 1, 0), xid(13, 20, 1, 0), xid(13, 40)]) == []


def test_an_xid_attributed_to_the_gpu_instance_only_counts_for_its_one_device() -> None:
    (f,) = repeats([xid(43, 1, 1, 0), xid(43, 20, 1), xid(43, 40, 1, 0)])
    assert f.instance == Instance(1, 0, MIG_A, "3g.40gb")


def test_an_instance_the_agent_does_not_list_is_still_counted_apart_without_a_uuid() -> None:
    (f,) = repeats([xid(31, s, 7, 0) for s in (1, 20, 40)])
    assert f.instance == Instance(7, 0) and "MIG device GI 7 CI 0:" in f.detail


def test_hardware_xids_attributed_to_an_instance_stay_the_gpus() -> None:
    a = assess(make_policy(), parse_report(mig_report([xid(48, 5, 1, 0)])), NodeView("n1"), at(60))
    (f,) = [f for f in a.findings if f.code == 48]
    assert f.instance is None and f.scope == Scope.DEVICE and f.gpu == 2
    assert instance_scoped(13) and instance_scoped(94) and not instance_scoped(48) and not instance_scoped(79)


# -- placement -------------------------------------------------------------------------------------


def inst_finding(instance: Instance | None, gpu_index: int = 2) -> Finding:
    return Finding(
        Signal.APP_XID_REPEATED, Action.DRAIN, "d", gpu_index, uuid(gpu_index), 13, T0, Scope.DEVICE, instance
    )


UUIDS = {i: uuid(i) for i in range(8)}


def test_an_instance_finding_is_placed_on_its_mig_device_alone() -> None:
    slices = [slim_slice(s) for s in static_mig().slices]
    p = place([inst_finding(Instance(1, 0, MIG_A, "3g.40gb"))], "n1", slices, DRIVERS, UUIDS)
    assert p.instances == {MIG_A: DeviceRef(S.DRIVER, "n1", MIG2[0])}
    (f,) = p.findings
    assert f.scope == Scope.DEVICE and f.instance is not None and f.instance.uuid == MIG_A


def test_an_unprepared_placement_widens_to_the_whole_gpu_and_says_why() -> None:
    pub = S.partitionable_slices("n1", [S.Gpu(i, uuid(i)) for i in range(2)])
    p = place([inst_finding(Instance(1, 0, "MIG-x"), 0)], "n1", [slim_slice(s) for s in pub.slices], DRIVERS, UUIDS)
    (f,) = p.findings
    assert p.instances == {} and f.instance is None and f.scope == Scope.DEVICE
    assert f.detail == "d (no DRA device of node n1 publishes MIG-x: the whole GPU is held out instead)"
    assert len(p.refs[0].refs) == 15  # gpu-0 and every placement


def test_an_instance_without_a_uuid_or_on_another_gpu_widens() -> None:
    slices = [slim_slice(s) for s in static_mig().slices]
    (f,) = place([inst_finding(Instance(7, 0))], "n1", slices, DRIVERS, UUIDS).findings
    assert f.instance is None and f.detail.endswith(
        "(the agent lists no MIG device with a UUID for GI 7 CI 0 of GPU 2: the whole GPU is held out instead)"
    )
    # GPU 3 reports an instance whose UUID is GPU 2's MIG device: never held out as GPU 3's.
    (g,) = place([inst_finding(Instance(1, 0, MIG_A), 3)], "n1", slices, DRIVERS, UUIDS).findings
    assert g.instance is None and "is not one of GPU 3's MIG devices" in g.detail


# -- the per-GPU record ----------------------------------------------------------------------------


def test_held_instances_grow_while_out_and_never_narrow() -> None:
    a, b = inst_finding(Instance(1, 0, MIG_A)), inst_finding(Instance(2, 0, MIG_B))
    whole = inst_finding(None)
    fresh = DeviceRecord(index=2)
    assert held_instances(fresh, [a]) == (MIG_A,)
    assert held_instances(fresh, [a, whole]) == ()
    out_a = DeviceRecord(index=2, state=DeviceState.DRAINING, instances=(MIG_A,))
    assert held_instances(out_a, [b]) == tuple(sorted((MIG_A, MIG_B)))
    assert held_instances(out_a, [whole]) == ()
    out_whole = DeviceRecord(index=2, state=DeviceState.DRAINING)
    assert held_instances(out_whole, [a]) == ()


def test_decide_devices_records_the_instance_and_widens_on_a_gpu_finding() -> None:
    policy = make_policy()
    a = inst_finding(Instance(1, 0, MIG_A))
    v = decide_devices({}, [a], policy, at(10), DeviceInputs(uuids=UUIDS))
    rec = v.record(2)
    assert rec is not None and rec.state == DeviceState.DRAINING and rec.instances == (MIG_A,)
    assert rec.reason == "RepeatedAppXID" and v.new_quarantines == (2,)
    (ev,) = [e for e in v.events if e.reason == "DeviceQuarantined"]
    assert f"Only its MIG device {MIG_A} is taken out, the GPU serves on with its others" in ev.message
    v2 = decide_devices({2: rec}, [a, inst_finding(None)], policy, at(20), DeviceInputs(uuids=UUIDS))
    rec2 = v2.record(2)
    assert rec2 is not None and rec2.out_of_service and rec2.instances == ()


# -- the pipeline (in-memory fake API) ---------------------------------------------------------------


def test_repeats_on_one_instance_hold_out_its_mig_device_only_and_drain_only_its_pod() -> None:
    from gpuhealth.api import pods as P
    from tests.unit.fake_kube import FakeKube

    kube = FakeKube()
    kube.add_policy("p", {"safety": {"maxUnhealthyGPUs": 4}, "actions": {"drain": {"maxWait": "1s"}}})
    kube.add_node("n1")
    kube.add_report(mig_report([xid(13, s, 1, 0) for s in (1, 5, 9)]))
    kube.slices = static_mig().slices
    for pod, device in (("mig-a", MIG2[0]), ("mig-b", MIG2[1])):
        kube.add_pod("ml", pod, "n1", {P.CHECKPOINT_MODE: "annotation"})
        kube.claims.append(claim(f"c-{pod}", device, pod))
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        for _ in range(3):
            await rt.reconciler.reconcile("n1")
        await rt.devices.sweep()
        await rt.events.flush()

    asyncio.run(body())
    assert {n: r["spec"]["deviceSelector"]["device"] for n, r in kube.rules.items()} == {
        f"gpuhealth-n1-{MIG2[0]}": MIG2[0]
    }
    rec = record(kube, 2)
    assert rec.instances == (MIG_A,) and rec.reason == "RepeatedAppXID"
    assert rec.devices == rec.partitions == (f"{S.DRIVER}/n1/{MIG2[0]}",)
    assert "MIG device GI 1 CI 0 (3g.40gb" in rec.message
    status = kube.reports["n1"]["status"]
    assert status["state"] == "Degraded" and status["inServiceGPUs"] == 8  # GPU 2 serves with its other device
    assert f"(only its MIG device {MIG_A})" in status["message"]
    assert {w[1] for w in kube.writes if w[1].startswith("pod/")} == {"pod/ml/mig-a"}
    node = kube.nodes["n1"]
    assert not node["spec"].get("unschedulable") and not node["spec"].get("taints")
