"""One status write per pass (issue #51): the node's GPUNodeHealth status is written by the node
reconciler's decision patch, and besides it only by ``controller/act/status_writes.py`` (the records a
room writes before or after its effects). A record that only follows from the decision (a drain
record the decision ends) goes in the decision patch. Through the in-memory Kube port."""

from __future__ import annotations

import ast
import asyncio
import copy
import datetime as dt
from pathlib import Path
from typing import Any

import gpuhealth
from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import at, report_obj, xid_event
from tests.unit.controller.act._device_support import Clock, ecc_on
from tests.unit.controller.act._device_support import runtime as device_runtime
from tests.unit.fake_kube import FakeKube

OPERATOR = Path(gpuhealth.__file__).resolve().parent
STATUS = ("patch", "report/n1/status")


def _callers(attr: str) -> set[str]:
    """``module:function`` of every call of a method named ``attr`` in the operator, outside the Kube port."""
    found: set[str] = set()
    for path in OPERATOR.rglob("*.py"):
        rel = path.relative_to(OPERATOR).as_posix()
        if rel.startswith("kube/"):
            continue
        tree = ast.parse(path.read_text(), rel)
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attr:
                        found.add(f"{rel}:{fn.name}")
    return found


def test_the_status_has_two_writers_the_decision_patch_and_the_rooms_records() -> None:
    assert _callers("patch_report_status") == {
        "controller/act/node_reconciler.py:_persist",
        "controller/act/status_writes.py:record",
    }


async def _runtime(kube: FakeKube, clock: Clock) -> Runtime:
    return await device_runtime(kube, clock, slices=False)  # no DRA slices: the list is in, empty


def _report(rt: Runtime, kube: FakeKube, clock: Clock, **kw: Any) -> None:
    """The agent writes its facts now (a fresh heartbeat), and the watch brings them."""
    body = report_obj(name="n1", heartbeat=(clock.t - at(0)).total_seconds(), **kw)
    kube.reports["n1"]["spec"] = body["spec"]
    rt.on_report("MODIFIED", copy.deepcopy(kube.reports["n1"]), enqueue=False)


def _status(kube: FakeKube) -> dict[str, Any]:
    return kube.reports["n1"].get("status") or {}


def test_the_drain_record_goes_with_the_decision_that_returns_the_node() -> None:
    """Recovering to Healthy: the state and the end of the drain record in one status write (it was
    two: the decision, then the drainer's removal after the Node write)."""
    kube, clock = FakeKube(), Clock()
    kube.add_policy("p", {"safety": {"probation": "30s"}})
    kube.add_node("n1")
    kube.add_report(report_obj(name="n1"))

    async def body() -> None:
        rt = await _runtime(kube, clock)
        _report(rt, kube, clock, xids=[xid_event(79, 9)])
        for _ in range(3):  # tainted; the empty node's drain completes; Quarantined
            await rt.reconciler.reconcile("n1")
        assert _status(kube)["state"] == "Quarantined" and _status(kube)["drain"]["phase"] == "Completed"
        clock.t += dt.timedelta(seconds=5)
        _report(rt, kube, clock)
        await rt.reconciler.reconcile("n1")
        assert _status(kube)["state"] == "Recovering" and _status(kube)["drain"]
        clock.t += dt.timedelta(seconds=40)
        _report(rt, kube, clock)
        before = len(kube.writes)
        await rt.reconciler.reconcile("n1")
        assert _status(kube)["state"] == "Healthy" and "drain" not in _status(kube)
        assert kube.writes[before:].count(STATUS) == 1, kube.writes[before:]
        await rt.events.flush()

    asyncio.run(body())


def test_a_previous_episodes_drain_record_goes_with_the_decision_that_starts_the_next() -> None:
    """A node Draining again, its status still holding an earlier episode's drain: the decision drops
    that record, and the new drain's start is then one write (it was two: the record removed, then
    the start), with nothing of the earlier drain's pods left in it."""
    kube, clock = FakeKube(), Clock()
    kube.add_policy("p", {})
    kube.add_node("n1")
    kube.add_report(report_obj(name="n1"))
    old = {"phase": "Completed", "startedAt": "2020-01-01T00:00:00Z", "total": 1, "evicted": 1}
    old["pods"] = {"uid-gone": {"pod": "ml/gone", "node": "n1", "evictedAt": "2020-01-01T00:00:01Z"}}
    kube.reports["n1"]["status"] = {"state": "Healthy", "drain": old}

    async def body() -> None:
        rt = await _runtime(kube, clock)
        _report(rt, kube, clock, xids=[xid_event(79, 9)])
        before = len(kube.writes)
        await rt.reconciler.reconcile("n1")  # Draining, tainted; the drain starts on the next pass
        assert _status(kube)["state"] == "Draining" and "drain" not in _status(kube)
        assert kube.writes[before:].count(STATUS) == 1, kube.writes[before:]
        before = len(kube.writes)
        await rt.reconciler.reconcile("n1")  # the empty node's drain: started and completed
        assert kube.writes[before:].count(STATUS) == 2, "its start, its end: nothing to remove first"
        drain = _status(kube)["drain"]
        assert drain["phase"] == "Completed" and "uid-gone" not in (drain.get("pods") or {})
        await rt.events.flush()

    asyncio.run(body())


def test_two_gpus_ready_in_one_pass_get_one_reset_the_other_waits_for_it() -> None:
    """One reset at a time per node, under a policy limit that would allow both: the second GPU of the
    pass sees the first one's record as this pass left it (the remediator's own writes), never the
    status as the pass began (which made two reset Jobs in the first typed pass)."""
    kube = FakeKube()
    policy = {
        "safety": {"maxUnhealthyGPUs": 4},
        "devices": {"maxBadGPUsPerNode": 2},
        "remediation": {"enabled": True, "maxConcurrent": 4},
    }
    kube.add_policy("p", policy)
    kube.add_node("n1")
    kube.add_report(ecc_on(2, 3))
    clock = Clock()

    async def body() -> None:
        rt = await device_runtime(kube, clock)
        for _ in range(6):
            await rt.reconciler.reconcile("n1")
            clock.t += dt.timedelta(seconds=1)
        await rt.events.flush()

    asyncio.run(body())
    ladders = kube.reports["n1"]["status"]["remediation"]
    assert len(kube.jobs) == 1 and sum(e.get("phase") == "Running" for e in ladders.values()) == 1, ladders
    blocked = [e["message"] for e in kube.events if e["reason"] == "RemediationBlocked"]
    assert any("another GPU of this node is being reset" in m for m in blocked), blocked


def test_a_drain_resumed_after_a_restart_over_an_earlier_episodes_record_removes_it_once() -> None:
    """A node found Draining with an earlier episode's drain record (a restart between the decision and
    the drain's start): the decision patch drops it, and the drain of the same pass starts from no
    record, with no removal of its own (it read the status as the pass began, less what the decision
    patch dropped)."""
    kube, clock = FakeKube(), Clock()
    kube.add_policy("p", {})
    kube.add_node("n1")
    kube.add_report(report_obj(name="n1", xids=[xid_event(79, 9)], heartbeat=(clock.t - at(0)).total_seconds()))
    old = {"phase": "Completed", "startedAt": "2020-01-01T00:00:00Z", "total": 1, "evicted": 1}
    old["pods"] = {"uid-gone": {"pod": "ml/gone", "node": "n1", "evictedAt": "2020-01-01T00:00:01Z"}}
    kube.reports["n1"]["status"] = {
        "state": "Draining",
        "since": "2025-01-01T12:00:05Z",
        "reason": "Xid79",
        "drain": old,
    }

    async def body() -> None:
        rt = await _runtime(kube, clock)
        before = len(kube.writes)
        await rt.reconciler.reconcile("n1")
        writes = kube.writes[before:]
        drain = _status(kube).get("drain") or {}
        assert drain.get("startedAt") != old["startedAt"] and "uid-gone" not in (drain.get("pods") or {}), drain
        assert writes.count(STATUS) == 3, writes  # the decision (the old record dropped), the start, the end
        await rt.events.flush()

    asyncio.run(body())


def _passes_write_nothing_while_time_passes(kube: FakeKube, clock: Clock, state: str) -> dict[str, Any]:
    """Reconcile n1 now and 15 s later (a finding held for a 10 s ``sustainedFor`` is there by then),
    then twice more, 20 s and 10 min later, with nothing new from the agent: the later passes write no
    status (each write is a watch event that queues the next pass, so a status that changed with the
    clock was a write loop)."""

    async def body() -> dict[str, Any]:
        rt = await _runtime(kube, clock)
        await rt.reconciler.reconcile("n1")
        clock.t += dt.timedelta(seconds=15)
        await rt.reconciler.reconcile("n1")
        assert _status(kube)["state"] == state, _status(kube)
        first = copy.deepcopy(_status(kube))
        before = len(kube.writes)
        for later in (20, 600):
            clock.t += dt.timedelta(seconds=later)
            await rt.reconciler.reconcile("n1")
        assert kube.writes[before:].count(STATUS) == 0, (kube.writes[before:], first, _status(kube))
        await rt.events.flush()
        return first

    return asyncio.run(body())


def test_a_silent_agents_node_is_written_unknown_once_not_again_each_pass() -> None:
    """Its message names when the last heartbeat came, not how long ago (it said "for 1207s", and the
    operator rewrote the status of every silent node every pass, found by counting a test run's
    status writes on the API server)."""
    kube, clock = FakeKube(), Clock()
    kube.add_policy("p", {"rules": {"agentSilence": {"after": "60s"}}})
    kube.add_node("n1")
    kube.add_report(report_obj(name="n1", heartbeat=-100))
    status = _passes_write_nothing_while_time_passes(kube, clock, "Unknown")
    assert status["message"] == "no heartbeat from the agent since 2025-01-01T11:58:20Z (limit 60s)"


def test_a_held_thermal_finding_is_written_once_not_again_each_pass() -> None:
    """The evidence of a slowdown and of a temperature held over the threshold says since when, not
    for how long: the status of a node degraded by either stays as written."""
    kube, clock = FakeKube(), Clock()
    rules = {"agentSilence": {"after": "1h"}, "thermal": {"action": "observe", "sustainedFor": "10s"}}
    kube.add_policy("p", {"rules": rules})
    kube.add_node("n1")
    devices = [
        {"index": i, "uuid": f"GPU-{i:04d}", "model": "NVIDIA H100 80GB HBM3"}
        | ({"clockEventReasons": 0x40, "clockEventsSince": "2025-01-01T11:50:00Z"} if i == 1 else {})
        | ({"temperature": {"currentC": 95}} if i == 2 else {})
        for i in range(8)
    ]
    kube.add_report(report_obj(name="n1", devices=devices, heartbeat=10))
    status = _passes_write_nothing_while_time_passes(kube, clock, "Degraded")
    details = sorted(e["detail"] for e in status["evidence"])
    assert details == [
        "hardware thermal slowdown (clock events 0x40) since 2025-01-01T11:50:00Z",
        "temperature 95C at or above 90C since 2025-01-01T12:00:10Z",
    ], details
