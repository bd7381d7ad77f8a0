"""The log says when the operator learned of a policy's spec, and not about its own status echoes."""

from __future__ import annotations

import logging

import pytest

from gpuhealth.controller.intake import feeders
from gpuhealth.controller.process.runtime import Runtime
from tests.unit.fake_kube import FakeKube


def policy(generation: int, status: dict[str, object] | None = None) -> dict[str, object]:
    return {
        "metadata": {"name": "p", "generation": generation, "uid": "u"},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}}},
        "status": status or {},
    }


def test_added_changed_and_deleted_are_logged_once_each(caplog: pytest.LogCaptureFixture) -> None:
    rt = Runtime(FakeKube())
    with caplog.at_level(logging.INFO, logger=feeders.__name__):
        rt.on_policy("ADDED", policy(1))
        rt.on_policy("MODIFIED", policy(1, {"nodes": 3}))  # our own status write, echoed
        rt.on_policy("MODIFIED", policy(2))
        rt.on_policy("DELETED", policy(2))
    assert [r.getMessage() for r in caplog.records if r.name == feeders.__name__] == [
        "policy p added (generation 1)",
        "policy p changed (generation 2)",
        "policy p deleted",
    ]


def node(name: str) -> dict[str, object]:
    return {"metadata": {"name": name, "uid": name, "labels": {"pool": "a", "nvidia.com/gpu.present": "true"}}}


def test_the_operators_own_status_write_requeues_no_node_and_a_spec_change_every_node() -> None:
    """The policy's status moves whenever its counts do (a GPU held out, a node back), and the write
    comes back as a watch event: re-passing the fleet on it put every new fault behind a thousand
    passes each tick at 1,000 nodes. A change of what the policy decides still re-passes every node."""
    rt = Runtime(FakeKube())
    rt.on_policy("ADDED", policy(1))
    for n in ("n1", "n2", "n3"):
        rt.on_node("ADDED", node(n), enqueue=False)
    rt.queue._dirty.clear()

    rt.on_policy("MODIFIED", policy(1, {"nodes": 3, "degraded": 1, "breaker": "Closed"}))
    assert set(rt.queue._dirty) == set()

    rt.on_policy("MODIFIED", {**policy(2), "spec": {"nodeSelector": {"matchLabels": {"pool": "b"}}}})
    assert set(rt.queue._dirty) == {"n1", "n2", "n3"}

    rt.queue._dirty.clear()
    rt.on_policy("DELETED", policy(2))
    assert set(rt.queue._dirty) == {"n1", "n2", "n3"}
