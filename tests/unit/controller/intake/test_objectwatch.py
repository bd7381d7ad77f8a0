"""The fleet's own watches (GPU Nodes and reports): the list they start from is the runtime's
start-up list, events arrive slimmed and in order, a 410 relists and forgets what was deleted.

The source here is a scripted stand-in; the real list and watch run in the integration tests
(every test with a node or a report goes through them).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from gpuhealth.controller import metrics
from gpuhealth.controller.intake.objectwatch import ObjectWatch
from gpuhealth.controller.process.runtime import Runtime
from gpuhealth.controller.state.slim import slim_node
from tests.unit.builders import report_obj
from tests.unit.controller.intake.test_podwatch import Script, run_until_done
from tests.unit.fake_kube import FakeKube


def node(name: str, rv: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": rv, "labels": {"a": "b"}, "managedFields": ["big"]},
        "status": {"images": [{"names": ["big"]}]},
    }


def relists(kind: str) -> float:
    return metrics.REGISTRY.get_sample_value("gpuhealth_watch_relists_total", {"watch": kind}) or 0.0


def test_the_watch_starts_where_the_start_up_list_ended_and_relists_after_gone() -> None:
    script = Script(
        lists=[([node("n1", "10"), node("n2", "10")], "10"), ([node("n2", "31")], "30")],
        watches=[
            [{"type": "MODIFIED", "object": node("n1", "11")}],  # ends: the server's timeout
            ConnectionResetError("dropped"),  # resumed from 11 after a short delay
            [{"type": "ERROR", "object": {"code": 410, "message": "too old"}}],
            [{"type": "DELETED", "object": node("n2", "32")}],
        ],
    )
    events: list[tuple[str, dict[str, Any]]] = []
    replaced: list[list[str]] = []
    before = relists("nodes")

    async def main() -> list[dict[str, Any]]:
        w = ObjectWatch(
            "nodes",
            script.list_pods_rv,  # any paged list and watch: the scripted source of test_podwatch
            script.watch_pods,
            slim_node,
            lambda kind, o: events.append((kind, o)),
            lambda items: replaced.append([o["metadata"]["name"] for o in items]),
        )
        first = w.list()  # the runtime's start-up list
        await run_until_done(w, script)
        return first

    first = asyncio.run(main())
    assert [o["metadata"]["name"] for o in first] == ["n1", "n2"]
    assert "managedFields" not in first[0]["metadata"] and "images" not in first[0]["status"]
    assert script.calls[:6] == [
        ("list", ""),
        ("watch", "10"),  # no second list at start
        ("watch", "11"),
        ("watch", "11"),
        ("list", ""),
        ("watch", "30"),
    ]
    assert [(k, o["metadata"]["name"]) for k, o in events] == [("MODIFIED", "n1"), ("DELETED", "n2")]
    assert events[0][1] == slim_node(node("n1", "11"))
    assert replaced == [["n2"]]
    assert relists("nodes") == before + 2  # the start-up list and the one after 410 Gone


def test_a_relist_forgets_the_nodes_and_reports_deleted_meanwhile() -> None:
    kube = FakeKube()
    kube.add_policy("p", {})
    for n in ("n1", "n2"):
        kube.add_node(n)
        kube.add_report(report_obj(name=n))

    async def body() -> Runtime:
        rt = Runtime(kube, workers=1)
        await rt._load()
        await rt._list_pods()
        keep_node = copy.deepcopy(kube.nodes["n1"])
        keep_report = copy.deepcopy(kube.reports["n1"])
        rt.replace_nodes([slim_node(keep_node)])
        rt.replace_reports([keep_report])
        return rt

    rt = asyncio.run(body())
    assert set(rt.store.nodes) == {"n1"}
    assert set(rt.store.reports) == {"n1"}
    assert "n2" in rt.queue._dirty  # the worker collects the gone node's report, if any is left


def test_a_pod_relist_forgets_the_pods_deleted_meanwhile_in_steps() -> None:
    from gpuhealth.controller.intake.feeders import REPLACE_BATCH
    from gpuhealth.controller.state.slim import slim_pod

    kube = FakeKube()
    kube.add_policy("p", {})
    kube.add_node("n1")
    kube.add_report(report_obj(name="n1"))
    for i in range(REPLACE_BATCH + 1):
        kube.add_pod("ml", f"r{i}", "n1")

    async def body() -> tuple[Runtime, int]:
        rt = Runtime(kube, workers=1)
        await rt._load()
        await rt._list_pods()
        kept = [slim_pod(p) for (_, name), p in kube.pods.items() if name != "r0"]
        steps = rt.replace_pods(kept)
        assert steps is not None and len(rt.store.pods.nodes()) == REPLACE_BATCH + 1  # nothing done yet
        return rt, sum(1 for _ in steps)

    rt, steps = asyncio.run(body())
    assert steps == 2  # a turn of the loop after each REPLACE_BATCH pods of the cache and of the list
    assert len(rt.store.pods.nodes()) == REPLACE_BATCH
