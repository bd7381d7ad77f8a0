"""An NVML call that never returns is reported, by a thread that does not touch NVML, and remembered
across the agent's restarts (agent/watchdog.py), on the real pynvml over the fake NVML's ``block``."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from gpuhealth.agent.report import rfc3339
from gpuhealth.agent.runner import Agent, AgentConfig
from gpuhealth.agent.watchdog import MARKER_FILE, HangMarker
from gpuhealth.api.names import LEASE_NVML_UNRESPONSIVE_ANNOTATION, LEASE_SAMPLED_AT_ANNOTATION
from gpuhealth.api.report import NvmlHang
from gpuhealth.api.timeutil import parse_time
from tests.unit.agent.agent_testlib import BOOT_TIME, FakeTransport, Scenario, wait_for
from tests.unit.agent.test_agent_lease import FakeLeases

BLOCKED = "nvmlDeviceGetTotalEccErrors"
HANG_AFTER_S = 1.5  # far above a normal sample of the fake (milliseconds), even on a loaded machine


def watched_agent(lib: Path, state: Path, api: FakeTransport, leases: FakeLeases) -> Agent:
    config = AgentConfig(
        node_name="gpu-node-1",
        interval_s=0.1,
        heartbeat_interval_s=60.0,  # renewals on schedule are rare: a renewal seen is one the hang caused
        event_timeout_s=0.1,
        nvml_library=str(lib),
        metrics_port=0,
        initial_backoff_s=0.02,
        max_backoff_s=0.1,
        boot_time=BOOT_TIME,
        lease_namespace="gpuhealth-system",
        state_dir=str(state),
        nvml_hang_after_s=HANG_AFTER_S,
    )
    return Agent(config, api, lease_transport=leases)


def lease_notes(leases: FakeLeases) -> dict[str, Any]:
    with leases.lock:
        obj = leases.objs.get(("gpuhealth-system", "gpu-node-1")) or {}
        return dict((obj.get("metadata") or {}).get("annotations") or {})


def unresponsive(api: FakeTransport) -> dict[str, Any] | None:
    spec = api.spec if api.obj is not None else {}
    found = (spec.get("nvml") or {}).get("unresponsive")
    return dict(found) if found else None


def test_a_hung_call_is_reported_within_the_bound_and_cleared_when_it_returns(
    fake_nvml_lib: Path, scenario: Scenario, tmp_path: Path
) -> None:
    api, leases = FakeTransport(), FakeLeases()
    agent = watched_agent(fake_nvml_lib, tmp_path, api, leases)
    agent.start()
    try:
        wait_for(lambda: LEASE_SAMPLED_AT_ANNOTATION in lease_notes(leases), timeout=5)
        assert LEASE_NVML_UNRESPONSIVE_ANNOTATION not in lease_notes(leases)
        assert agent.health() == (True, "ok")
        scenario.write(f"block {BLOCKED}")
        took = wait_for(lambda: unresponsive(api), timeout=5)
        found = unresponsive(api)
        assert found is not None and found["call"] == BLOCKED
        assert took < HANG_AFTER_S + 3.0
        # The newest sample is older than the hang's start; the facts beside it are the last ones read.
        since, last = parse_time(found["since"]), parse_time(found["lastSampleTime"])
        assert since is not None and last is not None and last <= since
        assert api.spec["nvml"]["available"] is True and len(api.spec["devices"]) == 8
        # The Lease stops vouching at once (not on its 60 s schedule): it names the call, and its
        # sampled-at no longer moves.
        wait_for(lambda: LEASE_NVML_UNRESPONSIVE_ANNOTATION in lease_notes(leases), timeout=5)
        note = lease_notes(leases)
        assert note[LEASE_NVML_UNRESPONSIVE_ANNOTATION].startswith(f"{BLOCKED} since ")
        assert parse_time(note[LEASE_SAMPLED_AT_ANNOTATION]) == last
        ok, why = agent.health()
        assert not ok and f"NVML unresponsive: {BLOCKED}" in why
        marker = json.loads((tmp_path / MARKER_FILE).read_text())
        assert marker["call"] == BLOCKED and parse_time(marker["since"]) == since
        assert agent.metrics.nvml_unresponsive._value.get() == 1

        scenario.write("# the GPU answers again")
        wait_for(lambda: unresponsive(api) is None, timeout=5)
        wait_for(lambda: LEASE_NVML_UNRESPONSIVE_ANNOTATION not in lease_notes(leases), timeout=5)
        assert not (tmp_path / MARKER_FILE).exists()
        wait_for(lambda: agent.health()[0], timeout=5)
        assert agent.metrics.nvml_unresponsive._value.get() == 0
    finally:
        agent.stop(timeout_s=2)


def test_a_restarted_agent_whose_nvml_init_blocks_keeps_reporting_the_hang(
    fake_nvml_lib: Path, scenario: Scenario, tmp_path: Path
) -> None:
    """The liveness probe restarts the agent; nvmlInit blocks too. The restarted agent still starts,
    writes its report and Lease, and says NVML is unresponsive since the first hang, not since now."""
    api, leases = FakeTransport(), FakeLeases()
    first = watched_agent(fake_nvml_lib, tmp_path, api, leases)
    first.start()
    scenario.write(f"block {BLOCKED}")
    wait_for(lambda: unresponsive(api), timeout=5)
    before = unresponsive(api)
    assert before is not None
    first.stop(timeout_s=1)  # its sampler stays blocked in NVML (a daemon thread, as in a killed process)

    scenario.write(f"block {BLOCKED}", "block nvmlInitWithFlags")
    again = watched_agent(fake_nvml_lib, tmp_path, api, leases)
    again.start()  # returns although the first NVML call hangs
    try:
        wait_for(lambda: (api.spec.get("nvml") or {}).get("available") is False, timeout=5)
        found = unresponsive(api)
        assert found is not None and found["call"] == BLOCKED and found["since"] == before["since"]
        wait_for(lambda: LEASE_NVML_UNRESPONSIVE_ANNOTATION in lease_notes(leases), timeout=5)
        assert not again.health()[0]
    finally:
        scenario.write("# unblocked")
        again.stop(timeout_s=2)


def test_a_marker_of_another_boot_is_ignored(tmp_path: Path) -> None:
    since = BOOT_TIME + timedelta(minutes=5)
    HangMarker(str(tmp_path), BOOT_TIME).save(NvmlHang(BLOCKED, since, None))
    assert HangMarker(str(tmp_path), BOOT_TIME).load() == NvmlHang(BLOCKED, since, None)
    assert HangMarker(str(tmp_path), BOOT_TIME + timedelta(hours=1)).load() is None
    (tmp_path / MARKER_FILE).write_text("{torn")
    assert HangMarker(str(tmp_path), BOOT_TIME).load() is None
    HangMarker(str(tmp_path), BOOT_TIME).clear()
    assert not (tmp_path / MARKER_FILE).exists()
    assert HangMarker(None, BOOT_TIME).load() is None  # no state directory: no marker
    assert rfc3339(since).endswith("Z")


def test_a_marker_left_by_a_hang_that_cleared_meanwhile_is_dropped_by_the_first_sample(
    fake_nvml_lib: Path, scenario: Scenario, tmp_path: Path
) -> None:
    HangMarker(str(tmp_path), BOOT_TIME).save(NvmlHang(BLOCKED, BOOT_TIME + timedelta(minutes=5), None))
    api, leases = FakeTransport(), FakeLeases()
    agent = watched_agent(fake_nvml_lib, tmp_path, api, leases)
    agent.start()
    try:
        wait_for(lambda: api.obj is not None and len(api.spec.get("devices") or []) == 8, timeout=5)
        assert unresponsive(api) is None and not (tmp_path / MARKER_FILE).exists()
        assert all(unresponsive_spec(c.body) is None for c in api.writes()), "the stale marker was published"
    finally:
        agent.stop(timeout_s=2)


def unresponsive_spec(body: dict[str, Any]) -> Any:
    return ((body.get("spec") or {}).get("nvml") or {}).get("unresponsive")
