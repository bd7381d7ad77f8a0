"""MIG through the real pynvml on the fake NVML: listing, profiles, XID attribution, change rules."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuhealth.agent.journal import decode, encode
from gpuhealth.agent.model import NvmlStatus, Snapshot, XidEvent
from gpuhealth.agent.nvml_mig import mig_profile
from gpuhealth.agent.nvml_source import NvmlSource
from gpuhealth.agent.report import AgentInfo, ReportBuilder, device_spec, facts_changed, xid_spec
from gpuhealth.api.report import MigDevice
from tests.unit.agent.agent_testlib import BOOT_TIME, AgentFactory, Scenario, device, wait_for

LAYOUT = (
    "gpu 3 mig 1",
    "gpu 3 mig_device 0 1 0 3g.40gb",
    "gpu 3 mig_device 2 2 0 2g.20gb MIG-5e0a1b2c-0000-4000-8000-000000000002",
    "gpu 3 mig_device 3 2 1 1c.2g.20gb",
)


@pytest.fixture
def source(fake_nvml_lib: Path, scenario: Scenario) -> Iterator[NvmlSource]:
    src = NvmlSource(str(fake_nvml_lib))
    yield src
    src.close()


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "3g.40gb"),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "1g.5gb"),
        ("NVIDIA H100 80GB HBM3 MIG 1c.2g.20gb", "1c.2g.20gb"),
        ("NVIDIA H200 MIG 1g.18gb+me", "1g.18gb+me"),
        ("NVIDIA H100 80GB HBM3", None),
        ("NVIDIA H100 MIG", None),
        ("NVIDIA H100 MIG not-a-profile", None),
        ("", None),
    ],
)
def test_profile_from_the_mig_devices_name(name: str, profile: str | None) -> None:
    assert mig_profile(name) == profile


def test_lists_mig_devices_through_pynvml(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write(*LAYOUT)
    d = source.sample().devices[3]
    assert d.mig_mode == "Enabled"
    assert [m.index for m in d.mig_devices] == [0, 2, 3]  # slot 1 is empty (NotFound): skipped
    first, second, third = d.mig_devices
    assert first.uuid is not None and first.uuid.startswith("MIG-")
    assert (first.gpu_instance, first.compute_instance, first.profile) == (1, 0, "3g.40gb")
    assert second == MigDevice(2, "MIG-5e0a1b2c-0000-4000-8000-000000000002", 2, 0, "2g.20gb")
    assert (third.gpu_instance, third.compute_instance, third.profile) == (2, 1, "1c.2g.20gb")
    assert len({m.uuid for m in d.mig_devices}) == 3
    # Deterministic: the same scenario gives the same UUIDs in a new session.
    source.close()
    assert source.sample().devices[3].mig_devices == d.mig_devices
    assert all(other.mig_devices == () for i, other in enumerate(source.sample().devices) if i != 3)


def test_no_mig_devices_unless_mig_mode_is_enabled(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write(*LAYOUT[1:])  # instances configured, MIG mode off
    d = source.sample().devices[3]
    assert d.mig_mode == "Disabled" and d.mig_devices == ()
    scenario.write("gpu 3 mig 1")  # enabled, no instances yet
    d = source.sample().devices[3]
    assert d.mig_mode == "Enabled" and d.mig_devices == () and "migDevices" not in d.unsupported
    assert "migDevices" not in device_spec(d, None)


def test_mig_listing_not_supported_is_recorded(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write(*LAYOUT, "missing nvmlDeviceGetMaxMigDeviceCount")
    d = source.sample().devices[3]
    assert d.mig_devices == () and "migDevices" in d.unsupported and not d.lost


def test_mig_devices_of_a_lost_gpu_are_its_last_known(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write(*LAYOUT)
    before = source.sample().devices[3].mig_devices
    scenario.add("gpu 3 lost 1")
    d = source.sample().devices[3]
    assert d.lost and d.mig_devices == before


def test_report_entry_and_layout_change_is_a_fact_change(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write(*LAYOUT)
    d = source.sample().devices[3]
    spec = device_spec(d, None)
    assert spec["migDevices"] == [
        {"index": 0, "uuid": d.mig_devices[0].uuid, "gpuInstanceId": 1, "computeInstanceId": 0, "profile": "3g.40gb"},
        {
            "index": 2,
            "uuid": "MIG-5e0a1b2c-0000-4000-8000-000000000002",
            "gpuInstanceId": 2,
            "computeInstanceId": 0,
            "profile": "2g.20gb",
        },
        {
            "index": 3,
            "uuid": d.mig_devices[2].uuid,
            "gpuInstanceId": 2,
            "computeInstanceId": 1,
            "profile": "1c.2g.20gb",
        },
    ]
    now = datetime(2026, 1, 2, tzinfo=UTC)
    snap = Snapshot(time=now, nvml=NvmlStatus(available=True), devices=(d,))
    assert not facts_changed(snap, replace(snap, time=now))
    scenario.add("gpu 3 mig_device 2 none")  # an instance destroyed
    changed = replace(snap, devices=(source.sample().devices[3],))
    assert facts_changed(snap, changed)
    unknown_profile = d.replace(mig_devices=(MigDevice(0),))
    assert device_spec(unknown_profile, None)["migDevices"] == [{"index": 0}]  # unknowns omitted


def test_xid_attributed_to_a_mig_instance_keeps_its_ids(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write(*LAYOUT)
    source.sample()
    source.wait_events(0.0)  # register
    scenario.add("xid 1 gpu 3 code 31 gi 2 ci 1", "xid 2 gpu 4 code 79")
    first = source.wait_events(2.0).xids[0]
    second = source.wait_events(2.0).xids[0]
    assert (first.xid, first.gpu, first.gpu_instance, first.compute_instance) == (31, 3, 2, 1)
    assert (second.xid, second.gpu, second.gpu_instance, second.compute_instance) == (79, 4, None, None)
    assert xid_spec(first)["gpuInstanceId"] == 2 and xid_spec(first)["computeInstanceId"] == 1
    assert "gpuInstanceId" not in xid_spec(second) and "computeInstanceId" not in xid_spec(second)


def test_journal_and_report_restore_round_trip_instance_ids() -> None:
    when = datetime(2026, 1, 1, 1, tzinfo=UTC)
    event = XidEvent(xid=31, time=when, source="nvml", gpu=3, uuid="GPU-x", gpu_instance=2, compute_instance=0)
    decoded = decode(encode(event, False, BOOT_TIME))
    assert decoded is not None and decoded[0] == event
    plain = replace(event, gpu_instance=None, compute_instance=None)
    line = encode(plain, False, BOOT_TIME)
    assert "InstanceId" not in line
    assert decode(line) is not None and decode(line)[0] == plain  # type: ignore[index]
    builder = ReportBuilder("n", AgentInfo("v", ("nvml",), BOOT_TIME))
    spec = {"xidEvents": [xid_spec(event), {**xid_spec(plain), "gpuInstanceId": "bad"}]}
    assert builder.restore(spec) == 2
    restored = builder.history.events
    assert (restored[0].gpu_instance, restored[0].compute_instance) == (2, 0)
    assert restored[1].gpu_instance is None  # a malformed ID read back is unknown, not a crash


def test_running_agent_publishes_mig_devices_and_instance_xids(make_agent: AgentFactory, scenario: Scenario) -> None:
    scenario.write(*LAYOUT)
    _agent, api = make_agent()
    wait_for(lambda: api.writes())
    assert [m["index"] for m in device(api.spec, 3)["migDevices"]] == [0, 2, 3]
    assert "migDevices" not in device(api.spec, 2)
    scenario.add("xid 1 gpu 3 code 43 gi 1 ci 0")
    wait_for(lambda: api.spec.get("xidEvents"))
    (xid,) = api.spec["xidEvents"]
    assert (xid["xid"], xid["gpu"], xid["gpuInstanceId"], xid["computeInstanceId"]) == (43, 3, 1, 0)
    scenario.add("gpu 3 mig_device 1 3 0 1g.10gb")  # a new instance: written at the next sample
    wait_for(lambda: [m["index"] for m in device(api.spec, 3)["migDevices"]] == [0, 1, 2, 3])
