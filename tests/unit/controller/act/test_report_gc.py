"""The report of a deleted Node is deleted; a report of a Node that only lost its GPU label, or of a
new Node of the same name, is kept (through the Kube port with the in-memory fake API)."""

from __future__ import annotations

import asyncio

from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import at, report_obj
from tests.unit.fake_kube import FakeKube


def _runtime(kube: FakeKube) -> Runtime:
    return Runtime(kube, clock=lambda: at(10), workers=1)


def test_a_deleted_nodes_report_goes() -> None:
    kube = FakeKube()
    kube.add_policy("p", {})
    node = kube.add_node("n1")
    kube.add_report(report_obj(name="n1"))

    async def body() -> None:
        rt = _runtime(kube)
        await rt._load()
        await rt._list_pods()
        del kube.nodes["n1"]
        rt.on_node("DELETED", node, enqueue=False)
        assert await rt.reports_gc.collect("n1")

    asyncio.run(body())
    assert "n1" not in kube.reports
    assert ("delete", "report/n1") in kube.writes


def test_a_node_that_lost_its_gpu_label_keeps_its_report() -> None:
    kube = FakeKube()
    kube.add_policy("p", {})
    node = kube.add_node("n1")
    kube.add_report(report_obj(name="n1"))

    async def body() -> None:
        rt = _runtime(kube)
        await rt._load()
        await rt._list_pods()
        rt.on_node("DELETED", node, enqueue=False)  # what a label-selected watch says on a label change
        assert not await rt.reports_gc.collect("n1")

    asyncio.run(body())
    assert "n1" in kube.reports
    assert not [w for w in kube.writes if w[0] == "delete"]


def test_a_report_without_a_node_at_start_up_goes_and_others_are_not_even_read() -> None:
    kube = FakeKube()
    kube.add_policy("p", {})
    kube.add_node("n1")
    kube.add_report(report_obj(name="n1"))
    kube.add_report(report_obj(name="ghost"))  # its Node was deleted while no operator ran

    async def body() -> None:
        rt = _runtime(kube)
        await rt._load()
        await rt._list_pods()
        assert not await rt.reports_gc.collect("n1")  # not a suspect: no request at all
        assert await rt.reports_gc.collect("ghost")

    asyncio.run(body())
    assert set(kube.reports) == {"n1"}


def test_a_new_report_under_the_same_name_is_not_deleted() -> None:
    kube = FakeKube()
    kube.add_policy("p", {})
    kube.add_report({**report_obj(name="gone"), "metadata": {"name": "gone", "uid": "old"}})

    async def body() -> None:
        rt = _runtime(kube)
        await rt._load()
        await rt._list_pods()
        kube.reports["gone"]["metadata"]["uid"] = "new"  # recreated meanwhile by a new Node's agent
        assert not await rt.reports_gc.collect("gone")

    asyncio.run(body())
    assert "gone" in kube.reports
