"""A write the watch brings late is no sign of life now: the agent's silence is counted from when it wrote.

A loaded API server delivers watch events late, and a watch resumed after a cut stream (or relisted
after 410 Gone) brings writes made while it was away. Taken as heard when they arrive, an agent's last
heartbeat made a silent node fresh again: Unknown, then "Healthy", then a second ``AgentSilent`` for
one silence (issue #53: a SIGKILL-and-restart test's silent node with a 2099 clock had a second
``AgentSilent`` Event). The API server's time of the write (``managedFields``) says when it was made.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import at, report_obj
from tests.unit.controller.process._operator import NS, WallClock, managed_field, started, work
from tests.unit.fake_kube import FakeKube

BROKEN_CLOCK = "2099-01-01T00:00:00Z"


def lease(renewed: str, seconds: float) -> dict[str, Any]:
    meta = {
        "name": "n1",
        "namespace": NS,
        "uid": "l-uid",
        "resourceVersion": "7",
        "managedFields": [managed_field("renewTime", seconds)],
    }
    return {"metadata": meta, "spec": {"holderIdentity": "n1", "renewTime": renewed}}


def report(gen: int, seconds: float) -> dict[str, Any]:
    body = report_obj(name="n1", heartbeatTime=BROKEN_CLOCK)
    body["metadata"].update(uid="r-uid", generation=gen, resourceVersion=str(100 + gen))
    body["metadata"]["managedFields"] = [managed_field("heartbeatTime", seconds)]
    return body


async def sweep_until(rt: Runtime, clock: WallClock, seconds: int, states: list[str], kube: FakeKube) -> None:
    """Sweep once a second (the runtime's tick), noting the node's state after each."""
    start = int((clock.now - at(0)).total_seconds()) + 1
    for t in range(start, seconds + 1):
        clock.now = at(t)
        rt.sweep()
        await work(rt)
        states.append(kube.reports["n1"]["status"]["state"])


def fleet() -> tuple[FakeKube, WallClock]:
    kube = FakeKube()
    kube.add_policy("p", {"rules": {"agentSilence": {"after": "5s"}}})
    kube.add_node("n1")
    return kube, WallClock()


def test_a_renewal_the_lease_watch_brings_late_does_not_wake_a_silent_node() -> None:
    """The agent wrote its report and renewed its Lease at 0 s, then went silent; the report's event came
    at once, the Lease's 7 s later (a lagging watch): the node stays Unknown, announced once."""
    kube, clock = fleet()

    async def body() -> None:
        rt = await started(kube, clock)
        clock.now = at(0.2)
        rt.on_report("ADDED", kube.add_report(report(1, 0)))
        await work(rt)
        states: list[str] = []
        await sweep_until(rt, clock, 6, states, kube)
        assert states[-1] == "Unknown" and kube.reasons("n1").count("AgentSilent") == 1
        clock.now = at(7.5)
        rt.on_lease("MODIFIED", lease("2099-01-01T00:00:00.123456Z", 0))
        await work(rt)
        await sweep_until(rt, clock, 15, states, kube)
        assert set(states[-9:]) == {"Unknown"}, "a renewal made at 0 s woke a node silent since"
        assert kube.reasons("n1").count("AgentSilent") == 1, kube.reasons("n1")
        assert "Healthy" not in kube.reasons("n1")

    asyncio.run(body())


def test_a_report_write_the_watch_brings_late_counts_from_when_it_was_made() -> None:
    """The agent's second write (at 1 s) reaches the operator at 8 s, after it had made the node Unknown
    (a watch resumed after a cut stream): silent since 1 s, not since 8 s."""
    kube, clock = fleet()

    async def body() -> None:
        rt = await started(kube, clock)
        clock.now = at(0.2)
        rt.on_report("ADDED", kube.add_report(report(1, 0)))
        await work(rt)
        kube.reports["n1"]["metadata"].update(generation=2, managedFields=[managed_field("heartbeatTime", 1)])
        states: list[str] = []
        await sweep_until(rt, clock, 7, states, kube)
        assert states[-1] == "Unknown"
        clock.now = at(8)
        rt.on_report("MODIFIED", {**kube.reports["n1"], "metadata": {**kube.reports["n1"]["metadata"]}})
        await work(rt)
        await sweep_until(rt, clock, 15, states, kube)
        assert set(states[-8:]) == {"Unknown"}
        assert kube.reasons("n1").count("AgentSilent") == 1, kube.reasons("n1")

    asyncio.run(body())


def test_a_relist_after_the_watch_expired_counts_missed_writes_from_when_they_were_made() -> None:
    """410 Gone: the reports are listed again and fed as events; a write made at 1 s and missed while the
    watch was away is no sign of life at 9 s."""
    kube, clock = fleet()

    async def body() -> None:
        rt = await started(kube, clock)
        clock.now = at(0.2)
        rt.on_report("ADDED", kube.add_report(report(1, 0)))
        await work(rt)
        kube.reports["n1"]["metadata"].update(generation=2, managedFields=[managed_field("heartbeatTime", 1)])
        states: list[str] = []
        await sweep_until(rt, clock, 8, states, kube)
        clock.now = at(9)
        rt.replace_reports(kube.list_custom("gpunodehealths"))
        await work(rt)
        await sweep_until(rt, clock, 15, states, kube)
        assert set(states[-7:]) == {"Unknown"}
        assert kube.reasons("n1").count("AgentSilent") == 1, kube.reasons("n1")

    asyncio.run(body())


def test_a_write_the_watch_brings_at_once_counts_from_now() -> None:
    """The ordinary case is unchanged: a prompt event counts from when the operator saw it (the server's
    whole-second time of it is a little behind), so a live agent is not aged by the rounding."""
    kube, clock = fleet()

    async def body() -> None:
        rt = await started(kube, clock)
        clock.now = at(10.9)
        rt.on_report("ADDED", kube.add_report(report(1, 10.2)))
        await work(rt)
        assert rt.store.heard("n1") is not None and rt.store.heard("n1").at == at(10.9)  # type: ignore[union-attr]
        clock.now = at(15.8)
        rt.sweep()
        await work(rt)
        assert kube.reports["n1"]["status"]["state"] == "Healthy"

    asyncio.run(body())
