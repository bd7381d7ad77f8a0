"""The running agent (threads and all) on the fake NVML, publishing to a fake API."""

from __future__ import annotations

import time
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest

from gpuhealth.agent.model import DeviceFacts, NvmlStatus, Temperature, XidEvent
from gpuhealth.agent.publisher import Publisher, is_retryable
from gpuhealth.agent.report import rfc3339
from gpuhealth.agent.runner import Agent, AgentConfig
from gpuhealth.agent.source import DeviceSample, SourceEvents
from tests.unit.agent.agent_testlib import BOOT_TIME, AgentFactory, FakeTransport, Scenario, device, wait_for


class ApiError(Exception):
    """Shaped like kubernetes.client.ApiException (only ``status`` matters)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def first_write(transport: FakeTransport) -> None:
    wait_for(lambda: transport.writes())


def test_creates_report_with_eight_gpus(make_agent: AgentFactory) -> None:
    _agent, api = make_agent()
    first_write(api)
    create = api.writes()[0]
    assert create.op == "create"
    body = create.body
    assert body["apiVersion"] == "gpuhealth.dev/v1alpha1" and body["kind"] == "GPUNodeHealth"
    assert body["metadata"]["name"] == "gpu-node-1"
    spec = body["spec"]
    assert spec["nodeName"] == "gpu-node-1"
    assert spec["nvml"]["available"] is True
    assert [d["index"] for d in spec["devices"]] == list(range(8))
    assert all(d["model"] == "NVIDIA H100 80GB HBM3" and d["lost"] is False for d in spec["devices"])
    assert all(d["inforomCorrupt"] is False for d in spec["devices"])  # nvmlDeviceValidateInforom: valid
    assert spec["agent"]["bootTime"] == rfc3339(BOOT_TIME)
    assert spec["agent"]["sources"] == ["nvml"]
    assert "status" not in body


def test_injected_xid_published_within_one_event_wait(make_agent: AgentFactory, scenario: Scenario) -> None:
    wait_s = 0.5
    _agent, api = make_agent(event_timeout_s=wait_s, interval_s=30.0)
    first_write(api)
    uuid = device(api.spec, 6)["uuid"]
    scenario.write("xid 1 gpu 6 code 79")
    took = wait_for(lambda: api.spec.get("xidEvents"), timeout=5)
    assert took < wait_s + 0.5, f"XID took {took:.2f}s to reach the report"
    (event,) = api.spec["xidEvents"]
    assert (event["xid"], event["gpu"], event["uuid"], event["source"]) == (79, 6, uuid, "nvml")
    assert event["time"].endswith("Z")
    # The same XID injected again (new sequence number) is a second event, not a duplicate.
    scenario.add("xid 2 gpu 6 code 79")
    wait_for(lambda: len(api.spec.get("xidEvents", [])) == 2)


@pytest.mark.parametrize(
    ("line", "check"),
    [
        ("gpu 1 ecc_volatile_uncorrected 2", lambda d: d["ecc"]["volatileUncorrected"] == 2),
        ("gpu 1 remap_failure 1", lambda d: d["remappedRows"]["failure"] is True),
        ("gpu 1 remap_uncorrected 3", lambda d: d["remappedRows"]["uncorrected"] == 3),
        ("gpu 1 retired_dbe 2", lambda d: d["retiredPages"]["doubleBitEcc"] == 2),
        ("gpu 1 temp 89", lambda d: d["temperature"]["currentC"] == 89),
        ("gpu 1 clock_reasons 0x40", lambda d: d["clockEventReasons"] == 0x40),
        ("gpu 1 recovery_action 1", lambda d: d["recoveryAction"] == "Reset"),
        ("gpu 1 lost 1", lambda d: d["lost"] is True),
    ],
)
def test_fact_changes_appear_after_one_sample(
    make_agent: AgentFactory, scenario: Scenario, line: str, check: object
) -> None:
    interval = 0.2
    _agent, api = make_agent(interval_s=interval)
    first_write(api)
    scenario.write(line)
    took = wait_for(lambda: check(device(api.spec, 1)))  # type: ignore[operator]
    assert took < 2 * interval + 0.5


def test_the_inforom_check_of_the_fake_driver_reaches_the_report(make_agent: AgentFactory, scenario: Scenario) -> None:
    """Read at start (then hourly, agent/nvml_calls.py): corrupt, refused (unsupported), valid."""
    scenario.write("gpu 1 inforom_corrupt 1", "gpu 2 notsupported inforom")
    _agent, api = make_agent()
    first_write(api)
    assert device(api.spec, 1)["inforomCorrupt"] is True
    refused = device(api.spec, 2)
    assert "inforomCorrupt" not in refused and "inforomCorrupt" in refused["unsupported"]
    assert device(api.spec, 0)["inforomCorrupt"] is False


def test_clock_events_since_moves_with_significant_bits(make_agent: AgentFactory, scenario: Scenario) -> None:
    _agent, api = make_agent()
    first_write(api)
    since = device(api.spec, 0)["clockEventsSince"]
    scenario.write("gpu 0 clock_reasons 0x48")
    wait_for(lambda: device(api.spec, 0)["clockEventReasons"] == 0x48)
    assert device(api.spec, 0)["clockEventsSince"] > since


def test_no_write_when_nothing_changed(make_agent: AgentFactory, scenario: Scenario) -> None:
    agent, api = make_agent(interval_s=0.05)
    first_write(api)
    time.sleep(0.3)
    # Noise only: power swings, +3 C, power-cap and boost clock bits.
    scenario.write("gpu * power_mw 690000", "gpu 0 temp 38", "gpu 2 clock_reasons 0x15")
    time.sleep(0.6)  # about a dozen samples
    assert len(api.writes()) == 1
    assert agent.metrics.writes.labels(kind="create")._value.get() == 1
    # A real move of the temperature is a fact.
    scenario.write("gpu 0 temp 41")
    wait_for(lambda: device(api.spec, 0)["temperature"]["currentC"] == 41)
    assert len(api.writes()) == 2


def test_heartbeat_on_time(make_agent: AgentFactory) -> None:
    heartbeat = 0.3
    _agent, api = make_agent(interval_s=0.05, heartbeat_interval_s=heartbeat)
    first_write(api)
    wait_for(lambda: len(api.heartbeats()) >= 3, timeout=heartbeat * 3 + 2)
    beats = api.heartbeats()
    assert len(api.fact_writes()) == 1
    gaps = [b.at - a.at for a, b in zip(api.writes(), api.writes()[1:], strict=False)]
    assert all(heartbeat * 0.8 <= g <= heartbeat + 0.4 for g in gaps), gaps
    assert all(set(b.body) == {"spec"} and set(b.body["spec"]) == {"heartbeatTime"} for b in beats)
    assert api.spec["heartbeatTime"] == beats[-1].body["spec"]["heartbeatTime"]


def test_publishes_latest_state_after_api_outage(make_agent: AgentFactory, scenario: Scenario) -> None:
    agent, api = make_agent(interval_s=0.05, event_timeout_s=0.05)
    first_write(api)
    api.fail_with = ConnectionRefusedError("apiserver down")
    scenario.write("gpu 2 temp 60", "xid 1 gpu 2 code 48")
    wait_for(lambda: len(api.failed) >= 3)
    scenario.write("gpu 2 temp 70", "gpu 2 ecc_volatile_uncorrected 1", "xid 1 gpu 2 code 48", "xid 2 gpu 5 code 94")
    wait_for(lambda: len(api.failed) >= 6)
    time.sleep(0.2)
    api.fail_with = None
    wait_for(lambda: len(api.spec.get("xidEvents", [])) == 2 and device(api.spec, 2)["temperature"]["currentC"] == 70)
    spec = api.spec
    assert device(spec, 2)["ecc"]["volatileUncorrected"] == 1
    assert [(x["xid"], x["gpu"]) for x in spec["xidEvents"]] == [(48, 2), (94, 5)]
    assert agent.metrics.publish_errors._value.get() >= 6
    assert agent.health()[0]


@pytest.mark.parametrize("status", [401, 403, 409, 429, 500, 503])
def test_retries_retryable_statuses(make_agent: AgentFactory, status: int) -> None:
    api = FakeTransport()
    api.fail_next = [ApiError(status), ApiError(status)]
    _agent, api = make_agent(transport=api)
    first_write(api)
    assert len(api.failed) == 2


def test_non_retryable_error_is_retried_later(make_agent: AgentFactory, scenario: Scenario) -> None:
    agent, api = make_agent(interval_s=0.05, event_timeout_s=0.05, max_backoff_s=0.3)
    first_write(api)
    api.fail_next = [ApiError(422)]  # invalid: not retried at once, but the state stays dirty
    scenario.write("gpu 2 ecc_volatile_uncorrected 1")
    wait_for(lambda: api.failed)
    failed = api.failed[0]
    assert failed.op == "patch" and device(failed.body["spec"], 2)["ecc"]["volatileUncorrected"] == 1
    wait_for(lambda: device(api.spec, 2).get("ecc", {}).get("volatileUncorrected") == 1)
    # The 422 was counted, and the same facts were written again after the back-off, not at once
    # (retryable errors are retried at once, with jitter, inside the publish call).
    later = [w for w in api.writes() if w.at > failed.at]
    assert later and later[0].at - failed.at >= 0.25, [w.at - failed.at for w in later]
    assert agent.metrics.publish_errors._value.get() == 1


def test_restart_keeps_xids_from_this_boot_only(make_agent: AgentFactory) -> None:
    before_boot = rfc3339(BOOT_TIME - timedelta(hours=1))
    after_boot = rfc3339(BOOT_TIME + timedelta(hours=1))
    existing = {
        "apiVersion": "gpuhealth.dev/v1alpha1",
        "kind": "GPUNodeHealth",
        "metadata": {"name": "gpu-node-1"},
        "spec": {
            "nodeName": "gpu-node-1",
            "nvml": {"available": False, "error": "old error"},
            "xidEvents": [
                {"xid": 79, "gpu": 0, "time": before_boot, "source": "nvml"},
                {"xid": 48, "gpu": 1, "time": after_boot, "source": "nvml"},
            ],
        },
        "status": {"state": "Quarantined"},
    }
    _agent, api = make_agent(transport=FakeTransport(existing))
    first_write(api)
    write = api.writes()[0]
    assert write.op == "patch"
    spec = api.spec
    assert [(x["xid"], x["time"]) for x in spec["xidEvents"]] == [(48, after_boot)]
    assert "error" not in spec["nvml"] and spec["nvml"]["available"] is True
    assert "status" not in write.body
    assert api.obj is not None and api.obj["status"] == {"state": "Quarantined"}


def test_recreates_report_deleted_behind_its_back(make_agent: AgentFactory, scenario: Scenario) -> None:
    _agent, api = make_agent(heartbeat_interval_s=0.2)
    first_write(api)
    with api.lock:
        api.obj = None
    wait_for(lambda: len([c for c in api.writes() if c.op == "create"]) == 2)
    assert len(api.spec["devices"]) == 8


def test_nvml_missing_reports_unavailable(make_agent: AgentFactory, tmp_path: object) -> None:
    _agent, api = make_agent(nvml_library="/nonexistent/libnvidia-ml.so.1")
    first_write(api)
    spec = api.spec
    assert spec["nvml"]["available"] is False
    assert "/nonexistent/libnvidia-ml.so.1" in spec["nvml"]["error"]
    assert spec["devices"] == []


def test_metrics_and_healthz(make_agent: AgentFactory, scenario: Scenario) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    scenario.write("gpu 3 temp 77")
    _agent, api = make_agent(metrics_port=port, metrics_bind="127.0.0.1")
    first_write(api)
    scenario.add("xid 1 gpu 3 code 13")
    wait_for(lambda: api.spec.get("xidEvents"))
    base = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(f"{base}/healthz", timeout=5) as r:
        assert r.status == 200 and r.read().strip() == b"ok"
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'gpuhealth_agent_gpu_temperature_celsius{gpu="3"' in text
    assert "gpuhealth_agent_nvml_available 1.0" in text
    assert 'gpuhealth_agent_xid_events_total{gpu="3",source="nvml",xid="13"} 1.0' in text
    assert 'gpuhealth_agent_report_writes_total{kind="create"} 1.0' in text
    assert "gpuhealth_agent_publish_errors_total 0.0" in text


def test_stop_is_prompt(make_agent: AgentFactory) -> None:
    agent, api = make_agent(event_timeout_s=0.2, interval_s=5, heartbeat_interval_s=5)
    first_write(api)
    started = time.monotonic()
    agent.stop()
    assert time.monotonic() - started < 2
    assert not agent.health()[0]


def test_publisher_restore_retries_until_api_answers(make_agent: AgentFactory) -> None:
    api = FakeTransport()
    api.fail_next = [ConnectionResetError(), TimeoutError()]
    agent, api = make_agent(transport=api)
    first_write(api)
    assert [c.op for c in api.failed] == ["get", "get"]
    assert isinstance(agent.publisher, Publisher)


class StubSource:
    """A DeviceSource without NVML: what logic tests (or a bench) can plug into the Agent."""

    def __init__(self) -> None:
        self.temp = 40
        self.pending: list[XidEvent] = []
        self.closed = False

    def sample(self) -> DeviceSample:
        gpu = DeviceFacts(index=0, uuid="GPU-stub", model="stub", temperature=Temperature(self.temp, 90, 95))
        return DeviceSample(NvmlStatus(available=True, driver_version="1.0"), (gpu,))

    def wait_events(self, timeout_s: float) -> SourceEvents:
        if self.pending:
            return SourceEvents(xids=(self.pending.pop(0),))
        time.sleep(min(timeout_s, 0.01))
        return SourceEvents()

    def close(self) -> None:
        self.closed = True


def test_agent_runs_on_any_device_source() -> None:
    stub = StubSource()
    api = FakeTransport()
    config = AgentConfig(node_name="stub-node", interval_s=0.05, event_timeout_s=0.05, metrics_port=0)
    agent = Agent(config, api, source=stub)
    agent.start()
    try:
        wait_for(lambda: api.writes())
        assert device(api.spec, 0)["temperature"]["currentC"] == 40
        stub.temp = 80
        stub.pending.append(XidEvent(xid=31, time=datetime.now(UTC), source="simulated", gpu=0))
        wait_for(lambda: api.spec.get("xidEvents") and device(api.spec, 0)["temperature"]["currentC"] == 80)
        assert api.spec["xidEvents"][0]["source"] == "simulated"
    finally:
        agent.stop()
    assert stub.closed


def test_a_forbidden_write_is_retried_soon_not_after_the_longest_back_off() -> None:
    # A restarted API server answers 403 until its authorization caches sync (found by chaos).
    assert is_retryable(ApiError(403)) and is_retryable(ApiError(401))
    assert not is_retryable(ApiError(422)) and not is_retryable(ApiError(404))
