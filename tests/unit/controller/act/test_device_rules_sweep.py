"""The DeviceTaintRule sweep: gpuhealth's orphaned rules go and foreign ones stay, an idle sweep costs
no request, a rule both the node and the sweep find unwanted is deleted once, the rules a node
wanted are forgotten with the node, and the device gauges it sets come from the policies' tallies."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gpuhealth.actions.slices import slim_slice
from gpuhealth.controller import metrics
from gpuhealth.controller.act import device_rules
from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import report_obj
from tests.unit.controller.act._device_support import RULE, Clock, runtime, setup, slice_of


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


def test_the_device_gauges_come_from_the_policies_tallies_not_a_walk_of_the_reports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = setup()
    clock = Clock()

    def devices(state: str) -> float | None:
        return metrics.REGISTRY.get_sample_value("gpuhealth_devices", {"policy": "p", "state": state})

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")  # GPU 3 held out, its pods to move

        def walked(name: str) -> None:
            raise AssertionError("the policy status pass read a report's status: it walks the fleet again")

        monkeypatch.setattr(rt.store, "status", walked)
        await rt.policy_status.update()
        assert (devices("Draining"), devices("InService"), devices("Quarantined")) == (1, 7, None)
        assert metrics.REGISTRY.get_sample_value("gpuhealth_peer_holds", {"policy": "p"}) == 0

    asyncio.run(body())
