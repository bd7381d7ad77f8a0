"""Helpers for the agent's unit tests: the fake NVML's scenario file and a fake
report transport that behaves like the API server for one object (merge patches applied).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from devkit.fakenvml import build as fakenvml
from gpuhealth.agent.merge_patch import apply_merge_patch
from gpuhealth.agent.runner import Agent
from gpuhealth.agent.transport import AlreadyExistsError, NotFoundError

BOOT_TIME = datetime(2026, 1, 1, tzinfo=UTC)


class Scenario:
    """The fake NVML's scenario file for one test (``FAKE_NVML_SCENARIO`` points at it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[str] = []
        self.write()

    def write(self, *lines: str) -> None:
        """Replace the whole scenario."""
        self.lines = list(lines)
        fakenvml.write_scenario(self.path, "\n".join(self.lines) + "\n")

    def add(self, *lines: str) -> None:
        """Append directives (a later ``gpu`` line overrides an earlier one)."""
        self.write(*self.lines, *lines)


@dataclass
class Call:
    op: str
    name: str
    body: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


class FakeTransport:
    """In-memory stand-in for the API server holding one GPUNodeHealth.

    ``fail_with`` makes every call raise (an outage) until cleared; ``fail_next`` lists
    exceptions to raise on the next calls, one each.
    """

    def __init__(self, existing: dict[str, Any] | None = None) -> None:
        self.obj: dict[str, Any] | None = copy.deepcopy(existing)
        self.calls: list[Call] = []
        self.failed: list[Call] = []
        self.fail_with: BaseException | None = None
        self.fail_next: list[BaseException] = []
        self.lock = threading.Lock()

    def _check(self, call: Call) -> None:
        if self.fail_next:
            self.failed.append(call)
            raise self.fail_next.pop(0)
        if self.fail_with is not None:
            self.failed.append(call)
            raise self.fail_with

    def get(self, name: str) -> dict[str, Any] | None:
        with self.lock:
            self._check(Call("get", name, {}))
            self.calls.append(Call("get", name, {}))
            return copy.deepcopy(self.obj)

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            call = Call("create", body["metadata"]["name"], copy.deepcopy(body))
            self._check(call)
            if self.obj is not None:
                raise AlreadyExistsError(call.name)
            self.calls.append(call)
            self.obj = copy.deepcopy(body)
            return copy.deepcopy(self.obj)

    def patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            call = Call("patch", name, copy.deepcopy(patch))
            self._check(call)
            if self.obj is None:
                raise NotFoundError(name)
            self.calls.append(call)
            self.obj = apply_merge_patch(self.obj, patch)
            return copy.deepcopy(self.obj)

    # ---- test helpers ----

    @property
    def spec(self) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy((self.obj or {}).get("spec", {}))

    def writes(self) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.op in ("create", "patch")]

    def heartbeats(self) -> list[Call]:
        return [c for c in self.writes() if c.op == "patch" and set(c.body["spec"]) == {"heartbeatTime"}]

    def fact_writes(self) -> list[Call]:
        return [c for c in self.writes() if c.op == "create" or set(c.body["spec"]) != {"heartbeatTime"}]


def wait_for(predicate: Callable[[], object], timeout: float = 5.0, interval: float = 0.01) -> float:
    """Poll until ``predicate`` is truthy; returns the seconds it took, fails the test on timeout."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(interval)


def device(spec: dict[str, Any], index: int) -> dict[str, Any]:
    found: dict[str, Any] = next(d for d in spec.get("devices", []) if d["index"] == index)
    return found


AgentFactory = Callable[..., tuple[Agent, FakeTransport]]
