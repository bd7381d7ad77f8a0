"""The heartbeat as a node Lease: renewed on schedule, the report written only when facts change."""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuhealth.agent.lease import NodeLease, lease_duration_s, micro_time
from gpuhealth.agent.merge_patch import apply_merge_patch
from gpuhealth.agent.runner import Agent, AgentConfig
from gpuhealth.agent.transport import AlreadyExistsError, NotFoundError
from gpuhealth.api.names import AGENT_LEASE_SELECTOR
from gpuhealth.api.timeutil import parse_time
from tests.unit.agent.agent_testlib import BOOT_TIME, FakeTransport, Scenario, wait_for


class FakeLeases:
    """In-memory Leases by (namespace, name); ``race`` makes the next create find the Lease there."""

    def __init__(self) -> None:
        self.objs: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail_next: list[BaseException] = []
        self.race = False
        self.lock = threading.Lock()

    def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        with self.lock:
            self.calls.append(("patch", name))
            if self.fail_next:
                raise self.fail_next.pop(0)
            if (namespace, name) not in self.objs:
                raise NotFoundError(name)
            self.objs[namespace, name] = apply_merge_patch(self.objs[namespace, name], patch)

    def create(self, body: dict[str, Any]) -> None:
        with self.lock:
            self.calls.append(("create", body["metadata"]["name"]))
            key = (body["metadata"]["namespace"], body["metadata"]["name"])
            if self.race:
                self.race = False
                self.objs[key] = {"metadata": {"name": key[1]}, "spec": {"holderIdentity": "someone-else"}}
            if key in self.objs:
                raise AlreadyExistsError(key[1])
            self.objs[key] = copy.deepcopy(body)

    def renewals(self, ns: str = "gpuhealth-system", name: str = "gpu-node-1") -> int:
        with self.lock:
            return sum(1 for op, n in self.calls if n == name)

    def spec(self, ns: str = "gpuhealth-system", name: str = "gpu-node-1") -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy((self.objs.get((ns, name)) or {}).get("spec") or {})


class ApiError(Exception):
    """Shaped like kubernetes.client.ApiException (only ``status`` matters)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


NOW = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)


def test_renew_creates_a_missing_lease_then_patches_it() -> None:
    leases = FakeLeases()
    lease = NodeLease(leases, "gpuhealth-system", "n1", heartbeat_interval_s=30)
    assert lease.renew(NOW) == "create"
    obj = leases.objs["gpuhealth-system", "n1"]
    assert obj["apiVersion"] == "coordination.k8s.io/v1" and obj["kind"] == "Lease"
    assert obj["spec"]["holderIdentity"] == "n1" and obj["spec"]["leaseDurationSeconds"] == 120
    assert obj["spec"]["renewTime"] == "2026-11-30T12:00:00.123456Z" == obj["spec"]["acquireTime"]
    key, value = AGENT_LEASE_SELECTOR.split("=")  # what the operator's Lease watch selects on
    assert obj["metadata"]["labels"][key] == value
    assert lease.renew(NOW.replace(second=30)) == "renew"
    assert leases.objs["gpuhealth-system", "n1"]["spec"]["renewTime"].startswith("2026-11-30T12:00:30")
    assert leases.calls == [("patch", "n1"), ("create", "n1"), ("patch", "n1")]


def test_a_create_that_races_patches_and_takes_the_lease_over() -> None:
    leases = FakeLeases()
    leases.race = True
    assert NodeLease(leases, "ns", "n1", 10).renew(NOW) == "renew"
    spec = leases.objs["ns", "n1"]["spec"]
    assert spec["holderIdentity"] == "n1" and spec["renewTime"] == micro_time(NOW)


def test_micro_time_round_trips_and_duration_covers_missed_beats() -> None:
    assert parse_time(micro_time(NOW)) == NOW
    assert lease_duration_s(30) == 120 and lease_duration_s(0.1) == 1


def lease_agent(lib: Path, leases: FakeLeases, api: FakeTransport, heartbeat: float) -> Agent:
    config = AgentConfig(
        node_name="gpu-node-1",
        interval_s=0.05,
        heartbeat_interval_s=heartbeat,
        event_timeout_s=0.1,
        nvml_library=str(lib),
        metrics_port=0,
        initial_backoff_s=0.02,
        max_backoff_s=0.1,
        boot_time=BOOT_TIME,
        lease_namespace="gpuhealth-system",
    )
    return Agent(config, api, lease_transport=leases)


def test_heartbeats_renew_the_lease_and_never_touch_the_report(fake_nvml_lib: Path, scenario: Scenario) -> None:
    leases, api = FakeLeases(), FakeTransport()
    agent = lease_agent(fake_nvml_lib, leases, api, heartbeat=0.2)
    agent.start()
    try:
        wait_for(lambda: leases.renewals() >= 5, timeout=5)
        assert [c.op for c in api.writes()] == ["create"], "one report write on start, none per heartbeat"
        assert api.heartbeats() == []
        # The metric counts a renewal after the call returns (and a first renewal may be a get and a
        # create): wait for it rather than read it in the same instant.
        wait_for(lambda: agent.metrics.writes.labels(kind="lease")._value.get() >= 4, timeout=5)
        # A fact changes: the report is written at once, the Lease keeps its own schedule.
        scenario.write("gpu 2 ecc_volatile_uncorrected 1")
        wait_for(lambda: len(api.fact_writes()) == 2, timeout=5)
        assert api.spec["devices"][2]["ecc"]["volatileUncorrected"] == 1
        renewals = leases.renewals()
        wait_for(lambda: leases.renewals() > renewals, timeout=2)
        assert len(api.writes()) == 2
    finally:
        agent.stop(timeout_s=5)


def test_a_failed_renewal_is_retried_with_growing_delays(fake_nvml_lib: Path, scenario: Scenario) -> None:
    leases, api = FakeLeases(), FakeTransport()
    # Throttled twice, then refused (a restarted API server's RBAC cache): all retried.
    leases.fail_next = [ApiError(429), ApiError(429), ApiError(403)]
    agent = lease_agent(fake_nvml_lib, leases, api, heartbeat=60)
    agent.start()
    try:
        wait_for(lambda: leases.spec().get("holderIdentity") == "gpu-node-1", timeout=5)
        assert agent.metrics.publish_errors._value.get() >= 3
        assert [c.op for c in api.writes()] == ["create"], "a retried renewal does not write the report again"
    finally:
        agent.stop(timeout_s=5)


def test_without_a_lease_namespace_the_report_carries_the_heartbeat(fake_nvml_lib: Path, scenario: Scenario) -> None:
    leases, api = FakeLeases(), FakeTransport()
    config = AgentConfig(
        node_name="gpu-node-1",
        interval_s=0.05,
        heartbeat_interval_s=0.2,
        event_timeout_s=0.1,
        nvml_library=str(fake_nvml_lib),
        metrics_port=0,
        boot_time=BOOT_TIME,
    )
    agent = Agent(config, api, lease_transport=leases)
    agent.start()
    try:
        wait_for(lambda: len(api.heartbeats()) >= 2, timeout=5)
        assert leases.calls == []
    finally:
        agent.stop(timeout_s=5)
