"""Fixtures for the agent's unit tests: fake NVML (loaded by the real pynvml), fake API."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Helpers live in a uniquely named module beside this file; make it importable in any
# pytest import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from devkit.fakenvml import build as fakenvml
from gpuhealth.agent.runner import Agent, AgentConfig
from tests.unit.agent.agent_testlib import BOOT_TIME, AgentFactory, FakeTransport, Scenario


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path: Path = fakenvml.build_fake_nvml(tmp_path_factory.mktemp("fakenvml"))
    return path


@pytest.fixture
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    path = tmp_path / "scenario.txt"
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(path))
    return Scenario(path)


@pytest.fixture
def make_agent(fake_nvml_lib: Path, scenario: Scenario) -> Iterator[AgentFactory]:
    """Build (and on teardown stop) agents on the fake NVML with fast test intervals."""
    agents: list[Agent] = []

    def factory(
        transport: FakeTransport | None = None, start: bool = True, **overrides: Any
    ) -> tuple[Agent, FakeTransport]:
        settings: dict[str, Any] = {
            "node_name": "gpu-node-1",
            "interval_s": 0.1,
            "heartbeat_interval_s": 60.0,
            "event_timeout_s": 0.1,
            "nvml_library": str(fake_nvml_lib),
            "metrics_port": 0,
            "initial_backoff_s": 0.02,
            "max_backoff_s": 0.1,
            "boot_time": BOOT_TIME,
        }
        settings.update(overrides)
        transport = transport if transport is not None else FakeTransport()
        agent = Agent(AgentConfig(**settings), transport)
        agents.append(agent)
        if start:
            agent.start()
        return agent, transport

    yield factory
    for agent in agents:
        agent.stop(timeout_s=5)
