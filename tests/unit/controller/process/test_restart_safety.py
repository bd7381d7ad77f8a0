"""Restart- and race-safety of the reconciler's own memory, through a recording stand-in for the Kube port.

Everything that talks to a real API server is tested in tests/integration; these pin two races that
are hard to time there: a breaker transition announced again by a restarted operator, and a pod
evicted twice because a watch event older than the eviction arrived after it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from gpuhealth.controller.process.runtime import Runtime

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


class RecordingKube:
    """Only the two calls policy status touches; records them in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def patch_policy_status(self, name: str, patch: dict[str, Any]) -> None:
        self.calls.append(("status", patch["status"]["breaker"]))

    def post_event(self, kind: str, name: str, uid: str, type_: str, reason: str, *_: Any) -> None:
        self.calls.append(("event", reason))


def _policy(name: str, breaker: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": name, "uid": "p-uid", "generation": 1},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}}, "safety": {"maxUnhealthy": 1}},
    }
    if breaker is not None:
        body["status"] = {"breaker": breaker}
    return body


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"pool": "a"}}, "spec": {}, "status": {}}


async def _sweep_once(r: Runtime) -> None:
    await r.policy_status.update()
    await r.events.flush()


def _reconciler(kube: RecordingKube, breaker_in_status: str | None) -> Runtime:
    r = Runtime(kube, clock=lambda: T0)  # type: ignore[arg-type]
    r.on_policy("ADDED", _policy("p", breaker_in_status), enqueue=False)
    for n in ("n1", "n2"):
        r.on_node("ADDED", _node(n), enqueue=False)
    return r


def _hold_back(r: Runtime, name: str) -> None:
    r.on_report(
        "ADDED",
        {"metadata": {"name": name}, "status": {"state": "Degraded", "heldByBreaker": True}},
        enqueue=False,
    )


def test_a_restarted_operator_does_not_announce_an_open_breaker_again() -> None:
    kube = RecordingKube()
    r = _reconciler(kube, breaker_in_status="Open")  # what the previous operator recorded
    _hold_back(r, "n2")
    asyncio.run(_sweep_once(r))
    assert ("event", "BreakerOpen") not in kube.calls


def test_a_new_transition_is_recorded_before_it_is_announced_and_only_once() -> None:
    kube = RecordingKube()
    r = _reconciler(kube, breaker_in_status="Closed")
    _hold_back(r, "n2")

    async def twice() -> None:
        await _sweep_once(r)
        await _sweep_once(r)

    asyncio.run(twice())
    assert kube.calls == [("status", "Open"), ("event", "BreakerOpen")]


def test_a_failed_status_write_announces_nothing() -> None:
    class Failing(RecordingKube):
        def patch_policy_status(self, name: str, patch: dict[str, Any]) -> None:
            raise RuntimeError("API away")

    kube = Failing()
    r = _reconciler(kube, breaker_in_status="Closed")
    _hold_back(r, "n2")
    with pytest.raises(RuntimeError):  # the sweep fails and is retried on the next tick
        asyncio.run(_sweep_once(r))
    assert kube.calls == []


def _pod(deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": "pod-1", "resourceVersion": "5"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T12:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}


def test_a_stale_pod_event_does_not_undo_a_deletion() -> None:
    r = Runtime(RecordingKube(), clock=lambda: T0)  # type: ignore[arg-type]
    r.on_pod("ADDED", _pod(deleting=True), enqueue=False)
    r.on_pod("MODIFIED", _pod(deleting=False), enqueue=False)  # older than the eviction, delivered after it
    (pod,) = r.store.pods.on("n1")
    assert pod["metadata"]["deletionTimestamp"] == "2026-11-30T12:00:00Z"
    r.on_pod("DELETED", _pod(), enqueue=False)
    assert r.store.pods.on("n1") == [] and r.store.pods.nodes() == []
