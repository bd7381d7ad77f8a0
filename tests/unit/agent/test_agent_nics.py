"""NIC health from a fake sysfs tree: port states, increases of the counters fatal on increase, rates,
saturated counters, management NICs left out, and what rewrites the report."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from devkit import fakesysfs
from gpuhealth.agent.metrics import AgentMetrics
from gpuhealth.agent.model import NvmlStatus, Snapshot
from gpuhealth.agent.nic_source import NicSource, parse_exclude, pci_sysfs_name
from gpuhealth.agent.report import facts_changed
from gpuhealth.agent.report_fabric import nics_spec
from tests.unit.agent.agent_testlib import AgentFactory, wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _source(root: Path, clock: Clock, **kw: object) -> NicSource:
    return NicSource(str(root), monotonic=clock, **kw)  # type: ignore[arg-type]


def test_no_infiniband_class_means_no_nics(tmp_path: Path, clock: Clock) -> None:
    assert _source(tmp_path, clock).sample() == ()


def test_an_active_port_and_a_down_one(tmp_path: Path, clock: Clock) -> None:
    fakesysfs.write_port(tmp_path, "mlx5_0")
    fakesysfs.write_port(tmp_path, "mlx5_1", state="DOWN", phys_state="Disabled")
    up, down = _source(tmp_path, clock).sample()
    assert (up.device, up.port, up.state, up.phys_state, up.link_layer) == (
        "mlx5_0",
        1,
        "ACTIVE",
        "LinkUp",
        "InfiniBand",
    )
    assert (down.state, down.phys_state) == ("DOWN", "Disabled")
    assert up.link_downed == 0 and up.symbol_errors_per_min is None  # one sample: no rate yet
    assert nics_spec((down,))[0]["state"] == "DOWN"


def test_roce_reports_the_netdev_state(tmp_path: Path, clock: Clock) -> None:
    fakesysfs.write_port(tmp_path, "mlx5_2", link_layer="Ethernet", netdev="ens1f0", operstate="down")
    (nic,) = _source(tmp_path, clock).sample()
    assert (nic.netdev, nic.oper_state, nic.state) == ("ens1f0", "down", "ACTIVE")


def test_increases_count_from_the_agents_first_reading(tmp_path: Path, clock: Clock) -> None:
    fakesysfs.write_port(tmp_path, "mlx5_0", counters={"link_downed": 3}, hw_counters={"rnr_nak_retry_err": 100})
    src = _source(tmp_path, clock)
    (first,) = src.sample()
    assert first.link_downed == 0 and first.rnr_nak_retry_errors == 0  # history from before is not news
    fakesysfs.write_port(tmp_path, "mlx5_0", counters={"link_downed": 4}, hw_counters={"rnr_nak_retry_err": 102})
    clock.now += 10
    (second,) = src.sample()
    assert second.link_downed == 1 and second.rnr_nak_retry_errors == 2
    # A reset counter (perfquery -R) counts from zero again, the increase seen is kept.
    fakesysfs.write_port(tmp_path, "mlx5_0", counters={"link_downed": 1})
    clock.now += 10
    (third,) = src.sample()
    assert third.link_downed == 2


def test_rates_are_errors_per_minute_over_the_window(tmp_path: Path, clock: Clock) -> None:
    fakesysfs.write_port(tmp_path, "mlx5_0", counters={"symbol_error": 10, "port_rcv_errors": 0})
    src = _source(tmp_path, clock)
    src.sample()
    clock.now += 30
    fakesysfs.write_port(tmp_path, "mlx5_0", counters={"symbol_error": 13, "port_rcv_errors": 600})
    (nic,) = src.sample()
    assert nic.symbol_errors_per_min == pytest.approx(6.0)
    assert nic.port_rcv_errors_per_min == pytest.approx(1200.0)
    assert nic.link_error_recovery_per_min == 0.0


def test_a_pinned_counter_is_saturated_not_a_zero_rate(tmp_path: Path, clock: Clock) -> None:
    # symbol_error is 16 bits, local_link_integrity_errors 4: both stop at their maximum.
    fakesysfs.write_port(tmp_path, "mlx5_0", counters={"symbol_error": 65535, "local_link_integrity_errors": 15})
    src = _source(tmp_path, clock)
    src.sample()
    clock.now += 60
    (nic,) = src.sample()
    assert nic.symbol_errors_per_min is None
    assert set(nic.saturated) == {"symbol_error", "local_link_integrity_errors"}
    assert nics_spec((nic,))[0]["saturated"] == ["local_link_integrity_errors", "symbol_error"]


def test_management_nics_are_excluded(tmp_path: Path, clock: Clock) -> None:
    fakesysfs.write_port(tmp_path, "mlx5_0", numa_node=0)
    fakesysfs.write_port(tmp_path, "mlx5_1", numa_node=1)
    fakesysfs.write_port(tmp_path, "mlx5_bond", numa_node=0)
    fakesysfs.write_gpu_numa(tmp_path, "00000000:18:00.0", 0)
    src = _source(tmp_path, clock, exclude=parse_exclude("mlx5_bond, "))
    # mlx5_1 sits on a NUMA node with no GPU; mlx5_bond is excluded by name.
    assert [n.device for n in src.sample(["00000000:18:00.0"])] == ["mlx5_0"]
    # Without the GPUs' NUMA nodes nothing is guessed: only the named one is left out.
    assert [n.device for n in src.sample()] == ["mlx5_0", "mlx5_1"]


def test_pci_names_as_sysfs_spells_them() -> None:
    assert pci_sysfs_name("00000000:18:00.0") == "0000:18:00.0"
    assert pci_sysfs_name("00000001:AB:00.0") == "0001:ab:00.0"


def _snap(src: NicSource) -> Snapshot:
    return Snapshot(time=datetime.now(UTC), nvml=NvmlStatus(True), nics=src.sample())


def test_what_rewrites_the_report(tmp_path: Path, clock: Clock) -> None:
    fakesysfs.write_port(tmp_path, "mlx5_0", counters={"symbol_error": 0})
    src = _source(tmp_path, clock)
    src.sample()
    clock.now += 60
    fakesysfs.write_port(tmp_path, "mlx5_0", counters={"symbol_error": 1})
    steady = _snap(src)
    assert steady.nics[0].symbol_errors_per_min == pytest.approx(1.0)
    # The same rate a minute later (symbol errors keep ticking): no new fact, no write.
    clock.now += 60
    fakesysfs.write_port(tmp_path, "mlx5_0", counters={"symbol_error": 2})
    assert not facts_changed(steady, _snap(src))
    # A rate moving into another bucket is one.
    clock.now += 60
    fakesysfs.write_port(tmp_path, "mlx5_0", counters={"symbol_error": 2000})
    assert facts_changed(steady, _snap(src))
    # A fatal counter's increase is.
    before = _snap(src)
    clock.now += 10
    fakesysfs.write_port(tmp_path, "mlx5_0", counters={"link_downed": 1})
    assert facts_changed(before, _snap(src))
    # So is a port going down.
    before = _snap(src)
    fakesysfs.write_port(tmp_path, "mlx5_0", state="DOWN", phys_state="Polling")
    assert facts_changed(before, _snap(src))


def test_the_agent_reports_its_nics_and_a_port_going_down(tmp_path: Path, make_agent: AgentFactory) -> None:
    fakesysfs.write_port(tmp_path, "mlx5_0")
    _, transport = make_agent(sysfs_root=str(tmp_path))
    wait_for(lambda: transport.spec.get("nics"))
    assert transport.spec["nics"][0] == {
        "device": "mlx5_0",
        "port": 1,
        "state": "ACTIVE",
        "physState": "LinkUp",
        "linkLayer": "InfiniBand",
        "linkDowned": 0,
        "localLinkIntegrityErrors": 0,
        "excessiveBufferOverrunErrors": 0,
        "rnrNakRetryErrors": 0,
    } | {k: v for k, v in transport.spec["nics"][0].items() if k.endswith("PerMin")}
    fakesysfs.write_port(tmp_path, "mlx5_0", state="DOWN", phys_state="Polling", counters={"link_downed": 1})
    wait_for(lambda: transport.spec["nics"][0]["state"] == "DOWN")
    assert transport.spec["nics"][0]["linkDowned"] == 1


def test_metrics_mirror_the_nics(tmp_path: Path, clock: Clock) -> None:
    fakesysfs.write_port(tmp_path, "mlx5_0", state="DOWN", counters={"symbol_error": 65535})
    src = _source(tmp_path, clock)
    src.sample()
    clock.now += 60
    fakesysfs.write_port(tmp_path, "mlx5_0", state="DOWN", counters={"link_downed": 2, "port_rcv_errors": 30})
    metrics = AgentMetrics()
    metrics.observe(_snap(src))
    port = {"device": "mlx5_0", "port": "1"}
    value = metrics.registry.get_sample_value
    assert value("gpuhealth_agent_nic_port_up", port) == 0
    assert value("gpuhealth_agent_nic_counter_increase", {**port, "counter": "link_downed"}) == 2
    assert value("gpuhealth_agent_nic_errors_per_minute", {**port, "counter": "port_rcv_errors"}) == 30
