"""Per-GPU quarantine through the node pipeline, with the in-memory fake API: status first, then
the DeviceTaintRule; the node stays in service, or is taken out when the GPU cannot be held out
alone (a second bad GPU, no ResourceSlice, a foreign rule under our name); DryRun, the GPU budget,
a human's release, and a restart before the slices are listed."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from gpuhealth.actions.slices import slim_slice
from gpuhealth.api import pods as P
from gpuhealth.controller.act import device_reconciler as DR
from gpuhealth.controller.intake.slicewatch import SliceWatch
from tests.unit.builders import report_obj
from tests.unit.controller.act._device_support import RULE, Clock, ecc_on, runtime, setup, slice_of

TAINT = "gpuhealth.dev/unhealthy"


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
