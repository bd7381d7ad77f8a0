"""The slim cached bodies keep every fact the operator reads: a report parses to the same Report
(or is refused with the same error) before and after slimming, a Node plans the same patch, and
shared leaves are read only."""

from __future__ import annotations

import copy
import gc
import pickle
import sys
from typing import Any

import pytest

from gpuhealth.actions.nodes import Marks, plan_condition, plan_node
from gpuhealth.api import pods as P
from gpuhealth.api.names import State
from gpuhealth.api.nodes import node_gpus
from gpuhealth.api.report import ReportError, parse_report
from gpuhealth.controller.state import slim
from gpuhealth.controller.state.slim import Leaf, MigEntry, leaf, slim_node, slim_pod, slim_report
from tests.unit.builders import gpu, report_obj, xid_event

MIG_DEVICES: list[dict[str, Any]] = [
    {"index": 0, "uuid": "MIG-0000", "gpuInstanceId": 1, "computeInstanceId": 0, "profile": "3g.40gb"},
    {"index": 1, "uuid": "MIG-0001", "gpuInstanceId": 2, "computeInstanceId": 0, "profile": "3g.40gb"},
]
HOLD: dict[str, str] = {"namespace": "ml", "name": "train-0", "container": "main", "resource": "nvidia.com/gpu"}
MIG_RES = "nvidia.com/mig-3g.40gb"


def full_device(i: int) -> dict[str, Any]:
    return gpu(
        i,
        pciBusId=f"00000000:{i:02X}:00.0",
        lost=False,
        eccMode="Enabled",
        ecc={"volatileUncorrected": 0, "volatileCorrected": 4, "aggregateUncorrected": i % 2, "aggregateCorrected": 9},
        retiredPages={"singleBitEcc": 1, "doubleBitEcc": 0, "pending": i == 3},
        remappedRows={"corrected": 2, "uncorrected": 0, "pending": False, "failure": i == 5},
        temperature={"currentC": 50 + i, "slowdownC": 87, "shutdownC": 92},
        clockEventReasons=8 if i == 2 else 0,
        clockEventsSince="2026-11-30T12:00:00Z",
        powerW=301.5,
        recoveryAction="None" if i else "Reset",
        unsupported=["dcgm.fieldX"],
    )


REPORTS: list[dict[str, Any]] = [
    report_obj(devices=[full_device(i) for i in range(8)], xids=[xid_event(79, 1), xid_event(13, 2, 4)]),
    report_obj(nvml={"driverVersion": "570"}, devices=[]),  # non-empty nvml without "available": still available
    report_obj(nvml={"available": False, "error": "NVML_ERROR_DRIVER_NOT_LOADED"}, devices=[]),
    report_obj(nvml={}, devices=[]),
    report_obj(devices=[gpu(0, lost=True), gpu(1, lost="yes")]),
    report_obj(devices=[gpu(0, ecc={"volatileUncorrected": "many"})]),  # refused
    report_obj(devices=[gpu(0), gpu(0)]),  # refused: duplicate index
    report_obj(devices=["not an object"]),  # type: ignore[list-item]  # refused
    report_obj(devices=[gpu(0, temperature=[1, 2])]),  # refused as before (not an object)
    report_obj(xids=[{"xid": 79}]),  # refused: no time
    report_obj(xids=[xid_event(79, 1, 9)]),  # refused: an unknown GPU
    {**report_obj(), "spec": ["not", "an", "object"]},  # refused
    # MIG: the devices and the XID's instance IDs are kept (the DRA slice mapping reads them).
    report_obj(
        devices=[
            gpu(0, migMode="Enabled", migDevices=MIG_DEVICES),
            gpu(1, migMode="Enabled", migDevices=[{"index": 0, "uuid": "MIG-x", "extra": "dropped"}]),
        ],
        xids=[{**xid_event(31, 1, 0), "gpuInstanceId": 2, "computeInstanceId": 0}],
    ),
    report_obj(devices=[gpu(0, migDevices="none")]),  # refused: not a list
    report_obj(devices=[gpu(0, migDevices=[{"index": 16}])]),  # refused: index out of range
    report_obj(xids=[{**xid_event(31, 1, 0), "gpuInstanceId": -1}]),  # refused
    # The pods holding each GPU and MIG device (the kubelet's pod-resources API), and whether they were read.
    report_obj(
        devices=[
            gpu(0, pods=[HOLD, {**HOLD, "name": "train-1", "extra": "dropped"}]),
            gpu(1, migMode="Enabled", migDevices=[{**MIG_DEVICES[0], "pods": [{**HOLD, "resource": MIG_RES}]}]),
        ],
        podResources={"available": True, "extra": "dropped"},
    ),
    report_obj(podResources={"available": False, "error": "connection refused"}),
    report_obj(podResources={"error": "no available"}),  # refused
    report_obj(podResources="yes"),  # refused: not an object
    report_obj(devices=[gpu(0, pods="train-0")]),  # refused: not a list
    report_obj(devices=[gpu(0, pods=[{**HOLD, "container": ""}])]),  # refused
    report_obj(devices=[gpu(0, migDevices=[{"index": 0, "pods": ["train-0"]}])]),  # refused
]


def parsed(body: dict[str, Any]) -> object:
    try:
        return parse_report(body)
    except (ReportError, AttributeError, TypeError) as e:
        return (type(e), str(e))


@pytest.mark.parametrize("i", range(len(REPORTS)))
def test_a_slim_report_reads_as_the_full_one(i: int) -> None:
    body = copy.deepcopy(REPORTS[i])
    body["metadata"].update(uid="u1", generation=3, managedFields=[{"manager": "agent"}])
    body["status"] = {"state": "Healthy", "totalGPUs": 8, "devices": [{"index": 0, "state": "InService"}]}
    slim = slim_report(body)
    assert parsed(slim) == parsed(body)
    assert slim["status"] == body["status"]
    assert {k: slim["metadata"].get(k) for k in ("name", "uid", "generation", "resourceVersion")} == {
        k: body["metadata"].get(k) for k in ("name", "uid", "generation", "resourceVersion")
    }
    assert "managedFields" not in slim["metadata"]


def test_a_slim_report_keeps_mig_devices_and_xid_instances() -> None:
    slim = slim_report(REPORTS[12])
    assert slim["spec"]["devices"][0]["migDevices"] == MIG_DEVICES
    assert slim["spec"]["devices"][1]["migDevices"] == [{"index": 0, "uuid": "MIG-x"}]
    assert slim["spec"]["xidEvents"][0]["gpuInstanceId"] == 2
    assert slim["spec"]["xidEvents"][0]["computeInstanceId"] == 0
    r = parse_report(slim)
    assert r.mig_device(0, 2, 0) is not None and r.mig_device(0, 2, 0).uuid == "MIG-0001"  # type: ignore[union-attr]


def test_a_slim_report_keeps_the_pods_holding_each_gpu() -> None:
    body = next(r for r in REPORTS if "podResources" in r["spec"] and r["spec"]["devices"][0].get("pods"))
    spec = slim_report(body)["spec"]
    assert spec["podResources"] == {"available": True}
    assert spec["devices"][0]["pods"] == [HOLD, {**HOLD, "name": "train-1"}]
    assert spec["devices"][1]["migDevices"][0]["pods"] == [{**HOLD, "resource": MIG_RES}]
    r = parse_report(slim_report(body))
    assert [p.name for p in r.holders(0)] == ["train-0", "train-1"]
    assert [p.resource for p in r.holders(1)] == [MIG_RES]


def test_a_slim_report_drops_what_nothing_reads() -> None:
    slim = slim_report(REPORTS[0])
    d = slim["spec"]["devices"][0]
    assert not {"pciBusId", "powerW", "unsupported", "eccMode"} & set(d)
    assert set(d["ecc"]) == {"volatileUncorrected", "aggregateUncorrected"}
    # Equal sub-objects of different GPUs are one shared, read-only copy.
    assert slim["spec"]["devices"][0]["ecc"] is slim_report(REPORTS[0])["spec"]["devices"][0]["ecc"]


@pytest.mark.parametrize("i", range(len(REPORTS)))
def test_slimming_a_slim_report_again_changes_nothing(i: int) -> None:
    # The start-up list slims each page as it arrives, and the cache slims what it is handed.
    body = copy.deepcopy(REPORTS[i])
    body["status"] = {"state": "Healthy"}
    once = slim_report(body)
    assert slim_report(once) == once
    # The mark: what slim_report made is not cut again (the watch's thread cut it, the store keeps it),
    assert slim_report(once) is once
    # while a body built from it (a copy, an edit) is cut again, to the same.
    again = slim_report({**once})
    assert again is not once and again == once


def test_the_store_keeps_a_watched_body_as_the_watch_slimmed_it() -> None:
    from gpuhealth.controller.state.store import Store

    store = Store()
    report, node = slim_report(copy.deepcopy(REPORTS[0])), slim_node(kwok_node())
    store.put_report("n1", report)
    store.put_node("n1", node)
    assert store.reports["n1"] is report and store.nodes["n1"] is node


def kwok_node(**meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "n1",
            "uid": "u",
            "resourceVersion": "7",
            "labels": {"nvidia.com/gpu.present": "true", "pool": "a"},
            "annotations": {"kwok.x-k8s.io/node": "fake", "gpuhealth.dev/release": "now"},
            "managedFields": [{"manager": "kwok"}],
            **meta,
        },
        "spec": {"providerID": "kwok://n1", "taints": [{"key": "x", "effect": "NoSchedule"}], "unschedulable": True},
        "status": {
            "capacity": {"cpu": "96", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "96"},
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "GPUHealthy", "status": "False", "reason": "XID79", "message": "m"},
            ],
            "images": [{"names": ["big"], "sizeBytes": 1}],
        },
    }


@pytest.mark.parametrize("state", [State.HEALTHY, State.QUARANTINED])
def test_a_slim_node_plans_what_the_full_one_does(state: State) -> None:
    node = kwok_node()
    slim = slim_node(node)
    marks = Marks(
        state=state,
        quarantine=state == State.QUARANTINED,
        reason="XID79",
        effect="NoSchedule",
        cordon=True,
        since="2026-11-30T12:00:00Z",
    )
    assert plan_node(slim, marks) == plan_node(node, marks)
    for s in (State.HEALTHY, State.QUARANTINED):
        assert plan_condition(slim, s, "XID79", "m", "t") == plan_condition(node, s, "XID79", "m", "t")
    assert node_gpus(slim) == node_gpus(node) == 8
    assert slim["metadata"]["annotations"] == {"gpuhealth.dev/release": "now"}
    assert "images" not in slim["status"] and "managedFields" not in slim["metadata"]


def test_a_slim_node_keeps_what_the_device_plugin_allocates() -> None:
    from gpuhealth.api.nodes import plugin_gpus

    node = kwok_node()
    node["status"]["allocatable"] = {"cpu": "96", "nvidia.com/gpu": "7"}  # the plugin withholds one GPU
    slim = slim_node(node)
    assert plugin_gpus(slim) == plugin_gpus(node) == (8, 7)
    assert slim["status"]["allocatable"] == {"nvidia.com/gpu": "7"}


def test_a_slim_pod_keeps_the_controller_reference_and_shares_it() -> None:
    def pod(n: int) -> dict[str, Any]:
        return {
            "metadata": {
                "name": f"p{n}",
                "namespace": "t",
                "uid": f"u{n}",
                "labels": {"job-name": "j"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Service", "name": "s", "uid": "x"},
                    {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "y", "controller": True},
                ],
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "containerStatuses": [{"restartCount": 0, "ready": True}]},
        }

    a, b = slim_pod(pod(1)), slim_pod(pod(2))
    assert P.controller_ref(a) == {"kind": "Job", "name": "j", "controller": True}
    assert P.workload_key(a) == P.workload_key(pod(1)) and P.gang_key(a) == P.gang_key(pod(1))
    assert a["metadata"]["ownerReferences"][0] is b["metadata"]["ownerReferences"][0]
    assert a["spec"] is b["spec"] and a["spec"] == {"nodeName": "n1"}


def test_a_leaf_is_shared_read_only_and_forgotten_when_unused() -> None:
    one = leaf({"restartCount": 12345})
    assert leaf({"restartCount": 12345}) is one and isinstance(one, Leaf)
    with pytest.raises(TypeError):
        one["restartCount"] = 0
    with pytest.raises(TypeError):
        one.update(x=1)
    assert (("restartCount", 12345),) in slim._LEAVES
    del one
    gc.collect()
    assert (("restartCount", 12345),) not in slim._LEAVES  # no pod uses it any more: forgotten
    assert leaf({"nested": {"a": 1}}) == {"nested": {"a": 1}}  # unhashable: not shared, returned as is


def test_slimming_a_slim_node_again_changes_nothing() -> None:
    once = slim_node(kwok_node())
    assert slim_node(once) == once and slim_node(once) is once


def test_the_start_up_list_arrives_slim_and_caches_as_before() -> None:
    import asyncio

    from gpuhealth.controller.process.runtime import Runtime
    from tests.unit.fake_kube import FakeKube

    kube = FakeKube()
    kube.add_policy("p", {})
    kube.add_node("n1")
    kube.add_report(report_obj(name="n1", devices=[full_device(i) for i in range(8)]))
    seen: list[dict[str, Any]] = []
    plain = kube.list_custom

    def spying(plural: str, transform: Any = lambda o: o) -> list[dict[str, Any]]:
        got = plain(plural, transform)
        seen.extend(got)
        return got

    kube.list_custom = spying  # type: ignore[method-assign]

    async def body() -> Runtime:
        rt = Runtime(kube, workers=1)
        await rt._load()
        await rt._list_pods()
        return rt

    rt = asyncio.run(body())
    (report,) = [o for o in seen if o.get("kind") != "GPUHealthPolicy" and "spec" in o and "devices" in o["spec"]]
    assert "pciBusId" not in report["spec"]["devices"][0]  # slimmed in the list, not only in the cache
    assert rt.store.reports["n1"] == slim_report(kube.reports["n1"])
    assert rt.store.nodes["n1"] == slim_node(kube.nodes["n1"])


def test_a_cached_mig_device_reads_like_its_dict_is_read_only_and_smaller() -> None:
    slim = slim_report(REPORTS[12])
    entry = slim["spec"]["devices"][1]["migDevices"][0]
    assert isinstance(entry, MigEntry)
    assert dict(entry) == {"index": 0, "uuid": "MIG-x"} and len(entry) == 2
    assert "profile" not in entry and entry.get("profile") is None  # not sent: absent, not None
    with pytest.raises(KeyError):
        entry["extra"]  # dropped: the report contract does not read it
    with pytest.raises(TypeError):
        entry.uuid = "MIG-y"
    assert copy.deepcopy(entry) == entry and pickle.loads(pickle.dumps(entry)) == entry
    full = slim["spec"]["devices"][0]["migDevices"][0]
    assert sys.getsizeof(full) < sys.getsizeof(dict(full)) / 2  # the point of it: 56 on a MIG node


def test_gpus_with_the_same_fabric_facts_share_one_cached_copy() -> None:
    """A fleet's GPUs mostly report the same links, peers and fabric: one copy each, not one per GPU."""

    def device(index: int) -> dict[str, Any]:
        return {
            **gpu(index),
            "nvlink": {"links": 18, "active": 18, "speedMBps": 26562, "peers": [0, 1, 2], "replayErrors": 9},
            "fabric": {"state": "Completed", "status": 0, "cliqueId": 7, "healthMask": 426, "routeUnhealthy": False},
        }

    a = slim_report(report_obj(devices=[device(0)], name="n1"))
    b = slim_report(report_obj(devices=[device(0)], name="n2"))
    nvlink_a, nvlink_b = a["spec"]["devices"][0]["nvlink"], b["spec"]["devices"][0]["nvlink"]
    assert nvlink_a is nvlink_b and "replayErrors" not in nvlink_a
    assert a["spec"]["devices"][0]["fabric"] is b["spec"]["devices"][0]["fabric"]
    parsed = parse_report(a).devices[0]
    assert parsed.nvlink is not None and parsed.nvlink.peers == (0, 1, 2)
    assert parse_report(a) == parse_report(report_obj(devices=[device(0)], name="n1"))
