"""The log says when the operator learned of a policy's spec, and not about its own status echoes."""

from __future__ import annotations

import logging

import pytest

from gpuhealth.controller.process import feeders
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
