"""The fabric between GPUs through the real pynvml on the fake NVML: NVLinks and peers, fabric info,
PCIe, throttle time; and what of them rewrites the report."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuhealth.agent.metrics import AgentMetrics
from gpuhealth.agent.model import NvmlStatus, Snapshot
from gpuhealth.agent.nvml_source import NvmlSource
from gpuhealth.agent.report import facts_changed
from gpuhealth.agent.report_fabric import device_fabric_spec
from tests.unit.agent.agent_testlib import Scenario

T0 = 1000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def source(fake_nvml_lib: Path, scenario: Scenario, clock: Clock) -> Iterator[NvmlSource]:
    src = NvmlSource(str(fake_nvml_lib), monotonic=clock)
    yield src
    src.close()


def test_a_healthy_hgx_node_has_eighteen_active_links_and_seven_peers(source: NvmlSource) -> None:
    dev = source.sample().devices[0]
    assert dev.nvlink is not None
    assert (dev.nvlink.links, dev.nvlink.active, dev.nvlink.inactive_links) == (18, 18, ())
    assert dev.nvlink.speed_mbps == 26562 and dev.nvlink.version == 6
    assert dev.nvlink.peers == (1, 2, 3, 4, 5, 6, 7)
    assert (dev.nvlink.replay_errors, dev.nvlink.recovery_errors, dev.nvlink.crc_errors) == (0, 0, 0)
    # Hopper has no link-recovery fields (213-215): unknown, not zero.
    assert dev.nvlink.recovery_failed is None
    assert dev.pcie is not None and (dev.pcie.width, dev.pcie.max_width, dev.pcie.max_generation) == (16, 16, 5)
    assert dev.fabric is not None and dev.fabric.state == "NotSupported"  # 0: an HGX H100 without a probe
    assert dev.unsupported == ()


def test_an_inactive_link_is_counted_and_named(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write("gpu 3 nvlink_inactive 0x5")
    dev = source.sample().devices[3]
    assert dev.nvlink is not None
    assert (dev.nvlink.links, dev.nvlink.active, dev.nvlink.inactive_links) == (18, 16, (0, 2))
    spec = device_fabric_spec(dev)["nvlink"]
    assert spec["inactiveLinks"] == [0, 2] and spec["active"] == 16


def test_peers_are_the_gpus_reached_over_nvlink(source: NvmlSource, scenario: Scenario) -> None:
    # Two NVLink islands of four (no NVSwitch): 0-3 and 4-7; GPU 5 has every link down.
    scenario.write("gpu 0 nvlink_peers 0x0f", "gpu 1 nvlink_peers 0x0f", "gpu 2 nvlink_peers 0x0f")
    scenario.add("gpu 3 nvlink_peers 0x0f", "gpu 4 nvlink_peers 0xf0", "gpu 5 nvlink_peers 0xf0")
    scenario.add("gpu 6 nvlink_peers 0xf0", "gpu 7 nvlink_peers 0xf0", "gpu 5 nvlink_inactive 0x3ffff")
    devices = source.sample().devices
    assert devices[0].nvlink is not None and devices[0].nvlink.peers == (1, 2, 3)
    assert devices[4].nvlink is not None and devices[4].nvlink.peers == (6, 7)
    assert devices[5].nvlink is not None and devices[5].nvlink.peers == () and devices[5].nvlink.active == 0


def test_blackwell_link_recovery_fields_replace_the_dl_counters(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write("gpu 1 nvlink_recovery 2 1 3", "gpu 1 notsupported nvlink_errors")
    dev = source.sample().devices[1]
    assert dev.nvlink is not None
    # Per link, summed over the 18.
    assert (dev.nvlink.recovery_successful, dev.nvlink.recovery_failed, dev.nvlink.recovery_total) == (36, 18, 54)
    assert dev.nvlink.replay_errors is None and dev.nvlink.crc_errors is None
    assert "nvlink" not in dev.unsupported


@pytest.mark.parametrize(
    "lines",
    [
        ("gpu 2 nvlinks 0",),
        ("gpu 2 notsupported nvlink",),
        ("missing nvmlDeviceGetNvLinkCapability",),
    ],
    ids=["no-links", "not-supported", "function-not-found"],
)
def test_a_gpu_without_nvlink_has_it_absent_never_a_fault(
    source: NvmlSource, scenario: Scenario, lines: tuple[str, ...]
) -> None:
    scenario.write(*lines)
    dev = source.sample().devices[2]
    assert dev.nvlink is None and not dev.lost
    assert "nvlink" in dev.unsupported
    # The others still find their peers; GPU 2 is not among them when it has no NVLink.
    other = source.sample().devices[0]
    if lines[0].startswith("missing"):
        assert other.nvlink is None
    else:
        assert other.nvlink is not None and other.nvlink.peers is not None and 2 not in other.nvlink.peers


def test_fabric_info_is_read_and_decoded(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write(
        "gpu * fabric_state 3",
        "gpu * fabric_clique 7",
        "gpu * fabric_cluster 1b9e1a6c-3e57-4f2a-9d0e-6b3f2a1c4d5e",
        "gpu * fabric_summary 1",
        "gpu * fabric_mask 0x1aa",  # every boolean false, configuration correct
        "gpu 6 fabric_mask 0x1a9",  # DEGRADED_BW true
        "gpu 6 fabric_summary 3",
    )
    devices = source.sample().devices
    f = devices[0].fabric
    assert f is not None
    assert (f.state, f.status, f.clique_id, f.health_mask, f.health_summary) == ("Completed", 0, 7, 0x1AA, "Healthy")
    assert f.cluster_uuid == "1b9e1a6c-3e57-4f2a-9d0e-6b3f2a1c4d5e"
    healthy = device_fabric_spec(devices[0])["fabric"]
    assert healthy == {
        "state": "Completed",
        "status": 0,
        "clusterUuid": "1b9e1a6c-3e57-4f2a-9d0e-6b3f2a1c4d5e",
        "cliqueId": 7,
        "healthMask": 0x1AA,
        "healthSummary": "Healthy",
        "degradedBandwidth": False,
        "routeRecovery": False,
        "routeUnhealthy": False,
        "accessTimeoutRecovery": False,
        "incorrectConfiguration": "None",
    }
    degraded = device_fabric_spec(devices[6])["fabric"]
    assert degraded["degradedBandwidth"] is True and degraded["healthSummary"] == "LimitedCapacity"


def test_the_kinds_of_device_the_nvlinks_reach_are_read(source: NvmlSource, scenario: Scenario) -> None:
    """nvmlDeviceGetNvLinkRemoteDeviceType per link: an HGX board's links all reach its NVSwitches, each
    kind written once; a driver without the call leaves it out (unknown, not "none")."""
    dev = source.sample().devices[0]
    assert dev.nvlink is not None and dev.nvlink.remote_device_types == ("Switch",)
    assert device_fabric_spec(dev)["nvlink"]["remoteDeviceTypes"] == ["Switch"]
    scenario.write("missing nvmlDeviceGetNvLinkRemoteDeviceType")
    dev = source.sample().devices[0]
    assert dev.nvlink is not None and dev.nvlink.remote_device_types == () and dev.nvlink.active == 18
    assert "remoteDeviceTypes" not in device_fabric_spec(dev)["nvlink"]


def test_fabric_status_is_read_only_once_the_probe_completed(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write("gpu 0 fabric_state 1", "gpu 0 fabric_status 999", "gpu 0 fabric_clique 3")
    f = source.sample().devices[0].fabric
    assert f is not None and f.state == "NotStarted" and f.status is None
    assert device_fabric_spec(source.sample().devices[0])["fabric"]["state"] == "NotStarted"


def test_fabric_unsupported_is_absent(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write("gpu 0 notsupported fabric", "missing nvmlDeviceGetGpuFabricInfoV")
    devices = source.sample().devices
    assert devices[0].fabric is None and "fabric" in devices[0].unsupported
    assert devices[1].fabric is None and "fabric" in devices[1].unsupported and not devices[1].lost


def test_pcie_generation_is_read_only_while_busy(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write("gpu 0 clock_reasons 0", "gpu 0 pcie_width 8", "gpu 0 pcie_replays 12")
    dev = source.sample().devices[0]
    assert dev.pcie is not None and (dev.pcie.width, dev.pcie.generation, dev.pcie.replays) == (8, 5, 12)
    # Idle: the link drops to gen 1, which is no fact; the busy reading stays.
    scenario.write("gpu 0 clock_reasons 0x1", "gpu 0 pcie_width 8", "gpu 0 pcie_gen 1")
    dev = source.sample().devices[0]
    assert dev.pcie is not None and dev.pcie.generation == 5
    scenario.write("gpu 0 clock_reasons 0", "gpu 0 pcie_width 8", "gpu 0 pcie_gen 3")
    dev = source.sample().devices[0]
    assert dev.pcie is not None and dev.pcie.generation == 3
    # An idle GPU never seen busy has no generation yet (the default fake GPU is idle).
    idle = source.sample().devices[1].pcie
    assert idle is not None and idle.generation is None and idle.width == 16


def test_throttle_duty_cycle_from_accumulated_nanoseconds(source: NvmlSource, scenario: Scenario, clock: Clock) -> None:
    scenario.write("gpu 0 throttle_ns 0 0 0")
    first = source.sample().devices[0].clocks
    assert first is not None and first.hw_power_brake_pct is None  # one sample: nothing to compare
    clock.now += 10
    scenario.write("gpu 0 throttle_ns 1000000000 0 4000000000")  # 1 s SW thermal, 4 s power brake
    t = source.sample().devices[0].clocks
    assert t is not None
    assert (t.window_s, t.sw_thermal_pct, t.hw_thermal_pct, t.hw_power_brake_pct) == (10, 10, 0, 40)
    assert device_fabric_spec(source.sample().devices[0])["clocks"]["hwPowerBrakePercent"] == 40


def test_throttle_fields_unsupported_are_absent(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write("gpu 4 notsupported throttle_ns")
    dev = source.sample().devices[4]
    assert dev.clocks is None and "throttle" in dev.unsupported and not dev.lost


def test_a_lost_gpu_stays_lost_through_the_fabric_reads(source: NvmlSource, scenario: Scenario) -> None:
    source.sample()
    scenario.write("gpu 2 lost 1")
    devices = source.sample().devices
    assert devices[2].lost
    assert devices[0].nvlink is not None and devices[0].nvlink.peers is not None
    assert 2 not in devices[0].nvlink.peers


# ---- what rewrites the report -------------------------------------------------------------------------


def _snap(source: NvmlSource) -> Snapshot:
    return Snapshot(time=datetime.now(UTC), nvml=NvmlStatus(True), devices=source.sample().devices)


def test_ticking_counters_do_not_rewrite_the_report(source: NvmlSource, scenario: Scenario, clock: Clock) -> None:
    scenario.write("gpu * clock_reasons 0")
    before = _snap(source)
    clock.now += 10
    scenario.write(
        "gpu * clock_reasons 0",
        "gpu * nvlink_errors 5 1 3 3 0",
        "gpu * pcie_replays 40",
        "gpu * throttle_ns 300000000 0 0",  # 3%: below a tenth
    )
    after = _snap(source)
    assert not facts_changed(before, after)


@pytest.mark.parametrize(
    ("base", "line"),
    [
        ("", "gpu 1 nvlink_inactive 0x1"),
        ("", "gpu 1 pcie_width 8"),
        ("", "gpu 1 fabric_state 3"),
        ("", "gpu 1 throttle_ns 0 0 5000000000"),
        # A GPU's fields are what its driver offers from the start (Blackwell's link recoveries).
        ("gpu 1 nvlink_recovery 0 0 0", "gpu 1 nvlink_recovery 0 1 1"),
    ],
)
def test_facts_that_matter_rewrite_it(
    source: NvmlSource, scenario: Scenario, clock: Clock, base: str, line: str
) -> None:
    scenario.write("gpu * clock_reasons 0", base)
    before = _snap(source)
    clock.now += 10
    scenario.write("gpu * clock_reasons 0", line)
    assert facts_changed(before, _snap(source))


def test_metrics_mirror_the_fabric_live(source: NvmlSource, scenario: Scenario, clock: Clock) -> None:
    scenario.write("gpu 3 nvlink_inactive 0x3", "gpu 3 fabric_state 3", "gpu 3 fabric_mask 0x1a9", "gpu 3 pcie_width 8")
    source.sample()
    clock.now += 10
    scenario.add("gpu 3 throttle_ns 0 0 2000000000", "gpu 3 nvlink_errors 1 0 2 2 0")
    metrics = AgentMetrics()
    metrics.observe(_snap(source))
    gpu = {"gpu": "3", "uuid": source.sample().devices[3].uuid or ""}
    value = metrics.registry.get_sample_value
    assert value("gpuhealth_agent_gpu_nvlink_links", {**gpu, "state": "inactive"}) == 2
    assert value("gpuhealth_agent_gpu_nvlink_errors", {**gpu, "counter": "crc"}) == 18 * 4
    assert value("gpuhealth_agent_gpu_fabric_fault", {**gpu, "field": "degradedBandwidth"}) == 1
    assert value("gpuhealth_agent_gpu_fabric_fault", {**gpu, "field": "routeUnhealthy"}) == 0
    assert value("gpuhealth_agent_gpu_pcie_link", {**gpu, "kind": "width"}) == 8
    assert value("gpuhealth_agent_gpu_throttle_percent", {**gpu, "cause": "hw_power_brake"}) == 20
