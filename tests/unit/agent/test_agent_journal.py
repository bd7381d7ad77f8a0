"""The local XID journal: durable appends, this boot only, bounded, torn lines, replay into the report."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path

import pytest

from gpuhealth.agent.journal import JOURNAL_FILE, XidJournal, decode, encode, not_yet_known
from gpuhealth.agent.main import resolve_state_dir
from gpuhealth.agent.metrics import AgentMetrics
from gpuhealth.agent.model import XidEvent
from gpuhealth.agent.report import rfc3339
from tests.unit.agent.agent_testlib import BOOT_TIME, AgentFactory, FakeTransport, Scenario, wait_for


def xid(code: int, minutes: float, gpu: int = 3, source: str = "nvml") -> XidEvent:
    return XidEvent(
        xid=code,
        time=BOOT_TIME + timedelta(minutes=minutes, microseconds=123),
        source=source,  # type: ignore[arg-type]
        gpu=gpu,
        uuid=f"GPU-{gpu}",
    )


def errors(metrics: AgentMetrics, op: str) -> float:
    value = metrics.registry.get_sample_value("gpuhealth_agent_journal_errors_total", {"op": op})
    return value or 0.0


def lines(state: Path) -> list[str]:
    return (state / JOURNAL_FILE).read_text().splitlines()


def test_appended_events_come_back_after_a_restart(tmp_path: Path) -> None:
    first = XidJournal(tmp_path, BOOT_TIME, limit=64)
    assert first.load() == []
    events = [xid(79, 1), xid(48, 2, gpu=1), xid(94, 3, source="dcgm")]
    for e in events:
        first.append(e, baseline=e.source == "dcgm")
    entry = json.loads(lines(tmp_path)[0])
    assert entry == {
        "xid": 79,
        "time": rfc3339(events[0].time),
        "source": "nvml",
        "gpu": 3,
        "uuid": "GPU-3",
        "baseline": False,
        "bootTime": rfc3339(BOOT_TIME),
    }
    again = XidJournal(tmp_path, BOOT_TIME, limit=64).load()
    assert again == [(events[0], False), (events[1], False), (events[2], True)]


def test_entries_from_an_earlier_boot_are_dropped_and_the_file_rewritten(tmp_path: Path) -> None:
    old_boot = BOOT_TIME - timedelta(days=1)
    old = XidJournal(tmp_path, old_boot, limit=64)
    old.load()
    old.append(XidEvent(xid=79, time=old_boot + timedelta(hours=1), source="nvml", gpu=0))
    # A line that claims this boot but predates it cannot be from this boot either.
    with open(tmp_path / JOURNAL_FILE, "a") as f:
        f.write(encode(xid(31, -5), False, BOOT_TIME))
    current = XidJournal(tmp_path, BOOT_TIME, limit=64)
    assert current.load() == []
    assert lines(tmp_path) == []
    current.append(xid(48, 1))
    assert [decode(line) for line in lines(tmp_path)] == [(xid(48, 1), False, BOOT_TIME)]


def test_a_torn_last_line_and_garbage_are_skipped_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    metrics = AgentMetrics()
    j = XidJournal(tmp_path, BOOT_TIME, limit=64, metrics=metrics)
    j.load()
    j.append(xid(79, 1))
    j.append(xid(48, 2))
    whole = encode(xid(94, 3), False, BOOT_TIME)
    with open(tmp_path / JOURNAL_FILE, "a") as f:
        f.write("not json at all\n")
        f.write('{"xid": "79", "time": "yesterday"}\n')
        f.write(whole[: len(whole) // 2])  # killed mid-append: no newline, half an object
    restarted = XidJournal(tmp_path, BOOT_TIME, limit=64, metrics=metrics)
    with caplog.at_level(logging.WARNING):
        kept = restarted.load()
    assert [e.xid for e, _ in kept] == [79, 48]
    assert errors(metrics, "read") == 3
    assert "skipped 3 torn or invalid line(s)" in caplog.text
    # The rewrite dropped the torn tail, so the next append starts on a line of its own.
    restarted.append(xid(94, 3))
    assert [decode(line) is not None for line in lines(tmp_path)] == [True, True, True]


def test_compacted_to_the_report_limit_when_it_grows_past_twice_that(tmp_path: Path) -> None:
    j = XidJournal(tmp_path, BOOT_TIME, limit=3)
    j.load()
    for minute in range(6):
        j.append(xid(79, minute))
    assert len(lines(tmp_path)) == 6  # at twice the limit: not yet
    j.append(xid(79, 6))
    assert len(lines(tmp_path)) == 3
    assert not (tmp_path / (JOURNAL_FILE + ".tmp")).exists()
    assert [e.time for e, _ in XidJournal(tmp_path, BOOT_TIME, limit=3).load()] == [xid(79, m).time for m in (4, 5, 6)]
    # ... and at start, to the limit it starts with.
    assert len(XidJournal(tmp_path, BOOT_TIME, limit=2).load()) == 2
    assert len(lines(tmp_path)) == 2


def test_an_unwritable_state_dir_is_a_warning_and_a_metric_not_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = AgentMetrics()
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state dir should be")
    j = XidJournal(blocker / "state", BOOT_TIME, limit=64, metrics=metrics)
    with caplog.at_level(logging.WARNING):
        assert j.load() == []
    assert not j.enabled and errors(metrics, "read") == 1
    assert "running without it" in caplog.text
    j.append(xid(79, 1))  # disabled: nothing happens, nothing raises

    # A journal that worked at start and then cannot append: counted, the agent goes on.
    state = tmp_path / "state"
    broken = XidJournal(state, BOOT_TIME, limit=64, metrics=metrics)
    broken.load()
    (state / JOURNAL_FILE).unlink()
    (state / JOURNAL_FILE).mkdir()
    broken.append(xid(79, 1))
    assert errors(metrics, "write") == 1


def test_only_events_the_report_lacks_are_replayed() -> None:
    published = xid(79, 1)
    same_without_uuid = XidEvent(xid=79, time=published.time, source="nvml", gpu=3)
    later = xid(79, 2)
    other_gpu = xid(79, 1, gpu=4)
    entries = [(same_without_uuid, False), (later, False), (other_gpu, False)]
    assert not_yet_known(entries, (published,)) == [(later, False), (other_gpu, False)]


def test_state_dir_flag_default_only_where_the_directory_exists(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert resolve_state_dir("/given", default=str(tmp_path)) == "/given"
    assert resolve_state_dir(None, default=str(tmp_path)) == str(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert resolve_state_dir(None, default=str(tmp_path / "missing")) is None
    assert "running without the XID journal" in caplog.text


class Unavailable(Exception):
    status = 503


def test_xid_received_but_never_published_reaches_the_report_after_a_restart(
    make_agent: AgentFactory, scenario: Scenario, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    down = FakeTransport()
    down.fail_with = Unavailable("API server down")  # retried forever: nothing is ever published
    crashed, _ = make_agent(transport=down, state_dir=str(state))
    scenario.write("xid 1 gpu 6 code 79")
    wait_for(lambda: (state / JOURNAL_FILE).exists() and lines(state))
    crashed.stop(timeout_s=5)  # stands in for the SIGKILL: the event was only in memory and on disk
    assert not down.writes()

    _restarted, api = make_agent(state_dir=str(state))
    wait_for(lambda: api.spec.get("xidEvents"))
    (event,) = api.spec["xidEvents"]
    assert (event["xid"], event["gpu"], event["source"]) == (79, 6, "nvml")
    # The restarted agent kept the entry (same boot) in its rewritten journal.
    assert [d[0].xid for d in map(decode, lines(state)) if d is not None] == [79]


def test_replayed_events_are_not_counted_twice_against_the_restored_report(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    published, unpublished = xid(79, 1), xid(48, 2)
    j = XidJournal(tmp_path, BOOT_TIME, limit=64)
    j.load()
    j.append(published)
    j.append(unpublished)
    existing = {
        "apiVersion": "gpuhealth.dev/v1alpha1",
        "kind": "GPUNodeHealth",
        "metadata": {"name": "gpu-node-1"},
        "spec": {
            "nodeName": "gpu-node-1",
            "xidEvents": [{"xid": 79, "gpu": 3, "uuid": "GPU-3", "time": rfc3339(published.time), "source": "nvml"}],
        },
    }
    _agent, api = make_agent(transport=FakeTransport(existing), state_dir=str(tmp_path))
    wait_for(lambda: len(api.spec.get("xidEvents", [])) >= 2)
    assert [(e["xid"], e["time"]) for e in api.spec["xidEvents"]] == [
        (79, rfc3339(published.time)),
        (48, rfc3339(unpublished.time)),
    ]
