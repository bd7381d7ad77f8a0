"""The cache feeders and the store keep the Node cache true to the API: a deleted Node stays deleted."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuhealth.controller.intake.slim import slim_node
from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import T0
from tests.unit.fake_kube import FakeKube


def _node(rv: str, **status: Any) -> dict[str, Any]:
    """A Node as the watch brings it: the kubelet's heartbeat fields change with every update."""
    return {
        "metadata": {"name": "n1", "resourceVersion": rv, "labels": {"nvidia.com/gpu.present": "true"}},
        "spec": {},
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": f"2026-12-02T06:00:{rv}Z"}],
            **status,
        },
    }


def test_our_own_write_answered_after_a_deletion_does_not_bring_the_node_back() -> None:
    """A Node patch answered just before the Node was deleted can resume after the DELETED event: the
    answer must not cache the Node again (it would be passed, and fail, forever; its report kept)."""

    async def body() -> None:
        r = Runtime(FakeKube(), clock=lambda: T0, workers=1)
        node = _node("10")
        node["metadata"]["uid"] = "u1"
        r.on_node("ADDED", slim_node(node))
        answer = {**node, "metadata": {**node["metadata"], "resourceVersion": "11"}}
        r.store.reflect_node("n1", answer)  # still cached: reflected
        assert r.store.nodes["n1"]["metadata"]["resourceVersion"] == "11"
        r.on_node("DELETED", {"metadata": {"name": "n1"}})
        r.store.reflect_node("n1", answer)  # deleted meanwhile: not brought back
        assert "n1" not in r.store.nodes
        again = {**node, "metadata": {**node["metadata"], "uid": "u2"}}  # a new Node of the same name
        r.on_node("ADDED", slim_node(again))
        r.store.reflect_node("n1", answer)  # the old Node's answer does not replace the new one
        assert r.store.nodes["n1"]["metadata"]["uid"] == "u2"

    asyncio.run(body())
