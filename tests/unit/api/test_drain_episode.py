"""The one drain-episode rule (``api/status.py`` ``drain_is_current``), for both kinds of drain record:
the node's ``status.drain`` against its ``Record`` and a GPU's ``status.deviceDrains`` entry against its
``DeviceRecord``. A drain of an earlier episode must never count as this one's (it would skip a drain)."""

from __future__ import annotations

import datetime as dt

import pytest

from gpuhealth.api.devices import DeviceRecord, DeviceState
from gpuhealth.api.names import State
from gpuhealth.api.status import DrainRecord, Episode, Record, drain_done, drain_is_current, read_device_drains
from gpuhealth.api.timeutil import format_time

SINCE = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def _episodes(since: dt.datetime | None) -> list[Episode]:
    return [
        Record(state=State.DRAINING, since=since),
        DeviceRecord(index=0, state=DeviceState.DRAINING, since=since),
    ]


@pytest.mark.parametrize(
    ("started", "current"),
    [
        (SINCE, True),  # started as the episode began
        (SINCE + dt.timedelta(minutes=5), True),
        (SINCE - dt.timedelta(seconds=1), True),  # a second's slack: times are written to the second
        (SINCE - dt.timedelta(seconds=2), False),  # an earlier episode's drain
        (SINCE - dt.timedelta(days=1), False),
    ],
)
def test_a_drain_belongs_to_the_episode_it_started_in_for_nodes_and_gpus(started: dt.datetime, current: bool) -> None:
    drain = DrainRecord(phase="Completed", startedAt=format_time(started))
    assert [drain_is_current(drain, e) for e in _episodes(SINCE)] == [current, current]


def test_an_unknown_time_counts_as_current_for_both_kinds() -> None:
    assert [drain_is_current(DrainRecord(phase="Running"), e) for e in _episodes(SINCE)] == [True, True]
    old = DrainRecord(phase="Running", startedAt=format_time(SINCE - dt.timedelta(days=1)))
    assert [drain_is_current(old, e) for e in _episodes(None)] == [True, True]


def test_the_nodes_drain_is_done_only_when_completed_started_and_current() -> None:
    rec = Record(state=State.DRAINING, since=SINCE)
    assert drain_done(DrainRecord(phase="Completed", startedAt=format_time(SINCE)), rec)
    assert not drain_done(DrainRecord(phase="Running", startedAt=format_time(SINCE)), rec)
    assert not drain_done(DrainRecord(phase="Completed"), rec)
    assert not drain_done(DrainRecord(phase="Completed", startedAt=format_time(SINCE - dt.timedelta(hours=1))), rec)


def test_device_drains_are_read_by_gpu_index_as_copies() -> None:
    entry = {"phase": "Running", "startedAt": format_time(SINCE)}
    status = {"deviceDrains": {"3": entry, "x": {"phase": "Running"}, "4": "garbage"}}
    drains = read_device_drains(status)
    assert drains == {3: entry}
    drains[3]["phase"] = "Completed"
    assert entry["phase"] == "Running"
    assert read_device_drains(None) == {} and read_device_drains({"deviceDrains": []}) == {}
