"""NVML 13's recovery-action and GPU-unavailable events, through the real pynvml on the fake NVML.

The sampling interval is long in these tests (30 s): a change that reaches the report within a few
seconds got there through the event, not through the next sample.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhealth.agent.nvml_source import NvmlSource
from tests.unit.agent.agent_testlib import AgentFactory, Scenario, device, wait_for

LONG_INTERVAL_S = 30.0
EVENT_LATENCY_S = 5.0


@pytest.fixture
def source(fake_nvml_lib: Path, scenario: Scenario) -> Iterator[NvmlSource]:
    src = NvmlSource(str(fake_nvml_lib))
    yield src
    src.close()


def _drain(src: NvmlSource) -> None:
    """Register (the first wait creates the event set) and consume nothing."""
    src.open()
    src.wait_events(0.0)


def test_recovery_action_event_rereads_the_field_for_that_gpu(source: NvmlSource, scenario: Scenario) -> None:
    assert source.sample().devices[2].recovery_action == "None"
    _drain(source)
    scenario.write("gpu 2 recovery_action 6", "event 1 gpu 2 type recovery_action")
    batch = source.wait_events(2.0)
    assert batch.resample and batch.xids == ()
    # Re-read at the event, before any sample: the next snapshot carries it whatever the interval.
    assert source._devices[2].facts.recovery_action == "BusReset"
    assert source._devices[3].facts.recovery_action == "None"


def test_unavailable_event_marks_the_gpu_lost_for_the_session(source: NvmlSource, scenario: Scenario) -> None:
    source.sample()
    _drain(source)
    scenario.write("event 1 gpu 4 type unavailable")
    assert source.wait_events(2.0).resample
    assert source._devices[4].facts.lost
    # NVML said the GPU cannot serve work: it stays lost though its queries still answer.
    sample = source.sample()
    assert sample.devices[4].lost and sample.devices[4].uuid
    assert sample.devices[4].temperature is not None  # counters that answer are still facts
    assert not any(d.lost for i, d in enumerate(sample.devices) if i != 4)
    # A fresh NVML session rediscovers it.
    source.close()
    assert not source.sample().devices[4].lost


def test_recovery_action_change_reaches_the_report_at_event_latency(
    make_agent: AgentFactory, scenario: Scenario
) -> None:
    _agent, api = make_agent(interval_s=LONG_INTERVAL_S)
    wait_for(lambda: api.writes())
    assert device(api.spec, 1)["recoveryAction"] == "None"
    scenario.write("gpu 1 recovery_action 7", "event 1 gpu 1 type recovery_action")
    wait_for(lambda: device(api.spec, 1).get("recoveryAction") == "SystemReboot", timeout=EVENT_LATENCY_S)


def test_unavailable_gpu_reaches_the_report_as_lost_at_event_latency(
    make_agent: AgentFactory, scenario: Scenario
) -> None:
    _agent, api = make_agent(interval_s=LONG_INTERVAL_S)
    wait_for(lambda: api.writes())
    assert device(api.spec, 5)["lost"] is False
    scenario.write("event 1 gpu 5 type unavailable")
    wait_for(lambda: device(api.spec, 5)["lost"] is True, timeout=EVENT_LATENCY_S)
    assert [d["index"] for d in api.spec["devices"] if d["lost"]] == [5]


def test_a_driver_without_the_new_event_types_keeps_xids(make_agent: AgentFactory, scenario: Scenario) -> None:
    """Drivers before NVML 13 offer neither type: the agent registers what is offered, XIDs included."""
    scenario.write("gpu * notsupported recovery_events", "gpu * notsupported unavailable_events")
    _agent, api = make_agent(interval_s=LONG_INTERVAL_S)
    wait_for(lambda: api.writes())
    assert "xidEvents" not in device(api.spec, 0).get("unsupported", [])
    scenario.add("xid 1 gpu 0 code 79", "event 2 gpu 0 type unavailable")
    wait_for(lambda: [e["xid"] for e in api.spec.get("xidEvents", [])] == [79], timeout=EVENT_LATENCY_S)
    # Not registered, so never delivered: the GPU is not marked lost by an event it never asked for.
    assert device(api.spec, 0)["lost"] is False


def test_events_before_registration_are_never_delivered(source: NvmlSource, scenario: Scenario) -> None:
    scenario.write("gpu 2 recovery_action 2", "event 1 gpu 2 type recovery_action", "event 2 gpu 3 type unavailable")
    source.sample()
    _drain(source)
    assert source.wait_events(0.3).resample is False
    assert not source._devices[3].facts.lost
