"""A write's answer resumes the pass that wrote only after the loop has run what was queued before it,
and the watch's next event (an agent's new XID, an SRE's release) can be among that. The answer must
never be cached over the newer copy: it hid an XID 79 from every later pass until the agent wrote
again (CI of 3ab07bd, ``test_xid79_taints_cordons_and_explains``). The pods' version of this is
``test_pod_writeback.py``."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from gpuhealth.api.names import RELEASE_ANNOTATION
from gpuhealth.controller.process.runtime import Runtime
from gpuhealth.controller.state.store import Store
from tests.unit.builders import at, report_obj, xid_event
from tests.unit.fake_kube import FakeKube

TAINT = "gpuhealth.dev/unhealthy"


def _report(rv: str, xids: list[dict[str, Any]] | None = None, state: str = "Healthy") -> dict[str, Any]:
    body = report_obj(name="n1", xids=xids)
    body["metadata"]["resourceVersion"] = rv
    body["status"] = {"state": state}
    return body


def test_a_status_answer_older_than_the_watched_report_is_not_cached() -> None:
    store = Store()
    store.put_report("n1", _report("12", xids=[xid_event(79, 1, gpu_index=3)]))  # the agent's write, watched
    store.wrote("n1", _report("11"))  # our status write's answer, late
    assert store.reports["n1"]["metadata"]["resourceVersion"] == "12"
    assert store.reports["n1"]["spec"]["xidEvents"]
    store.wrote("n1", _report("13"))  # a newer answer is cached
    assert store.reports["n1"]["metadata"]["resourceVersion"] == "13"


def test_a_reread_or_created_report_older_than_the_watched_one_is_not_cached() -> None:
    store = Store()
    store.put_report("n1", _report("12", xids=[xid_event(79, 1, gpu_index=3)], state="Draining"))
    store.reread_report("n1", _report("11"))
    store.created("n1", _report("10"))
    assert store.reports["n1"]["metadata"]["resourceVersion"] == "12"
    assert str(store.records["n1"].state) == "Draining"


def test_a_node_answer_older_than_the_watched_node_is_not_cached() -> None:
    store = Store()

    def node(rv: str, annotations: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": "n1", "uid": "u1", "resourceVersion": rv, "annotations": annotations}}

    store.put_node("n1", node("20", {RELEASE_ANNOTATION: "now"}))  # an SRE's release, watched
    store.reflect_node("n1", node("19", {}))  # our taint's answer, late
    assert store.nodes["n1"]["metadata"]["annotations"] == {RELEASE_ANNOTATION: "now"}
    store.reflect_node("n1", node("21", {}))
    assert store.nodes["n1"]["metadata"]["resourceVersion"] == "21"


class _AgentWritesDuringOurStatusWrite(FakeKube):
    """The agent reports XID 79 just after the operator's status write is applied, and the watch
    delivers it before the write's answer reaches the pass."""

    def __init__(self) -> None:
        super().__init__()
        self.feed: Any = None
        self.armed = True

    def patch_report_status(self, name: str, patch: Any) -> dict[str, Any]:
        answer = super().patch_report_status(name, patch)
        if self.armed and self.feed is not None:
            self.armed = False
            agent = copy.deepcopy(self.reports[name])
            agent["spec"]["xidEvents"] = [xid_event(79, 1, gpu_index=3)]
            self.reports[name] = agent
            self.feed("MODIFIED", self._stamp(agent))
        return answer


def test_an_xid_written_while_our_status_write_was_answered_is_acted_on() -> None:
    kube = _AgentWritesDuringOurStatusWrite()
    kube.add_policy("p", {"actions": {"drain": {"checkpointMode": "none"}}})
    kube.add_node("n1")
    kube.add_report(report_obj(name="n1"))

    async def body() -> None:
        rt = Runtime(kube, clock=lambda: at(10), workers=1)
        await rt._load()
        await rt._list_pods()
        kube.feed = rt.on_report
        name = await rt.queue.get()
        await rt.reconciler.reconcile(name)  # writes Healthy; the agent's XID arrives meanwhile
        rt.queue.done(name)
        assert kube.reports["n1"]["status"]["state"] == "Healthy"
        assert await asyncio.wait_for(rt.queue.get(), 1) == "n1"  # the watched write queued it again
        await rt.reconciler.reconcile("n1")
        assert [t["key"] for t in kube.nodes["n1"]["spec"].get("taints") or []] == [TAINT]
        await rt.events.flush()

    asyncio.run(body())
