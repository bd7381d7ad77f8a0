"""A restart (or a failover) must not change a verdict: start-up freshness from the objects themselves.

The running operator judges freshness by when it sees a report or Lease change, and that memory is
lost when it restarts. These run one operator (a Runtime), then a second one over the same API (the
restart), and check that the second reaches the same verdict from what the objects say (the API
server's time of the agent's last write, in ``managedFields``) and announces nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.unit.builders import at, iso, report_obj
from tests.unit.controller.process._operator import NS, WallClock, managed_field, started, work
from tests.unit.fake_kube import FakeKube

BROKEN_CLOCK = "2099-01-01T00:00:00Z"
SILENCE = {"rules": {"agentSilence": {"after": "60s"}}}


def report(heartbeat: str, written: float | None, gen: int = 1) -> dict[str, Any]:
    body = report_obj(name="n1", heartbeatTime=heartbeat)
    body["metadata"].update(uid="r-uid", generation=gen)
    if written is not None:
        body["metadata"]["managedFields"] = [managed_field("heartbeatTime", written)]
    return body


def lease(renewed: str, written: float | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "n1", "namespace": NS, "uid": "l-uid", "resourceVersion": "7"}
    if written is not None:
        meta["managedFields"] = [managed_field("renewTime", written)]
    return {"metadata": meta, "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 120, "renewTime": renewed}}


@pytest.mark.parametrize("with_lease", [False, True], ids=["report", "report-and-lease"])
@pytest.mark.parametrize("server_time", [True, False], ids=["managedFields", "no-managedFields"])
def test_a_restart_leaves_a_silent_agent_with_a_broken_clock_unknown(with_lease: bool, server_time: bool) -> None:
    """The agent wrote a heartbeat in 2099 at 0s and went silent; the operator made it Unknown; a
    restart at 300s must not take 2099 for "now" (it did: Healthy, "Fresh report with no faults")."""
    kube = FakeKube()
    kube.add_policy("p", SILENCE)
    kube.add_node("n1")
    kube.add_report(report(BROKEN_CLOCK, 0 if server_time else None))
    if with_lease:
        kube.leases["n1"] = lease(BROKEN_CLOCK, 0 if server_time else None)
    clock = WallClock(at(1))

    async def body() -> None:
        first = await started(kube, clock)
        # With the server's time the report is fresh until the silence period has passed; without
        # it, a heartbeat in 2099 is no sign of life at all, and the node is Unknown from the start.
        assert kube.reports["n1"]["status"]["state"] == ("Healthy" if server_time else "Unknown")
        clock.now = at(61 + 5)
        first.sweep()
        await work(first)
        assert kube.reports["n1"]["status"]["state"] == "Unknown"
        assert kube.reports["n1"]["status"]["reason"] == "AgentSilent"

        kube.events.clear()
        clock.now = at(300)
        second = await started(kube, clock)  # the restart: nothing in memory, the same objects
        assert kube.reports["n1"]["status"]["state"] == "Unknown"
        for t in range(301, 320):  # and sweeps after it change nothing either
            clock.now = at(t)
            second.sweep()
            await work(second)
        assert kube.reports["n1"]["status"]["state"] == "Unknown"
        assert kube.reasons("n1") == [], "a restart announced something for an unchanged verdict"

    asyncio.run(body())


def test_a_restart_keeps_a_live_agent_with_a_clock_behind_healthy() -> None:
    """The agent writes every few seconds with a clock an hour behind: a restart takes the server's
    time of its last write, not its heartbeat, and does not announce its skew a second time."""
    kube = FakeKube()
    kube.add_policy("p", SILENCE)
    kube.add_node("n1")
    kube.add_report(report(iso(-3600), 0))
    clock = WallClock(at(1))

    async def body() -> None:
        first = await started(kube, clock)
        assert kube.reports["n1"]["status"]["state"] == "Healthy"
        kube.events.clear()
        kube.reports["n1"]["spec"]["heartbeatTime"] = iso(295 - 3600)  # the agent's latest write
        kube.reports["n1"]["metadata"].update(generation=2, managedFields=[managed_field("heartbeatTime", 295)])
        clock.now = at(300)
        second = await started(kube, clock)
        assert kube.reports["n1"]["status"]["state"] == "Healthy"
        # The agent writes again, its clock still an hour behind: the skew episode goes on, unannounced.
        clock.now = at(305)
        second.on_report("MODIFIED", {**report(iso(305 - 3600), 305, gen=3), "status": kube.reports["n1"]["status"]})
        await work(second)
        assert kube.reports["n1"]["status"]["state"] == "Healthy"
        assert kube.reasons("n1") == []
        del first

    asyncio.run(body())


def test_a_skew_present_at_start_up_is_announced_once_across_restarts() -> None:
    """A report written with a clock ten minutes ahead before the operator started: its first pass
    records the episode in the status and posts one ``ClockSkew``; a restarted operator finds the
    episode there and posts nothing; a write within the tolerance ends it."""
    kube = FakeKube()
    kube.add_policy("p", SILENCE)
    kube.add_node("n1")
    kube.add_report(report(iso(0 + 600), 0))
    clock = WallClock(at(1))

    async def body() -> None:
        await started(kube, clock)
        assert kube.reasons("n1").count("ClockSkew") == 1
        assert kube.reports["n1"]["status"]["clockSkew"] == {"offsetSeconds": 600, "since": iso(1)}
        kube.events.clear()
        clock.now = at(30)
        second = await started(kube, clock)
        assert kube.reasons("n1") == [], "a restart announced the episode again"
        clock.now = at(40)
        second.on_report("MODIFIED", {**report(iso(40), 40, gen=2), "status": kube.reports["n1"]["status"]})
        await work(second)
        assert "clockSkew" not in kube.reports["n1"]["status"] and kube.reasons("n1") == []

    asyncio.run(body())
