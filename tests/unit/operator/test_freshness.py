"""Freshness by the operator's clock: an agent's clock can neither keep a dead node fresh nor a live one stale."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpuhealth.evaluation.freshness import SKEW_TOLERANCE_S, Seen, heard_at, observe

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def body(gen: int, heartbeat: dt.datetime | None, uid: str = "u1") -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": "n"}
    if heartbeat is not None:
        spec["heartbeatTime"] = heartbeat.isoformat().replace("+00:00", "Z")
    return {"metadata": {"name": "n", "uid": uid, "generation": gen}, "spec": spec}


def test_a_clock_far_ahead_counts_from_when_the_write_was_seen() -> None:
    ahead = T0 + dt.timedelta(hours=1)
    seen, skew = observe(None, body(1, ahead), T0, live=True)
    assert seen is not None and heard_at(seen, ahead) == T0
    assert skew is not None and skew.seconds == 3600 and "ahead of" in skew.describe()


def test_a_clock_behind_is_not_silence_while_the_agent_writes() -> None:
    behind = T0 - dt.timedelta(minutes=30)
    seen, skew = observe(None, body(1, behind), T0, live=True)
    assert seen is not None and heard_at(seen, behind) == T0
    assert skew is not None and skew.seconds < 0 and "behind" in skew.describe()


def test_ordinary_latency_is_not_skew() -> None:
    _, skew = observe(None, body(1, T0 - dt.timedelta(seconds=SKEW_TOLERANCE_S - 1)), T0, live=True)
    assert skew is None


def test_status_writes_and_relists_are_no_sign_of_life() -> None:
    seen, _ = observe(None, body(4, T0), T0, live=True)
    later = T0 + dt.timedelta(minutes=10)
    again, skew = observe(seen, body(4, T0), later, live=True)  # same generation: the operator's own write
    assert again == seen and skew is None
    assert heard_at(again, T0) == T0


def test_a_new_spec_write_is_seen_now() -> None:
    seen, _ = observe(None, body(4, T0), T0, live=True)
    later = T0 + dt.timedelta(seconds=30)
    newer, _ = observe(seen, body(5, later), later, live=True)
    assert newer is not None and newer.at == later


def test_a_recreated_report_is_a_new_object_even_at_the_same_generation() -> None:
    seen, _ = observe(None, body(1, T0, uid="a"), T0, live=True)
    later = T0 + dt.timedelta(seconds=30)
    newer, _ = observe(seen, body(1, later, uid="b"), later, live=True)
    assert newer is not None and newer.at == later


def test_skew_is_announced_once_per_episode() -> None:
    ahead = dt.timedelta(hours=1)
    seen, first = observe(None, body(1, T0 + ahead), T0, live=True)
    t1 = T0 + dt.timedelta(seconds=30)
    seen, second = observe(seen, body(2, t1 + ahead), t1, live=True)
    assert first is not None and second is None
    t2 = t1 + dt.timedelta(seconds=30)
    seen, _ = observe(seen, body(3, t2), t2, live=True)  # clock fixed
    t3 = t2 + dt.timedelta(seconds=30)
    _, third = observe(seen, body(4, t3 + ahead), t3, live=True)  # and wrong again
    assert third is not None


def test_at_start_up_a_past_heartbeat_is_taken_and_a_future_one_clamped() -> None:
    old = T0 - dt.timedelta(minutes=5)
    seen, skew = observe(None, body(1, old), T0, live=False)
    assert seen is not None and seen.at == old and skew is None
    seen, skew = observe(None, body(1, T0 + dt.timedelta(days=1)), T0, live=False)
    assert seen is not None and seen.at == T0 and skew is None


def test_no_heartbeat_is_no_sign_of_life() -> None:
    # The operator's own stub for a node whose agent never reported has a generation but no heartbeat.
    seen, skew = observe(Seen(("u1", 1), T0), body(2, None), T0, live=True)
    assert seen is None and skew is None
    assert heard_at(seen, None) is None


def test_without_a_generation_the_agents_heartbeat_is_used() -> None:
    b = body(1, T0)
    del b["metadata"]["generation"]
    seen, _ = observe(None, b, T0 + dt.timedelta(minutes=1), live=True)
    assert seen is None and heard_at(seen, T0) == T0
