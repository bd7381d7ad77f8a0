"""The watchdog names a reconcile that runs long (once, and again when it ends) and a blocked loop."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from gpuhealth.controller.process import watchdog as W
from tests.unit.controller.process._clock import Clock


def test_a_long_reconcile_is_named_once_while_it_runs_and_once_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    dog = W.Watchdog(clock)
    dog.started("n1")
    dog.started("n2")
    clock.t += 5
    dog.finished("n2")  # quick: nothing said
    assert dog.check() == []
    clock.t += W.SLOW_RECONCILE_S
    with caplog.at_level(logging.WARNING, logger=W.__name__):
        assert dog.check() == ["n1"]
        assert dog.check() == []  # told once
        clock.t += 30
        dog.finished("n1")
    said = [r.getMessage() for r in caplog.records]
    assert said == ["reconcile of n1 has been running for 20s", "reconcile of n1 took 50.0s"]
    assert all("n2" not in m for m in said)


def test_a_blocked_loop_is_named(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(W, "PERIOD_S", 0.01)
    monkeypatch.setattr(W, "LOOP_LAG_S", 0.2)

    async def body() -> None:
        task = asyncio.create_task(W.Watchdog().run())
        await asyncio.sleep(0.05)
        time.sleep(0.4)  # a blocking call on the loop
        await asyncio.sleep(0.05)
        task.cancel()

    with caplog.at_level(logging.WARNING, logger=W.__name__):
        asyncio.run(body())
    assert any("event loop was blocked" in r.getMessage() for r in caplog.records)
