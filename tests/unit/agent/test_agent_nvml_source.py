"""NvmlSource against the fake NVML, through the real pynvml bindings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhealth.agent.model import DeviceFacts
from gpuhealth.agent.nvml_source import ENV_LIBRARY, NvmlSource
from tests.unit.agent.agent_testlib import Scenario


@pytest.fixture
def source(fake_nvml_lib: Path, scenario: Scenario) -> Iterator[NvmlSource]:
    src = NvmlSource(str(fake_nvml_lib))
    yield src
    src.close()


def _dev(src: NvmlSource, index: int) -> DeviceFacts:
    return src.sample().devices[index]


def test_discovers_eight_h100s(source: NvmlSource) -> None:
    sample = source.sample()
    assert sample.status.available
    assert sample.status.driver_version == "550.90.07"
    assert sample.status.cuda_version == "12.4"
    assert [d.index for d in sample.devices] == list(range(8))
    assert len({d.uuid for d in sample.devices}) == 8
    first = sample.devices[0]
    assert first.model == "NVIDIA H100 80GB HBM3"
    assert first.uuid is not None and first.uuid.startswith("GPU-")
    assert first.pci_bus_id == "00000000:18:00.0"
    assert first.mig_mode == "Disabled" and first.ecc_mode == "Enabled"
    assert not first.lost and first.unsupported == ()
    assert first.temperature is not None and first.temperature.current_c == 35
    assert (first.temperature.slowdown_c, first.temperature.shutdown_c) == (87, 92)
    assert first.power_w == 120.0
    assert first.recovery_action == "None"
    assert first.ecc is not None and first.ecc.volatile_uncorrected == 0


def test_uuids_are_stable_across_processes_and_sessions(source: NvmlSource) -> None:
    first = [d.uuid for d in source.sample().devices]
    source.close()
    assert [d.uuid for d in NvmlSource(source._library).sample().devices] == first


def test_counters_follow_the_scenario(source: NvmlSource, scenario: Scenario) -> None:
    source.sample()
    scenario.write(
        "gpu 2 ecc_volatile_uncorrected 2",
        "gpu 2 ecc_aggregate_corrected 17",
        "gpu 2 retired_dbe 3",
        "gpu 2 retired_pending 1",
        "gpu 2 remap_uncorrected 4",
        "gpu 2 remap_failure 1",
        "gpu 2 temp 91",
        "gpu 2 clock_reasons 0x48",
        "gpu 2 power_mw 650500",
        "gpu 2 recovery_action 4",
        "gpu 2 mig 1",
    )
    d = _dev(source, 2)
    assert d.ecc is not None and (d.ecc.volatile_uncorrected, d.ecc.aggregate_corrected) == (2, 17)
    assert d.retired_pages is not None
    assert (d.retired_pages.double_bit_ecc, d.retired_pages.single_bit_ecc, d.retired_pages.pending) == (
        3,
        0,
        True,
    )
    assert d.remapped_rows is not None
    assert (d.remapped_rows.uncorrected, d.remapped_rows.failure, d.remapped_rows.pending) == (4, True, False)
    assert d.temperature is not None and d.temperature.current_c == 91
    assert d.clock_event_reasons == 0x48
    assert d.power_w == 650.5
    assert d.recovery_action == "DrainAndReset"
    assert d.mig_mode == "Enabled"


def test_not_supported_is_recorded_not_a_fault(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write(
        "gpu 1 notsupported remapped_rows",
        "gpu 1 notsupported retired_pages",
        "gpu 1 notsupported recovery_action",
        "gpu 1 notsupported power",
        "gpu 2 notsupported all",
        "gpu 3 ecc_mode 0",
    )
    one = _dev(source, 1)
    assert not one.lost
    assert set(one.unsupported) == {"remappedRows", "retiredPages", "recoveryAction", "powerW"}
    assert one.remapped_rows is None and one.retired_pages is None and one.power_w is None
    assert one.recovery_action is None
    assert one.ecc is not None and one.temperature is not None

    everything = source.sample().devices[2]
    assert not everything.lost
    assert everything.mig_mode == "Unsupported" and everything.ecc_mode == "Unsupported"
    assert {"ecc", "temperature", "temperatureThresholds", "clockEventReasons"} <= set(everything.unsupported)
    assert everything.ecc is None and everything.clock_event_reasons is None

    no_ecc = source.sample().devices[3]
    assert no_ecc.ecc_mode == "Disabled" and "ecc" in no_ecc.unsupported


def test_thresholds_not_supported_at_discovery(fake_nvml_lib: Path, scenario: Scenario) -> None:
    scenario.write("gpu 0 notsupported thresholds")
    src = NvmlSource(str(fake_nvml_lib))
    try:
        d = src.sample().devices[0]
        assert d.temperature is not None and d.temperature.current_c == 35
        assert d.temperature.slowdown_c is None
        assert "temperatureThresholds" in d.unsupported
    finally:
        src.close()


def test_lost_gpu_stays_listed_with_last_facts(source: NvmlSource, scenario: Scenario) -> None:
    before = source.sample().devices[3]
    scenario.write("gpu 3 lost 1")
    lost = _dev(source, 3)
    assert lost.lost
    assert lost.uuid == before.uuid and lost.pci_bus_id == before.pci_bus_id
    assert lost.temperature == before.temperature
    assert len(source.sample().devices) == 8
    scenario.write()
    assert not _dev(source, 3).lost


def test_gpu_that_disappears_after_discovery_is_lost(source: NvmlSource, scenario: Scenario) -> None:
    uuid = source.sample().devices[7].uuid
    scenario.write("gpus 7")
    devices = source.sample().devices
    assert len(devices) == 8
    assert devices[7].lost and devices[7].uuid == uuid
    assert not any(d.lost for d in devices[:7])


def test_gpu_lost_at_discovery(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write("gpu 5 lost 1")
    devices = source.sample().devices
    assert devices[5].lost and devices[5].index == 5
    assert sum(d.lost for d in devices) == 1


def test_missing_library_reports_unavailable(scenario: Scenario, tmp_path: Path) -> None:
    src = NvmlSource(str(tmp_path / "no-such-libnvidia-ml.so.1"))
    sample = src.sample()
    assert not sample.status.available
    assert sample.status.error is not None and "no-such-libnvidia-ml.so.1" in sample.status.error
    assert sample.devices == ()
    src.close()


def test_library_path_from_environment(
    fake_nvml_lib: Path, scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_LIBRARY, str(fake_nvml_lib))
    src = NvmlSource()
    try:
        assert src.sample().status.available
    finally:
        src.close()


def test_init_failure_then_recovery(fake_nvml_lib: Path, scenario: Scenario) -> None:
    scenario.write("init_error 9")
    src = NvmlSource(str(fake_nvml_lib))
    try:
        sample = src.sample()
        assert not sample.status.available and sample.devices == ()
        assert sample.status.error is not None and "Driver Not Loaded" in sample.status.error
        scenario.write()  # the driver came up: the next sample re-initialises
        sample = src.sample()
        assert sample.status.available and len(sample.devices) == 8
    finally:
        src.close()


def test_clock_reasons_fall_back_to_throttle_reasons(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write("missing nvmlDeviceGetCurrentClocksEventReasons", "gpu 0 clock_reasons 0x20")
    d = source.sample().devices[0]
    assert d.clock_event_reasons == 0x20
    assert "clockEventReasons" not in d.unsupported


def test_xid_events_delivered_once_each(source: NvmlSource, scenario: Scenario) -> None:
    uuid = source.sample().devices[3].uuid
    assert source.wait_events(0.05).xids == ()  # registers the event set
    scenario.write("xid 1 gpu 3 code 79")
    batch = source.wait_events(1.0)
    assert [(x.xid, x.gpu, x.uuid, x.source) for x in batch.xids] == [(79, 3, uuid, "nvml")]
    assert batch.resample
    assert source.wait_events(0.05).xids == ()  # not delivered twice
    scenario.add("xid 2 gpu 3 code 79")  # same code again, new sequence number
    assert [x.xid for x in source.wait_events(1.0).xids] == [79]


def test_events_not_supported(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write("gpu 4 notsupported events")
    source.sample()
    source.wait_events(0.01)
    assert "xidEvents" in source.sample().devices[4].unsupported
    assert "xidEvents" not in source.sample().devices[0].unsupported


def test_wait_events_without_nvml_returns_after_timeout(scenario: Scenario, tmp_path: Path) -> None:
    src = NvmlSource(str(tmp_path / "missing.so"))
    assert src.wait_events(0.05).xids == ()


def test_xids_before_registration_are_not_delivered(fake_nvml_lib: Path, scenario: Scenario) -> None:
    """Like the driver: a restarted agent does not see old XIDs again; every watcher sees new ones."""
    first = NvmlSource(str(fake_nvml_lib))
    first.open()
    first.wait_events(0)
    scenario.write("xid 1 gpu 0 code 79")
    assert [x.xid for x in first.wait_events(1.0).xids] == [79]
    first.close()

    restarted = NvmlSource(str(fake_nvml_lib))
    other = NvmlSource(str(fake_nvml_lib))
    try:
        restarted.open()
        other.open()
        assert restarted.wait_events(0.1).xids == ()  # XID 79 predates this registration
        other.wait_events(0)
        scenario.add("xid 2 gpu 1 code 48")
        assert [x.xid for x in restarted.wait_events(1.0).xids] == [48]
        assert [x.xid for x in other.wait_events(1.0).xids] == [48]
    finally:
        restarted.close()
        other.close()
