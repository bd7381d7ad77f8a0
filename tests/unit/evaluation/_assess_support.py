"""Helpers shared by the tests of ``assess()``: one node (eight GPUs by its label), an assessment at
T0 + a number of seconds, and the actionable findings as comparable tuples."""

from __future__ import annotations

from typing import Any

from gpuhealth.api.names import GPU_COUNT_LABEL, Action, Signal
from gpuhealth.api.policy import Policy
from gpuhealth.api.report import Report
from gpuhealth.evaluation.assess import Assessment, NodeView, assess
from tests.unit.builders import NODE, at, gpu, make_policy

VIEW = NodeView(NODE, {GPU_COUNT_LABEL: "8"})


def assess_at(
    report: Report | None,
    policy: Policy | None = None,
    now_s: float = 60,
    view: NodeView = VIEW,
    prior_pending: dict[str, str] | None = None,
    cleared_s: float | None = None,
) -> Assessment:
    """``assess()`` at T0 + ``now_s`` (the default policy unless told), evidence cleared before
    T0 + ``cleared_s`` if given."""
    return assess(
        policy or make_policy(),
        report,
        view,
        at(now_s),
        prior_pending,
        None if cleared_s is None else at(cleared_s),
    )


def signals(a: Assessment) -> list[tuple[Signal, Action, int | None, int | None]]:
    """The actionable findings as (signal, action, gpu, code), sorted by key."""
    return [(f.signal, f.action, f.gpu, f.code) for f in a.actionable()]


def eight_gpus(**by_index: dict[str, Any]) -> list[dict[str, Any]]:
    """Eight GPUs; ``g3={...}`` adds fields to GPU 3."""
    return [gpu(i, **by_index.get(f"g{i}", {})) for i in range(8)]
