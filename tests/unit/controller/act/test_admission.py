"""The Kueue admission room through the Kube port (in-memory fake): what it writes, once, and what it forgets."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from typing import Any

import pytest

from gpuhealth.api.names import ADMISSION_CHECK_CONTROLLER, State
from gpuhealth.api.status import Record
from gpuhealth.controller.act.admission import AdmissionRoom, start_admission
from gpuhealth.controller.intake.kueuewatch import slim_check, slim_workload
from gpuhealth.controller.process.main import parse_args
from gpuhealth.controller.state.store import Store
from gpuhealth.drain.plan import DrainPlan, Step
from tests.unit.fake_kube import FakeKube, inline

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
KEY = "ml/job-llm"


class Sink(list[tuple[str, ...]]):
    def __call__(
        self,
        kind: str,
        name: str,
        uid: str,
        type_: str,
        reason: str,
        message: str,
        api_version: str = "v1",
        namespace: str = "",
    ) -> None:
        self.append((kind, name, reason, namespace, message))


def workload(state: str = "Pending", conditions: tuple[str, ...] = ("QuotaReserved",), gpus: int = 8) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "job-llm",
            "namespace": "ml",
            "uid": "wl-1",
            "ownerReferences": [{"kind": "Job", "name": "llm", "uid": "job-1", "controller": True}],
        },
        "status": {
            "conditions": [{"type": c, "status": "True", "reason": c} for c in conditions],
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {
                        "name": "main",
                        "flavors": {"nvidia.com/gpu": "h100"},
                        "resourceUsage": {"nvidia.com/gpu": str(gpus)},
                        "count": 4,
                    }
                ],
            },
            "admissionChecks": [
                {"name": "gh", "state": state, "message": "", "lastTransitionTime": "2026-01-01T11:00:00Z"}
            ],
        },
    }


def setup(wl: dict[str, Any], out: bool = False) -> tuple[FakeKube, Store, AdmissionRoom, Sink]:
    kube = FakeKube()
    kube.kueue = True
    kube.admission_checks["gh"] = kube._stamp(
        {"metadata": {"name": "gh", "generation": 1}, "spec": {"controllerName": ADMISSION_CHECK_CONTROLLER}}
    )
    kube.flavors["h100"] = {"metadata": {"name": "h100"}, "spec": {"nodeLabels": {"pool": "a"}}}
    kube.workloads[("ml", "job-llm")] = kube._stamp(wl)
    store = Store()
    for name in ("n1", "n2"):
        store.put_node(name, kube.add_node(name, labels={"pool": "a"}))
    if out:
        store.set_record("n1", Record(state=State.DRAINING, reason="XidFatal", message="XID 79 on GPU 3"))
    events = Sink()
    active = asyncio.Event()
    active.set()
    room = AdmissionRoom(kube=inline(kube), store=store, events=events, active=active, clock=lambda: T0)
    room.on_check("ADDED", slim_check(kube.admission_checks["gh"]))
    room.on_workload("ADDED", slim_workload(kube.workloads[("ml", "job-llm")]))
    return kube, store, room, events


def state(kube: FakeKube) -> str:
    return str(kube.workloads[("ml", "job-llm")]["status"]["admissionChecks"][0]["state"])


def test_our_check_is_made_active_once() -> None:
    async def body() -> None:
        kube, _, room, _ = setup(workload())
        await room._activate("gh")
        assert kube.writes == [("apply", "admissioncheck/gh")]
        room.on_check("MODIFIED", slim_check(kube.admission_checks["gh"]))  # the watch brings our write back
        await room._activate("gh")
        assert kube.writes == [("apply", "admissioncheck/gh")]

    asyncio.run(body())


def test_admission_is_ready_once_when_nothing_is_held_out() -> None:
    async def body() -> None:
        kube, _, room, events = setup(workload())
        await room.admit(KEY)
        await room.admit(KEY)  # the write's answer is in the cache: nothing left to decide
        assert state(kube) == "Ready" and kube.writes == [("apply", "workload/ml/job-llm")]
        assert not events

    asyncio.run(body())


def test_admission_counting_on_a_held_out_node_is_retried_with_an_event_on_the_workload() -> None:
    async def body() -> None:
        kube, _, room, events = setup(workload(gpus=16), out=True)
        await room.admit(KEY)
        entry = kube.workloads[("ml", "job-llm")]["status"]["admissionChecks"][0]
        assert entry["state"] == "Retry" and entry["requeueAfterSeconds"] == 30 and "n1" in entry["message"]
        assert [(e[0], e[2], e[3]) for e in events] == [("Workload", "CapacityHeldOut", "ml")]

    asyncio.run(body())


def test_gpus_held_out_by_device_taint_rules_count_under_a_mapped_dra_quota_name() -> None:
    async def body() -> None:
        wl = workload(gpus=16)
        psa = wl["status"]["admission"]["podSetAssignments"][0]
        psa["flavors"], psa["resourceUsage"] = {"whole-gpus": "h100"}, {"whole-gpus": "16"}
        kube = FakeKube()
        kube.flavors["h100"] = {"metadata": {"name": "h100"}, "spec": {"nodeLabels": {"pool": "a"}}}
        kube.workloads[("ml", "job-llm")] = kube._stamp(wl)
        check = kube._stamp(
            {"metadata": {"name": "gh", "generation": 1}, "spec": {"controllerName": ADMISSION_CHECK_CONTROLLER}}
        )
        store = Store()
        for name in ("d1", "d2"):  # DRA nodes: no nvidia.com/gpu capacity; the reports count the GPUs
            node = kube.add_node(name, labels={"pool": "a"})
            node["status"]["capacity"] = {}
            store.put_node(name, node)
            devices = [{"index": i, "state": "InService"} for i in range(8)]
            if name == "d1":  # GPU 3 under a DeviceTaintRule, GPU 5 on probation (its rule still there)
                devices[3] = {"index": 3, "state": "Quarantined", "taintRule": "gpuhealth-d1-gpu-3"}
                devices[5] = {"index": 5, "state": "Recovering", "taintRule": "gpuhealth-d1-gpu-5"}
            store.put_report(name, {"metadata": {"name": name}, "status": {"totalGPUs": 8, "devices": devices}})
        active = asyncio.Event()
        active.set()
        room = AdmissionRoom(
            kube=inline(kube),
            store=store,
            events=Sink(),
            active=active,
            clock=lambda: T0,
            gpu_resources=("nvidia.com/gpu", "whole-gpus"),
        )
        room.on_check("ADDED", slim_check(check))
        room.on_workload("ADDED", slim_workload(kube.workloads[("ml", "job-llm")], room.gpu_resources))
        assert room.cache.workloads[KEY]["status"]["admission"]["podSetAssignments"][0]["resourceUsage"] == {
            "whole-gpus": "16"
        }
        await room.admit(KEY)
        entry = kube.workloads[("ml", "job-llm")]["status"]["admissionChecks"][0]
        assert entry["state"] == "Retry", entry
        assert (
            "16 whole-gpus assigned" in entry["message"]
            and "d1 (2 GPUs: 2 GPUs held out one by one)" in entry["message"]
        ), entry["message"]

    asyncio.run(body())


def pods_of_llm() -> list[dict[str, Any]]:
    return [
        {
            "metadata": {
                "name": f"llm-{i}",
                "namespace": "ml",
                "uid": f"p{i}",
                "ownerReferences": [{"kind": "Job", "name": "llm", "controller": True}],
            },
            "spec": {"nodeName": "n1"},
        }
        for i in range(2)
    ]


def plan_evicting(pods: list[dict[str, Any]], extra: list[Step] | None = None) -> DrainPlan:
    plan = DrainPlan(steps=[Step("evict", p, "checkpoint acknowledged") for p in pods] + (extra or []))
    plan.record["pods"] = {p["metadata"]["uid"]: {"pod": f"ml/{p['metadata']['name']}", "node": "n1"} for p in pods}
    return plan


def test_a_running_workload_is_moved_by_one_retry_instead_of_evictions() -> None:
    async def body() -> None:
        kube, _, room, events = setup(workload("Ready", ("QuotaReserved", "Admitted")), out=True)
        other = {"metadata": {"name": "web", "namespace": "ml", "uid": "w"}, "spec": {"nodeName": "n1"}}
        plan = plan_evicting(pods_of_llm(), [Step("evict", other, "draining")])
        left = await room.take("n1", plan, "XidFatal: XID 79 on GPU 3", T0)
        assert [s.key for s in left] == ["ml/web"], "a pod without a Kueue Workload keeps the pod path"
        entry = kube.workloads[("ml", "job-llm")]["status"]["admissionChecks"][0]
        assert entry["state"] == "Retry" and "n1" in entry["message"] and "GPU 3" in entry["message"]
        move = plan.record["workloads"][KEY]
        assert move["uid"] == "wl-1" and move["state"] == "Retry" and move["retriedAt"]
        assert all(p["workload"] == KEY for p in plan.record["pods"].values())
        assert sorted(e[2] for e in events) == ["MovedByGpuhealth", "WorkloadMoved"]
        # The next pass of the drain (pods not gone yet): no second Retry, no second announcement.
        again = plan_evicting(pods_of_llm())
        assert await room.take("n1", again, "XidFatal", T0) == []
        assert kube.writes.count(("apply", "workload/ml/job-llm")) == 1 and len(events) == 2

    asyncio.run(body())


def test_a_workload_deleted_meanwhile_is_forgotten_and_its_pods_take_the_pod_path() -> None:
    async def body() -> None:
        kube, _, room, events = setup(workload("Ready", ("QuotaReserved", "Admitted")), out=True)
        del kube.workloads[("ml", "job-llm")]
        assert await room.take("n1", plan_evicting(pods_of_llm()), "XidFatal", T0) == []
        assert KEY not in room.cache.workloads and not events
        left = await room.take("n1", plan_evicting(pods_of_llm()), "XidFatal", T0)
        assert [s.key for s in left] == ["ml/llm-0", "ml/llm-1"]

    asyncio.run(body())


def test_auto_starts_the_room_only_when_kueue_is_served() -> None:
    async def body() -> None:
        kube = FakeKube()
        active = asyncio.Event()
        port, store, sink = inline(kube), Store(), Sink()

        async def start(mode: str) -> AdmissionRoom | None:
            return await start_admission(mode, kube=port, store=store, events=sink, active=active, clock=lambda: T0)

        assert await start("auto") is None
        assert await start("off") is None
        kube.kueue = True
        room = await start("auto")
        assert room is not None
        await room.stop()

    asyncio.run(body())


def test_a_replaced_list_forgets_workloads_deleted_meanwhile() -> None:
    _, _, room, _ = setup(workload())
    room.replace_workloads([])
    assert not room.cache.workloads and not room.cache.by_owner
    room.replace_workloads([slim_workload(copy.deepcopy(workload()))])
    assert KEY in room.cache.workloads and room.cache.by_owner["ml/Job=llm"] == KEY


def test_a_workload_kueue_does_not_move_in_time_has_its_pods_evicted_after_all() -> None:
    async def body() -> None:
        kube, _, room, events = setup(workload("Ready", ("QuotaReserved", "Admitted")), out=True)
        plan = plan_evicting(pods_of_llm())
        assert await room.take("n1", plan, "XidFatal", T0) == []
        later = T0 + dt.timedelta(seconds=301)
        for _ in range(2):  # Kueue never acted (its check still says Retry, the pods still run)
            again = plan_evicting(pods_of_llm())
            again.record["workloads"] = plan.record["workloads"]
            left = await room.take("n1", again, "XidFatal", later)
            assert [s.key for s in left] == ["ml/llm-0", "ml/llm-1"]
        assert [e[2] for e in events].count("WorkloadNotMoved") == 1
        assert kube.writes.count(("apply", "workload/ml/job-llm")) == 1, "still only one Retry"

    asyncio.run(body())


def test_the_operator_flag_names_the_gpu_quota_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUHEALTH_GPU_RESOURCES", raising=False)
    assert parse_args([]).gpu_resources == ("nvidia.com/gpu",)
    assert parse_args(["--gpu-resources", "nvidia.com/gpu, whole-gpus,whole-gpus"]).gpu_resources == (
        "nvidia.com/gpu",
        "whole-gpus",
    )
    monkeypatch.setenv("GPUHEALTH_GPU_RESOURCES", "whole-gpus")
    assert parse_args([]).gpu_resources == ("whole-gpus",)
    with pytest.raises(SystemExit):
        parse_args(["--gpu-resources", " , "])
