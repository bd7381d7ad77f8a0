"""Our own write's response must not hide a newer copy of the pod the watch already cached (the bench's
drain storm: a checkpoint request's response landed after the acknowledgement's watch event, and the
drain waited for an acknowledgement it already had)."""

from __future__ import annotations

from typing import Any

from gpuhealth.api.names import CHECKPOINT_COMPLETED, CHECKPOINT_REQUESTED
from gpuhealth.controller.state.store import Store


def _pod(rv: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "r0", "namespace": "ml", "uid": "u0", "resourceVersion": rv, "annotations": annotations},
        "spec": {"nodeName": "a"},
        "status": {"phase": "Running"},
    }


def test_a_response_older_than_the_cached_pod_is_not_written_back() -> None:
    store = Store()
    asked = {CHECKPOINT_REQUESTED: "2026-12-01T15:21:12.275854Z"}
    store.pods.put(_pod("12", {**asked, CHECKPOINT_COMPLETED: "2026-12-01T15:21:14.346317Z"}))  # the watch: acked
    store.pods.refresh(_pod("11", asked))  # the request's own response, late
    (cached,) = store.pods.on("a")
    assert cached["metadata"]["annotations"].get(CHECKPOINT_COMPLETED)
    assert cached["metadata"]["resourceVersion"] == "12"


def test_a_newer_response_is_cached() -> None:
    store = Store()
    store.pods.put(_pod("10", {}))
    store.pods.refresh(_pod("11", {CHECKPOINT_REQUESTED: "2026-12-01T15:21:12Z"}))
    (cached,) = store.pods.on("a")
    assert cached["metadata"]["resourceVersion"] == "11"
    assert CHECKPOINT_REQUESTED in cached["metadata"]["annotations"]
    fresh = Store()
    fresh.pods.refresh(_pod("5", {}))  # not cached yet: cached
    assert len(fresh.pods.on("a")) == 1
