"""The peering keep-alive lifetime: gpuhealth's own default (a failover within ~15 s, not Kopf's 60 s)."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from gpuhealth.controller.process.handlers import register
from gpuhealth.controller.process.main import PEERING_LIFETIME_S, parse_args


class _Runtime:
    started = False

    async def start(self) -> None:
        self.started = True


def _configure(lifetime: int | None) -> kopf.OperatorSettings:
    registry = kopf.OperatorRegistry()
    runtime = _Runtime()
    register(registry, runtime, None, peering_lifetime_s=lifetime)  # type: ignore[arg-type]
    handler = next(h for h in registry._activities.get_all_handlers() if getattr(h.fn, "__name__", "") == "configure")
    settings = kopf.OperatorSettings()
    fn: Any = handler.fn
    asyncio.run(fn(settings=settings))
    assert runtime.started
    return settings


def test_default_lifetime_is_gpuhealths() -> None:
    assert parse_args([]).peering_lifetime == PEERING_LIFETIME_S == 15


def test_lifetime_flag_and_floor() -> None:
    assert parse_args(["--peering-lifetime=30"]).peering_lifetime == 30
    with pytest.raises(SystemExit):
        parse_args(["--peering-lifetime=10"])


def test_configure_sets_kopf_lifetime() -> None:
    assert _configure(15).peering.lifetime == 15
    assert _configure(None).peering.lifetime == kopf.OperatorSettings().peering.lifetime == 60
