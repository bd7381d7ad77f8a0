"""A node whose agent never reported: one ``AgentSilent``, whatever passes follow on the operator's stub.

After the silence period the operator creates a stub report (``node_reconciler._create_stub``) so the
Unknown verdict has a home. The stub carries no heartbeat, no ``nvml`` and no devices; read as the
agent's word, it said "the agent cannot read the GPUs", and the pass after the stub's watch event
announced ``NVMLUnavailable`` for the same silence (seen in the SIGKILL-and-restart integration
test's Events, issue #53).
"""

from __future__ import annotations

import asyncio

from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import at
from tests.unit.controller.process._operator import WallClock, work
from tests.unit.fake_kube import FakeKube


def test_a_node_whose_agent_never_reported_is_announced_once() -> None:
    kube, clock = FakeKube(), WallClock()
    kube.add_policy("p", {"rules": {"agentSilence": {"after": "5s"}}})
    kube.add_node("n1")

    async def body() -> None:
        rt = Runtime(kube, clock=clock, workers=1)
        await rt._load()
        await rt._list_pods()
        for t in range(1, 8):
            clock.now = at(t)
            rt.sweep()
            await work(rt)
        assert "n1" in kube.reports and kube.reasons("n1") == ["AgentSilent"]
        rt.on_report("ADDED", kube.get_report("n1"))  # the stub's own watch event
        for t in range(8, 15):
            clock.now = at(t)
            rt.sweep()
            await work(rt)
        status = kube.reports["n1"]["status"]
        assert (status["state"], status["reason"]) == ("Unknown", "AgentSilent")
        assert kube.reasons("n1") == ["AgentSilent"], [(e["reason"], e["message"]) for e in kube.events]
        rt.events.close()

    asyncio.run(body())
