"""The eviction/checkpoint-order invariant fires on a violating audit history and not on a clean one."""

from __future__ import annotations

import datetime as dt
from typing import Any

from devkit.podorder import PodWrite, order_problems, pod_writes

T0 = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)


def at(s: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def entry(verb: str, pod: str, s: float, sub: str | None = None, code: int = 201, ns: str = "w") -> dict[str, Any]:
    ref: dict[str, Any] = {"resource": "pods", "namespace": ns, "name": pod}
    if sub:
        ref["subresource"] = sub
    return {
        "verb": verb,
        "objectRef": ref,
        "responseStatus": {"code": code},
        "requestReceivedTimestamp": at(s).isoformat().replace("+00:00", "Z"),
    }


def everyone(_: str) -> bool:
    return True


def test_asked_then_evicted_once_is_clean() -> None:
    writes = pod_writes([entry("patch", "p", 1, code=200), entry("create", "p", 5, "eviction")], ["w"])
    assert writes == [PodWrite("w/p", "request", at(1)), PodWrite("w/p", "evict", at(5))]
    assert order_problems(writes, everyone) == []


def test_evicted_without_being_asked_fires() -> None:
    writes = pod_writes([entry("create", "p", 5, "eviction")], ["w"])
    [problem] = order_problems(writes, everyone)
    assert "w/p" in problem and "without being asked" in problem and "never asked" in problem


def test_asked_only_after_the_eviction_fires() -> None:
    writes = pod_writes([entry("create", "p", 5, "eviction"), entry("patch", "p", 6, code=200)], ["w"])
    [problem] = order_problems(writes, everyone)
    assert "asked only at" in problem


def test_a_pod_that_needs_no_request_may_be_evicted_unasked() -> None:
    writes = pod_writes([entry("create", "p", 5, "eviction")], ["w"])
    assert order_problems(writes, lambda pod: pod != "w/p") == []


def test_the_workload_having_seen_the_request_first_counts() -> None:
    writes = pod_writes([entry("create", "p", 5, "eviction")], ["w"])
    assert order_problems(writes, everyone, {"w/p": at(3)}) == []
    assert order_problems(writes, everyone, {"w/p": at(6)})  # seen only after the eviction


def test_twice_asked_or_twice_evicted_fires() -> None:
    writes = pod_writes(
        [
            entry("patch", "p", 1, code=200),
            entry("patch", "p", 2, code=200),
            entry("create", "p", 5, "eviction"),
            entry("create", "p", 6, "eviction"),
        ],
        ["w"],
    )
    problems = order_problems(writes, everyone)
    assert any("asked to checkpoint 2 times" in p for p in problems)
    assert any("evicted 2 times" in p for p in problems)


def test_refused_calls_and_other_namespaces_do_not_count() -> None:
    writes = pod_writes(
        [
            entry("create", "p", 4, "eviction", code=429),  # a PDB said no: not an eviction
            entry("patch", "p", 1, code=200),
            entry("create", "p", 5, "eviction"),
            entry("create", "q", 5, "eviction", ns="elsewhere"),
        ],
        ["w"],
    )
    assert [w.kind for w in writes] == ["request", "evict"]
    assert order_problems(writes, everyone) == []
