"""The pure rules: spec rendering, change detection, merge patches, XID history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuhealth.agent.merge_patch import apply_merge_patch, merge_patch
from gpuhealth.agent.model import (
    DeviceFacts,
    EccCounts,
    NvmlStatus,
    RemappedRows,
    Snapshot,
    Temperature,
    XidEvent,
)
from gpuhealth.agent.report import (
    AgentInfo,
    ReportBuilder,
    XidHistory,
    facts_changed,
    rfc3339,
    temperature_changed,
)
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.timeutil import parse_time

T0 = datetime(2026, 11, 30, 1, 2, 3, 123456, tzinfo=UTC)
BOOT = datetime(2026, 11, 29, tzinfo=UTC)


def gpu(index: int = 0, **changes: Any) -> DeviceFacts:
    base = DeviceFacts(
        index=index,
        uuid=f"GPU-{index}",
        pci_bus_id=f"00000000:{index:02X}:00.0",
        model="NVIDIA H100 80GB HBM3",
        mig_mode="Disabled",
        ecc_mode="Enabled",
        ecc=EccCounts(0, 0, 0, 0),
        remapped_rows=RemappedRows(0, 0, False, False),
        temperature=Temperature(40, 87, 92),
        clock_event_reasons=0x1,
        power_w=100.0,
        recovery_action=RecoveryAction("None"),
    )
    return base.replace(**changes)


def snap(*devices: DeviceFacts, at: datetime = T0, available: bool = True) -> Snapshot:
    return Snapshot(time=at, nvml=NvmlStatus(available=available, driver_version="550.90.07"), devices=devices)


def test_rfc3339_forms() -> None:
    assert rfc3339(T0) == "2026-11-30T01:02:03.123456Z"
    assert rfc3339(T0.replace(microsecond=0)) == "2026-11-30T01:02:03Z"
    assert rfc3339(T0.astimezone(timezone(timedelta(hours=2)))) == "2026-11-30T01:02:03.123456Z"
    assert parse_time("2026-11-30T01:02:03.123456Z") == T0
    assert parse_time("garbage") is None and parse_time(None) is None


def test_temperature_dead_band_and_thresholds() -> None:
    assert not temperature_changed(40, 44, 5, (87, 92))
    assert temperature_changed(40, 45, 5, (87, 92))
    assert temperature_changed(85, 87, 5, (87, 92))  # crossed slowdown by 2 degrees
    assert temperature_changed(87, 86, 5, (87, 92))  # and back
    assert temperature_changed(None, 40, 5, ())


def test_facts_changed_ignores_noise() -> None:
    base = snap(gpu(0))
    assert facts_changed(None, base)
    assert not facts_changed(base, snap(gpu(0, power_w=650.0)))
    assert not facts_changed(base, snap(gpu(0, temperature=Temperature(43, 87, 92))))
    assert not facts_changed(base, snap(gpu(0, clock_event_reasons=0x1 | 0x4 | 0x10)))  # idle/power cap/boost
    assert not facts_changed(base, snap(gpu(0), at=T0 + timedelta(seconds=30)))


def test_facts_changed_sees_facts() -> None:
    base = snap(gpu(0))
    assert facts_changed(base, snap(gpu(0, temperature=Temperature(46, 87, 92))))
    assert facts_changed(base, snap(gpu(0, clock_event_reasons=0x40)))
    assert facts_changed(base, snap(gpu(0, ecc=EccCounts(1, 0, 0, 0))))
    assert facts_changed(base, snap(gpu(0, remapped_rows=RemappedRows(0, 0, True, False))))
    assert facts_changed(base, snap(gpu(0, lost=True)))
    assert facts_changed(base, snap(gpu(0, unsupported=("powerW",))))
    assert facts_changed(base, snap(gpu(0), gpu(1)))
    assert facts_changed(base, snap(available=False))


def test_device_rendering_omits_unknowns() -> None:
    builder = ReportBuilder("node-a", AgentInfo("1.2.3", ("nvml",), BOOT))
    spec = builder.render(snap(gpu(0, ecc=None, power_w=None, unsupported=("ecc", "ecc"))), T0)
    (dev,) = spec["devices"]
    assert "ecc" not in dev and "powerW" not in dev
    assert dev["unsupported"] == ["ecc"]
    assert dev["temperature"] == {"currentC": 40, "slowdownC": 87, "shutdownC": 92}
    assert dev["clockEventsSince"] == rfc3339(T0)
    assert spec["nodeName"] == "node-a"
    assert spec["agent"] == {"version": "1.2.3", "sources": ["nvml"], "bootTime": "2026-11-29T00:00:00Z"}
    assert spec["nvml"] == {"available": True, "driverVersion": "550.90.07"}
    assert spec["xidEvents"] == []


def test_unavailable_nvml_has_no_devices() -> None:
    builder = ReportBuilder("node-a", AgentInfo("1", ("nvml",), BOOT))
    status = NvmlStatus(available=False, error="cannot load NVML library")
    spec = builder.render(Snapshot(time=T0, nvml=status), T0)
    assert spec["nvml"] == {"available": False, "error": "cannot load NVML library"}
    assert spec["devices"] == []


def test_observed_time_and_clock_since_track_changes_only() -> None:
    builder = ReportBuilder("node-a", AgentInfo("1", ("nvml",), BOOT))
    first = snap(gpu(0))
    builder.commit(first, builder.render(first, T0))
    later = T0 + timedelta(minutes=5)
    same = snap(gpu(0, power_w=300.0), at=later)
    assert not builder.needs_write(same)
    spec = builder.render(same, later)
    assert spec["observedTime"] == rfc3339(T0)
    assert spec["devices"][0]["clockEventsSince"] == rfc3339(T0)
    hot = snap(gpu(0, clock_event_reasons=0x40), at=later)
    assert builder.needs_write(hot)
    spec = builder.render(hot, later)
    assert spec["observedTime"] == rfc3339(later)
    assert spec["devices"][0]["clockEventsSince"] == rfc3339(later)


def test_restore_keeps_xids_of_this_boot_and_clock_since() -> None:
    builder = ReportBuilder("node-a", AgentInfo("1", ("nvml",), BOOT))
    since = BOOT + timedelta(hours=1)
    existing = {
        "xidEvents": [
            {"xid": 79, "gpu": 3, "time": rfc3339(BOOT - timedelta(hours=2)), "source": "nvml"},
            {
                "xid": 48,
                "gpu": 1,
                "uuid": "GPU-1",
                "time": rfc3339(BOOT + timedelta(hours=2)),
                "source": "nvml",
            },
            {"xid": "bad", "time": "nope"},
        ],
        "devices": [{"index": 0, "uuid": "GPU-0", "clockEventReasons": 0x41, "clockEventsSince": rfc3339(since)}],
    }
    assert builder.restore(existing) == 1
    assert [(e.xid, e.gpu) for e in builder.history.events] == [(48, 1)]
    spec = builder.render(snap(gpu(0, clock_event_reasons=0x40)), T0)
    assert spec["devices"][0]["clockEventsSince"] == rfc3339(since)  # same significant bits
    assert [x["xid"] for x in spec["xidEvents"]] == [48]


def test_restore_without_boot_time_keeps_nothing() -> None:
    builder = ReportBuilder("node-a", AgentInfo("1", ("nvml",), None))
    assert builder.restore({"xidEvents": [{"xid": 79, "time": rfc3339(T0)}]}) == 0


def test_xid_history_is_bounded_and_ordered() -> None:
    history = XidHistory(limit=64)
    for i in range(100):
        assert history.add(XidEvent(xid=13, time=T0 + timedelta(seconds=100 - i), source="nvml", gpu=0))
    assert len(history) == 64
    times = [e.time for e in history.events]
    assert times == sorted(times) and times[-1] == T0 + timedelta(seconds=100)
    assert not history.add(XidEvent(xid=0, time=T0, source="nvml"))
    assert not history.add(XidEvent(xid=5000, time=T0, source="nvml"))


def test_dcgm_xid_deduplicated_against_nvml() -> None:
    history = XidHistory(dcgm_dedupe_s=120)
    assert history.add(XidEvent(xid=79, time=T0, source="nvml", gpu=2, uuid="GPU-2"))
    assert not history.add(XidEvent(xid=79, time=T0 + timedelta(seconds=30), source="dcgm", gpu=2, uuid="GPU-2"))
    assert history.add(XidEvent(xid=79, time=T0 + timedelta(seconds=30), source="dcgm", gpu=3))
    assert history.add(XidEvent(xid=79, time=T0 + timedelta(hours=1), source="dcgm", gpu=2))
    # A baseline (first gauge value seen) is dropped if that XID on that GPU is known at all.
    assert not history.add(XidEvent(xid=79, time=T0 + timedelta(hours=5), source="dcgm", gpu=2), baseline=True)
    assert history.add(XidEvent(xid=48, time=T0 + timedelta(hours=5), source="dcgm", gpu=2), baseline=True)


def test_merge_patch_nulls_removed_keys_and_replaces_lists() -> None:
    old = {"nvml": {"available": False, "error": "x"}, "devices": [{"index": 0}], "keep": 1}
    new = {
        "nvml": {"available": True, "driverVersion": "550"},
        "devices": [{"index": 0, "lost": True}],
        "keep": 1,
    }
    assert merge_patch(old, new) == {
        "nvml": {"available": True, "error": None, "driverVersion": "550"},
        "devices": [{"index": 0, "lost": True}],
    }
    assert merge_patch(new, new) == {}


# Reports never contain null (unknown values are omitted), so neither do these documents.
json_scalars = st.booleans() | st.integers() | st.text(max_size=5)
keys = st.text(max_size=3)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(keys, children, max_size=3),
    max_leaves=10,
)
json_objects = st.dictionaries(keys, json_values, max_size=5)


@settings(deadline=None)  # no per-example deadline: CI machines may be busy
@given(json_objects, json_objects)
@example({"a": 0}, {"a": False})
@example({"a": [1]}, {"a": [True]})
def test_merge_patch_round_trips(old: dict[str, Any], new: dict[str, Any]) -> None:
    assert apply_merge_patch(old, merge_patch(old, new)) == new
