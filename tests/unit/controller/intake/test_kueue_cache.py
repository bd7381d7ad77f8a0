"""The Kueue cache keeps the newest copy of a Workload: an admission-check write's answer that reaches
the writer after the watch brought Kueue's next change (``kube/versions.py``) is not cached over it."""

from __future__ import annotations

from typing import Any

from gpuhealth.controller.intake.kueuewatch import KueueCache


def _wl(rv: str, admitted: bool) -> dict[str, Any]:
    status: dict[str, Any] = {"admission": {"clusterQueue": "gpus"}} if admitted else {}
    return {"metadata": {"name": "train", "namespace": "ml", "uid": "w1", "resourceVersion": rv}, "status": status}


def test_an_answer_older_than_the_watched_workload_is_not_cached() -> None:
    cache = KueueCache()
    cache.put_workload(_wl("31", admitted=True))  # Kueue admitted it: the watch
    cache.refresh_workload(_wl("30", admitted=False))  # our check's write, answered late
    assert cache.workloads["ml/train"]["metadata"]["resourceVersion"] == "31"
    assert cache.workloads["ml/train"]["status"]["admission"]


def test_a_newer_answer_or_a_first_copy_is_cached() -> None:
    cache = KueueCache()
    cache.refresh_workload(_wl("5", admitted=False))
    assert "ml/train" in cache.workloads
    cache.refresh_workload(_wl("6", admitted=True))
    assert cache.workloads["ml/train"]["metadata"]["resourceVersion"] == "6"
