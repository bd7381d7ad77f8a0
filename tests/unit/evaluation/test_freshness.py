"""Freshness by the operator's clock: an agent's clock can neither keep a dead node fresh nor a live one stale."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpuhealth.controller.state.slim import slim_report
from gpuhealth.evaluation.freshness import (
    SKEW_TOLERANCE_S,
    WRITTEN_AT,
    Seen,
    Skew,
    heard_at,
    latest,
    observe,
    skew_episode,
    written,
    written_at,
)

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
YEAR_2099 = dt.datetime(2099, 1, 1, tzinfo=dt.UTC)


def iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def agent_entry(t: dt.datetime, manager: str = "gpuhealth-agent", operation: str = "Update") -> dict[str, Any]:
    """A managedFields entry as the API server writes it for the agent's spec merge patches."""
    spec: dict[str, Any] = {".": {}, "f:heartbeatTime": {}, "f:nodeName": {}, "f:devices": {}}
    return {
        "manager": manager,
        "operation": operation,
        "apiVersion": "gpuhealth.dev/v1alpha1",
        "time": iso(t),
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": spec},
    }


def body(gen: int, heartbeat: dt.datetime | None, uid: str = "u1", fields: list[Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": "n"}
    if heartbeat is not None:
        spec["heartbeatTime"] = heartbeat.isoformat().replace("+00:00", "Z")
    meta: dict[str, Any] = {"name": "n", "uid": uid, "generation": gen}
    if fields is not None:
        meta["managedFields"] = fields
    return {"metadata": meta, "spec": spec}


def obs(prior: Seen | None, b: dict[str, Any], now: dt.datetime, live: bool) -> tuple[Seen | None, Skew | None]:
    """What was seen, and the skew of that write."""
    seen = observe(prior, b, now, live)
    return seen, (seen.skew if seen is not None else None)


def test_a_clock_far_ahead_counts_from_when_the_write_was_seen() -> None:
    ahead = T0 + dt.timedelta(hours=1)
    seen, skew = obs(None, body(1, ahead), T0, live=True)
    assert seen is not None and heard_at(seen, ahead) == T0
    assert skew is not None and skew.seconds == 3600 and "ahead of" in skew.describe()


def test_a_clock_behind_is_not_silence_while_the_agent_writes() -> None:
    behind = T0 - dt.timedelta(minutes=30)
    seen, skew = obs(None, body(1, behind), T0, live=True)
    assert seen is not None and heard_at(seen, behind) == T0
    assert skew is not None and skew.seconds < 0 and "behind" in skew.describe()


def test_ordinary_latency_is_not_skew() -> None:
    _, skew = obs(None, body(1, T0 - dt.timedelta(seconds=SKEW_TOLERANCE_S - 1)), T0, live=True)
    assert skew is None


def test_status_writes_and_relists_are_no_sign_of_life() -> None:
    seen, _ = obs(None, body(4, T0), T0, live=True)
    later = T0 + dt.timedelta(minutes=10)
    again, skew = obs(seen, body(4, T0), later, live=True)  # same generation: the operator's own write
    assert again == seen and skew is None
    assert heard_at(again, T0) == T0


def test_a_new_spec_write_is_seen_now() -> None:
    seen, _ = obs(None, body(4, T0), T0, live=True)
    later = T0 + dt.timedelta(seconds=30)
    newer, _ = obs(seen, body(5, later), later, live=True)
    assert newer is not None and newer.at == later


def test_a_write_the_watch_brings_late_counts_from_the_servers_time_of_it() -> None:
    # Made at 12:00:00 by the API server's clock (whole seconds), brought 9 s later by a watch that
    # was behind: heard at the end of that second at the latest, not now; its skew measured then too.
    late = T0 + dt.timedelta(seconds=9)
    seen, skew = obs(None, body(2, T0 + dt.timedelta(seconds=130), fields=[agent_entry(T0)]), late, live=True)
    assert seen is not None and seen.at == T0 + dt.timedelta(seconds=1)
    assert skew is not None and skew.seconds == 129
    # Brought at once (within the seconds' rounding and a little clock difference): now, as before.
    prompt = T0 + dt.timedelta(seconds=2.9)
    seen, _ = obs(None, body(2, T0, fields=[agent_entry(T0)]), prompt, live=True)
    assert seen is not None and seen.at == prompt
    # The server's clock ahead of the operator's, or no server time at all: now.
    seen, _ = obs(None, body(2, T0, fields=[agent_entry(T0 + dt.timedelta(seconds=30))]), T0, live=True)
    assert seen is not None and seen.at == T0
    seen, _ = obs(None, body(2, T0), late, live=True)
    assert seen is not None and seen.at == late
    # A slim cached copy keeps the server's time, so a relist fed as events counts the same.
    seen, _ = obs(None, slim_report(body(2, T0, fields=[agent_entry(T0)])), late, live=True)
    assert seen is not None and seen.at == T0 + dt.timedelta(seconds=1)


def test_a_recreated_report_is_a_new_object_even_at_the_same_generation() -> None:
    seen, _ = obs(None, body(1, T0, uid="a"), T0, live=True)
    later = T0 + dt.timedelta(seconds=30)
    newer, _ = obs(seen, body(1, later, uid="b"), later, live=True)
    assert newer is not None and newer.at == later


def test_skew_is_announced_once_per_episode() -> None:
    """The episode lives in the report's status: announced by the write that starts it, kept while it
    lasts, ended by a write within the tolerance, and a new one announced again."""
    ahead = dt.timedelta(hours=1)
    seen = observe(None, body(1, T0 + ahead), T0, live=True)
    record, first = skew_episode(seen, None, T0)
    assert first is not None and first.seconds == 3600
    assert record == {"offsetSeconds": 3600, "since": iso(T0)}
    t1 = T0 + dt.timedelta(seconds=30)
    seen = observe(seen, body(2, t1 + ahead + dt.timedelta(seconds=2)), t1, live=True)
    again, second = skew_episode(seen, record, t1)
    assert second is None and again == record  # a few seconds' drift: no write, no Event
    t2 = t1 + dt.timedelta(seconds=30)
    seen = observe(seen, body(3, t2), t2, live=True)  # clock fixed
    assert skew_episode(seen, record, t2) == (None, None)
    t3 = t2 + dt.timedelta(seconds=30)
    seen = observe(seen, body(4, t3 + ahead), t3, live=True)  # and wrong again
    record, third = skew_episode(seen, None, t3)
    assert third is not None and record is not None and record["since"] == iso(t3)


def test_an_episode_moving_further_updates_the_offset_quietly() -> None:
    seen = observe(None, body(1, T0 + dt.timedelta(hours=2)), T0, live=True)
    record, announce = skew_episode(seen, {"offsetSeconds": 600, "since": iso(T0)}, T0)
    assert announce is None and record == {"offsetSeconds": 7200, "since": iso(T0)}


def test_without_a_record_of_the_agents_writes_the_episode_stands() -> None:
    recorded = {"offsetSeconds": 600, "since": iso(T0)}
    assert skew_episode(None, recorded, T0) == (recorded, None)
    assert skew_episode(None, None, T0) == (None, None)


def test_a_skew_listed_at_start_up_is_announced_unless_the_status_holds_it() -> None:
    """A skew present before the operator started: its first pass announces it; a restarted operator
    finds the episode in the status and does not."""
    written_ = T0 - dt.timedelta(seconds=20)
    ten = dt.timedelta(minutes=10)
    listed = observe(None, body(1, written_ + ten, fields=[agent_entry(written_)]), T0, live=False)
    record, announce = skew_episode(listed, None, T0)
    assert announce is not None and announce.seconds == 600 and record is not None
    assert skew_episode(listed, record, T0 + dt.timedelta(minutes=1)) == (record, None)


def test_at_start_up_a_past_heartbeat_is_taken_and_a_future_one_clamped() -> None:
    # Without the server's time of the write (no managedFields): the heartbeat, never in the future.
    old = T0 - dt.timedelta(minutes=5)
    seen, skew = obs(None, body(1, old), T0, live=False)
    assert seen is not None and seen.at == old and skew is None
    latency = dt.timedelta(seconds=SKEW_TOLERANCE_S - 1)
    seen, skew = obs(None, body(1, T0 + latency), T0, live=False)
    assert seen is not None and seen.at == T0 and skew is None


def test_at_start_up_a_heartbeat_implausibly_far_ahead_is_no_sign_of_life() -> None:
    # A broken clock (2099) and no server time: not "now" (that made a silent node Healthy on every
    # restart), but never heard, so the node is Unknown until the agent is seen writing.
    for ahead in (dt.timedelta(seconds=SKEW_TOLERANCE_S + 1), dt.timedelta(days=1), YEAR_2099 - T0):
        seen, skew = obs(None, body(1, T0 + ahead), T0, live=False)
        assert seen is not None and seen.at is None and skew is not None and skew.seconds > SKEW_TOLERANCE_S
        assert heard_at(seen, T0 + ahead) is None
    # The agent is then seen writing: heard from at once, by the operator's clock.
    listed, _ = obs(None, body(1, YEAR_2099), T0, live=False)
    later = T0 + dt.timedelta(seconds=5)
    newer, _ = obs(listed, body(2, YEAR_2099), later, live=True)
    assert newer is not None and newer.at == later


def test_at_start_up_the_servers_time_of_the_write_counts_not_the_heartbeat() -> None:
    # A clock far ahead, last write ten minutes ago by the API server's clock: silent since then.
    written = T0 - dt.timedelta(minutes=10)
    seen, skew = obs(None, body(1, YEAR_2099, fields=[agent_entry(written)]), T0, live=False)
    assert seen is not None and seen.at == written and skew is not None  # the skew of that write
    # A clock an hour behind, last write five seconds ago: a live agent, not a silent one.
    recent = T0 - dt.timedelta(seconds=5)
    seen, _ = obs(None, body(1, T0 - dt.timedelta(hours=1), fields=[agent_entry(recent)]), T0, live=False)
    assert seen is not None and seen.at == recent
    # The API server's clock a little ahead of the operator's: clamped, never in the future.
    seen, _ = obs(None, body(1, T0, fields=[agent_entry(T0 + dt.timedelta(seconds=3))]), T0, live=False)
    assert seen is not None and seen.at == T0


def test_the_servers_time_is_that_of_the_entry_that_owns_the_heartbeat() -> None:
    agent = T0 - dt.timedelta(minutes=3)
    fields = [
        # The operator's stub (spec.nodeName only) and its status writes: no heartbeat, never a sign of life.
        {
            "manager": "gpuhealth-operator",
            "operation": "Update",
            "time": iso(T0),
            "fieldsV1": {"f:spec": {"f:nodeName": {}}},
        },
        {
            "manager": "gpuhealth-operator",
            "operation": "Update",
            "subresource": "status",
            "time": iso(T0),
            "fieldsV1": {"f:status": {"f:state": {}}},
        },
        # Someone relabelling the report: metadata only.
        {"manager": "kubectl-label", "operation": "Update", "time": iso(T0), "fieldsV1": {"f:metadata": {}}},
        agent_entry(agent),
        # An older owner of the heartbeat (under another manager name) does not win over the latest.
        agent_entry(agent - dt.timedelta(hours=1), manager="old-agent", operation="Apply"),
        "not an entry",
    ]
    meta = body(1, YEAR_2099, fields=fields)["metadata"]
    assert written_at(meta, "heartbeatTime") == agent
    assert written(meta, "heartbeatTime") == {WRITTEN_AT: iso(agent)}
    assert written_at({**meta, "managedFields": fields[:3]}, "heartbeatTime") is None
    assert written_at({"name": "n"}, "heartbeatTime") is None and written({}, "heartbeatTime") == {}


def test_a_slim_cached_report_keeps_only_the_servers_time() -> None:
    written_ = T0 - dt.timedelta(minutes=10)
    full = body(1, YEAR_2099, fields=[agent_entry(written_), {"manager": "big", "fieldsV1": {"f:spec": {}}}])
    slim = slim_report(full)
    assert "managedFields" not in slim["metadata"] and slim["metadata"][WRITTEN_AT] == iso(written_)
    assert slim_report(slim)["metadata"][WRITTEN_AT] == iso(written_)  # re-slimmed (a write's answer)
    assert observe(None, slim, T0, live=False) == observe(None, full, T0, live=False)
    seen, _ = obs(None, slim, T0, live=False)
    assert seen is not None and seen.at == written_


def test_a_listed_skew_is_measured_against_the_servers_time_of_the_write() -> None:
    ahead = dt.timedelta(hours=1)
    written_ = T0 - dt.timedelta(seconds=20)
    listed, skew = obs(None, body(1, written_ + ahead, fields=[agent_entry(written_)]), T0, live=False)
    assert listed is not None and listed.skewed and skew is not None and skew.seconds == 3600
    # A clock that was right at the last write, however long ago: no skew.
    listed, _ = obs(None, body(1, written_, fields=[agent_entry(written_)]), T0 + ahead, live=False)
    assert listed is not None and not listed.skewed


def test_a_sign_of_life_with_no_time_is_older_than_any_other() -> None:
    undated = Seen(("u1", 1), None, Skew(3600.0, YEAR_2099))
    dated = Seen(("l1", "x"), T0 - dt.timedelta(days=365))
    assert latest(undated, dated) is dated and latest(dated, undated) is dated
    assert latest(undated, None) is undated and heard_at(latest(undated, None), YEAR_2099) is None


def test_no_heartbeat_is_no_sign_of_life() -> None:
    # The operator's own stub for a node whose agent never reported has a generation but no heartbeat.
    seen, skew = obs(Seen(("u1", 1), T0), body(2, None), T0, live=True)
    assert seen is None and skew is None
    assert heard_at(seen, None) is None


def test_without_a_generation_the_agents_heartbeat_is_used() -> None:
    b = body(1, T0)
    del b["metadata"]["generation"]
    seen, _ = obs(None, b, T0 + dt.timedelta(minutes=1), live=True)
    assert seen is None and heard_at(seen, T0) == T0
