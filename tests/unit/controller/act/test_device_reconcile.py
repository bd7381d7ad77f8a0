"""Per-GPU quarantine through the node pipeline, with the in-memory fake API: status first, then
the DeviceTaintRule; the node stays in service; only the pods holding the GPU are drained."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from gpuhealth.actions.slices import slim_slice
from gpuhealth.controller.act import device_reconciler as DR
from gpuhealth.controller.act import device_rules
from gpuhealth.controller.intake.slicewatch import SliceWatch
from gpuhealth.controller.process.runtime import Runtime
from gpuhealth.drain import pods as P
from tests.unit.builders import at, gpu, report_obj
from tests.unit.fake_kube import FakeKube

TAINT = "gpuhealth.dev/unhealthy"
RULE = "gpuhealth-n1-gpu-3"


def slice_of(node: str, gpus: int = 8) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"index": {"int": i}, "uuid": {"string": f"GPU-{i:04d}"}}}
                for i in range(gpus)
            ],
        },
    }


def ecc_on(*bad: int, seconds: float = 0.0) -> dict[str, Any]:
    devices = [gpu(i, ecc={"volatileUncorrected": 1}) if i in bad else gpu(i) for i in range(8)]
    return report_obj(name="n1", devices=devices, heartbeat=seconds)


def claim(name: str, device: str, pod: str, namespace: str = "ml") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "status": {
            "allocation": {"devices": {"results": [{"driver": "gpu.nvidia.com", "pool": "n1", "device": device}]}},
            "reservedFor": [{"resource": "pods", "name": pod, "uid": f"uid-{namespace}-{pod}"}],
        },
    }


class Clock:
    def __init__(self) -> None:
        self.t = at(10)

    def __call__(self) -> dt.datetime:
        return self.t


async def runtime(kube: FakeKube, clock: Clock, slices: bool | None = True) -> Runtime:
    """``slices``: True, n1's slice is listed; False, the list is in and has none; None, not in yet."""
    rt = Runtime(kube, clock=clock, workers=1)
    if slices is not None:
        rt.slice_watch.cache.replace([slim_slice(slice_of("n1"))] if slices else [])
    await rt._load()
    await rt._list_pods()
    return rt


def setup(policy: dict[str, Any] | None = None) -> FakeKube:
    kube = FakeKube()
    kube.add_policy("p", policy or {"safety": {"maxUnhealthyGPUs": 4}})
    kube.add_node("n1")
    kube.add_report(ecc_on(3))
    kube.add_pod("ml", "on-gpu-3", "n1", {P.CHECKPOINT_MODE: "annotation"})
    kube.add_pod("ml", "on-gpu-5", "n1", {P.CHECKPOINT_MODE: "annotation"})
    kube.claims = [claim("c3", "gpu-3", "on-gpu-3"), claim("c5", "gpu-5", "on-gpu-5")]
    return kube


def test_one_bad_gpu_gets_a_rule_after_its_record_and_the_node_stays_in_service() -> None:
    kube = setup()
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")
        # Protection first: the rule is written on this pass, the GPU's drain starts on the next.
        assert RULE in kube.rules and not [w for w in kube.writes if w[1].startswith("pod/")]
        await rt.reconciler.reconcile("n1")
        await rt.events.flush()

    asyncio.run(body())
    writes = [w for w in kube.writes if w[1].startswith(("report/n1/status", "devicetaintrule/"))]
    assert writes[0] == ("patch", "report/n1/status") and ("create", f"devicetaintrule/{RULE}") in writes
    assert writes.index(("create", f"devicetaintrule/{RULE}")) > 0  # the record first, then the rule
    rule = kube.rules[RULE]
    assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-3"}
    assert rule["spec"]["taint"] == {"key": TAINT, "value": "EccUncorrected", "effect": "NoSchedule"}
    status = kube.reports["n1"]["status"]
    dev3 = next(d for d in status["devices"] if d["index"] == 3)
    assert dev3["state"] == "Draining" and dev3["taintRule"] == RULE and dev3["device"] == "gpu.nvidia.com/n1/gpu-3"
    assert status["state"] == "Degraded" and status["reason"] == "DeviceQuarantined"
    assert status["inServiceGPUs"] == 7
    node = kube.nodes["n1"]
    assert not node["spec"].get("unschedulable")
    assert TAINT not in {t["key"] for t in node["spec"].get("taints") or []}
    # Only the pod on GPU 3 is asked to checkpoint; the pod on GPU 5 is untouched.
    touched = {w[1] for w in kube.writes if w[1].startswith("pod/")}
    assert touched == {"pod/ml/on-gpu-3"}
    assert kube.pods["ml", "on-gpu-3"]["metadata"]["annotations"].get(P.CHECKPOINT_REQUESTED)
    assert "3" in status["deviceDrains"]
    msgs = [e["message"] for e in kube.events if e["reason"] == "DeviceQuarantined"]
    assert msgs and "GPU 3 (GPU-0003)" in msgs[0] and RULE in msgs[0]


def test_a_foreign_rule_holding_our_rule_name_sends_the_gpu_to_node_scope_once() -> None:
    """Regression (chaos device_kills): a foreign rule under gpuhealth's name for GPU 3 made every create
    answer 409; the GPU was recorded as held out, nothing held it out, and each reconcile re-tried."""
    kube = setup()
    foreign = {
        "metadata": {"name": RULE, "uid": "foreign-uid", "labels": {"team": "sre"}},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-3"},
            "taint": {"key": "example.com/suspect", "value": "x", "effect": "None"},
        },
    }
    kube.rules[RULE] = foreign
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        for _ in range(4):
            await rt.reconciler.reconcile("n1")
            clock.t += dt.timedelta(seconds=2)
        await rt.events.flush()

    asyncio.run(body())
    assert kube.rules == {RULE: foreign}  # the foreign rule untouched, no rule of ours under another name
    assert kube.writes.count(("create", f"devicetaintrule/{RULE}")) == 1  # learnt once, not re-tried
    assert not any(w[0] == "delete" and w[1].startswith("devicetaintrule/") for w in kube.writes)
    node = kube.nodes["n1"]
    assert TAINT in {t["key"] for t in node["spec"].get("taints") or []}  # the node holds the GPU out
    msgs = [e["message"] for e in kube.events if e["reason"] == "NodeScopeFallback"]
    assert msgs and f"holds the name {RULE}" in msgs[-1]
    dev3 = next(d for d in kube.reports["n1"]["status"]["devices"] if d["index"] == 3)
    assert dev3.get("taintRule", "") == ""


def test_a_drain_does_not_judge_on_a_claim_list_from_before_the_allocation() -> None:
    """Regression (chaos device_kills): a claim list cached (CLAIMS_TTL_S) from just before the pod's
    claim was allocated found nobody on the bad GPU, and the device drain completed at once, leaving the
    pod running on it."""
    kube = setup()
    allocated = kube.claims
    kube.claims = []  # listed a moment before the scheduler allocated them
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.device_drainer.claims()
        kube.claims = allocated
        await rt.reconciler.reconcile("n1")  # the rule
        await rt.reconciler.reconcile("n1")  # the drain, within CLAIMS_TTL_S of the cached list

    asyncio.run(body())
    assert kube.pods["ml", "on-gpu-3"]["metadata"]["annotations"].get(P.CHECKPOINT_REQUESTED)
    assert kube.reports["n1"]["status"]["deviceDrains"]["3"].get("phase") != "Completed"


def test_a_restart_between_the_record_and_the_rule_makes_one_rule_and_evicts_once() -> None:
    kube = setup()
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")
        # A kill after the status write: the rule is lost, the record stays.
        kube.rules.clear()
        rt2 = await runtime(kube, clock)
        await rt2.reconciler.reconcile("n1")
        await rt2.reconciler.reconcile("n1")

    asyncio.run(body())
    assert list(kube.rules) == [RULE]
    assert kube.writes.count(("patch", "pod/ml/on-gpu-3")) == 1  # asked to checkpoint once, not again


def test_a_second_bad_gpu_takes_the_node_out() -> None:
    kube = setup()
    kube.reports["n1"] = ecc_on(3, 5)
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")
        await rt.events.flush()

    asyncio.run(body())
    status = kube.reports["n1"]["status"]
    assert status["state"] in ("Draining", "Quarantined") and status["inServiceGPUs"] == 0
    assert TAINT in {t["key"] for t in kube.nodes["n1"]["spec"].get("taints") or []}
    assert "DeviceEscalated" in kube.reasons("n1")


def test_a_gpu_no_slice_publishes_falls_back_to_the_node_and_says_so() -> None:
    kube = setup()
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock, slices=False)
        await rt.reconciler.reconcile("n1")
        await rt.events.flush()

    asyncio.run(body())
    assert not kube.rules
    assert TAINT in {t["key"] for t in kube.nodes["n1"]["spec"].get("taints") or []}
    fallback = [e["message"] for e in kube.events if e["reason"] == "NodeScopeFallback"]
    assert fallback and "no DRA ResourceSlice" in fallback[0] and "device plugin only" in fallback[0]
    assert "no DRA ResourceSlice" in kube.reports["n1"]["status"]["message"]


def test_dry_run_writes_effect_none_and_moves_no_pod() -> None:
    kube = setup({"mode": "DryRun", "safety": {"maxUnhealthyGPUs": 4}})
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")

    asyncio.run(body())
    assert kube.rules[RULE]["spec"]["taint"]["effect"] == "None"
    assert kube.reports["n1"]["status"]["inServiceGPUs"] == 8  # DryRun holds nothing out
    assert not [w for w in kube.writes if w[1].startswith("pod/")]


def test_the_gpu_budget_holds_a_device_quarantine_back() -> None:
    kube = setup({"safety": {"maxUnhealthyGPUs": 0}})
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")
        await rt.events.flush()

    asyncio.run(body())
    assert not kube.rules
    assert "QuarantineHeldBack" in kube.reasons("n1")
    dev3 = next(d for d in kube.reports["n1"]["status"]["devices"] if d["index"] == 3)
    assert dev3["state"] == "InService" and dev3.get("heldByBreaker")


def test_orphaned_rules_of_gpuhealth_go_and_foreign_rules_stay() -> None:
    kube = setup()
    clock = Clock()
    kube.rules["gpuhealth-gone-gpu-1"] = {
        "metadata": {
            "name": "gpuhealth-gone-gpu-1",
            "uid": "u1",
            "labels": {"app.kubernetes.io/managed-by": "gpuhealth", "gpuhealth.dev/node": "gone"},
        },
        "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "gone", "device": "gpu-1"}},
    }
    kube.rules["sre-hold"] = {
        "metadata": {"name": "sre-hold", "uid": "u2"},
        "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-3"}},
    }

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")
        await rt.devices.sweep()

    asyncio.run(body())
    assert set(kube.rules) == {"sre-hold", RULE}


def test_release_gpu_moves_that_gpu_to_probation_and_is_acknowledged() -> None:
    kube = setup()
    kube.reports["n1"] = report_obj(name="n1")  # the GPU was repaired: clean facts
    kube.reports["n1"]["status"] = {
        "state": "Healthy",
        "devices": [
            {
                "index": 3,
                "uuid": "GPU-0003",
                "state": "AwaitingRepair",
                "reason": "Flapping",
                "device": "gpu.nvidia.com/n1/gpu-3",
                "taintRule": RULE,
            }
        ],
    }
    kube.nodes["n1"]["metadata"]["annotations"] = {"gpuhealth.dev/release-gpu": "3"}
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")

    asyncio.run(body())
    dev3 = next(d for d in kube.reports["n1"]["status"]["devices"] if d["index"] == 3)
    assert dev3["state"] == "Recovering" and RULE in kube.rules  # the rule stays for the probation
    assert "gpuhealth.dev/release-gpu" not in (kube.nodes["n1"]["metadata"].get("annotations") or {})


def test_the_pod_cache_keeps_the_claim_fields_a_device_drain_reads() -> None:
    from gpuhealth.controller.intake.slim import slim_pod
    from gpuhealth.drain.claims import pod_claim_names

    pod = {
        "metadata": {"name": "p", "namespace": "ml", "uid": "u", "managedFields": [{}]},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "main"}],
            "resourceClaims": [{"name": "shared", "resourceClaimName": "team-gpus"}],
        },
        "status": {
            "phase": "Running",
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x1"}],
            "extendedResourceClaimStatus": {"resourceClaimName": "p-extended-resources-y2"},
        },
    }
    slim = slim_pod(pod)
    assert "containers" not in slim["spec"] and "managedFields" not in slim["metadata"]
    assert pod_claim_names(slim) == {"team-gpus", "p-gpu-x1", "p-extended-resources-y2"}


def test_an_idle_sweep_costs_no_request_and_relists_only_now_and_then(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = setup()
    clock = Clock()
    lists = 0
    real = kube.list_device_taint_rules

    def counted() -> list[dict[str, Any]]:
        nonlocal lists
        lists += 1
        return real()

    monkeypatch.setattr(kube, "list_device_taint_rules", counted)

    async def body() -> None:
        rt = await runtime(kube, clock)
        at_start = lists
        for _ in range(10):
            await rt.devices.sweep()
        assert lists == at_start  # from memory
        monkeypatch.setattr(device_rules, "RELIST_S", 0.0)
        await rt.devices.sweep()
        assert lists == at_start + 1

    asyncio.run(body())


def test_a_rule_both_the_node_and_the_sweep_find_unwanted_is_deleted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = setup()
    clock = Clock()
    stale = "gpuhealth-n1-gpu-5"
    kube.rules[stale] = {
        "metadata": {
            "name": stale,
            "uid": "u5",
            "labels": {"app.kubernetes.io/managed-by": "gpuhealth", "gpuhealth.dev/node": "n1"},
        },
        "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-5"}},
    }
    real = kube.delete_device_taint_rule

    def slow_delete(name: str, uid: str | None = None) -> None:
        time.sleep(0.3)  # the delete is still on its way when the node's convergence finds the rule
        real(name, uid)

    monkeypatch.setattr(kube, "delete_device_taint_rule", slow_delete)

    async def body() -> None:
        rt = Runtime(kube, clock=clock, workers=4)  # API calls in parallel, as in the operator
        rt.slice_watch.cache.replace([slim_slice(slice_of("n1"))])
        await rt._load()
        await rt._list_pods()
        await asyncio.gather(rt.devices.sweep(), rt.reconciler.reconcile("n1"))
        await rt.devices.sweep()
        await rt.events.flush()

    asyncio.run(body())
    assert [w for w in kube.writes if w == ("delete", f"devicetaintrule/{stale}")] == [
        ("delete", f"devicetaintrule/{stale}")
    ]
    assert set(kube.rules) == {RULE}


def test_a_gpu_nobody_holds_is_drained_with_one_list_and_one_write() -> None:
    kube = setup()
    kube.claims = [claim("c5", "gpu-5", "on-gpu-5")]  # nothing holds gpu-3
    clock = Clock()
    lists = 0
    real = kube.list_resource_claims

    def counted() -> list[dict[str, Any]]:
        nonlocal lists
        lists += 1
        return real()

    kube.list_resource_claims = counted  # type: ignore[method-assign]

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")  # the record and the rule
        before = kube.writes.count(("patch", "report/n1/status"))
        await rt.reconciler.reconcile("n1")  # the drain: nothing to move
        assert kube.writes.count(("patch", "report/n1/status")) == before + 1
        assert lists == 1

    asyncio.run(body())
    assert kube.reports["n1"]["status"]["deviceDrains"]["3"]["phase"] == "Completed"
    assert not [w for w in kube.writes if w[1].startswith("pod/")]


def test_the_rules_a_node_wanted_are_forgotten_with_the_node() -> None:
    """The soak found one entry per deleted node left in this map: it must not grow with churn."""
    kube = setup()
    kube.add_node("n2")
    kube.add_report(report_obj(name="n2"))  # a clean node: nothing wanted, nothing kept
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")
        await rt.reconciler.reconcile("n2")
        assert rt.devices.wanted == {"n1": {RULE}}
        rt.store.forget_node("n1")  # the Node was deleted
        await rt.devices.sweep()
        assert rt.devices.wanted == {}
        await rt.events.flush()

    asyncio.run(body())
    assert RULE not in kube.rules  # and its rule went too


def test_a_restarted_operator_places_no_gpu_before_its_first_slice_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the slices are listed a bad GPU has no device yet: it waits (never a node-scope taint
    on a guess), is placed on its device once the list is in, and falls back to the node only if the
    list never comes within the grace."""
    kube = setup()
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock, slices=None)
        await rt.reconciler.reconcile("n1")
        assert not kube.rules and TAINT not in {t["key"] for t in kube.nodes["n1"]["spec"].get("taints") or []}
        assert not [w for w in kube.writes if w[1] == "report/n1/status"], "nothing decided yet"
        rt.slice_watch.cache.replace([slim_slice(slice_of("n1"))])
        await rt.reconciler.reconcile("n1")
        assert set(kube.rules) == {"gpuhealth-n1-gpu-3"}

    asyncio.run(body())
    assert TAINT not in {t["key"] for t in kube.nodes["n1"]["spec"].get("taints") or []}

    late = setup()
    monkeypatch.setattr(DR, "SLICES_GRACE_S", 0.0)

    async def never() -> None:
        rt = await runtime(late, clock, slices=None)
        await rt.reconciler.reconcile("n1")

    asyncio.run(never())
    assert not late.rules and TAINT in {t["key"] for t in late.nodes["n1"]["spec"].get("taints") or []}


def test_a_cluster_without_resource_slices_counts_as_listed() -> None:
    class NoDra:
        def list_resource_slices_rv(self, transform: Any) -> Any:
            raise ApiException(status=404, reason="Not Found")

    watch = SliceWatch(NoDra())  # type: ignore[arg-type]
    with pytest.raises(ApiException):
        watch.list()
    assert watch.cache.synced.is_set() and watch.cache.slices() == []
