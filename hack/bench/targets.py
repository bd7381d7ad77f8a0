"""The bench's targets: what a figure is held to, how a result entry reads, and its table rows.

Pure; shared by the run's summary (``report``), the MIG fleet's (``mig_report``) and the filed
docs (``docs``), so each renders a target the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The targets for the 10,000-node run (and larger), where they differ from the 1,000-node ones.
LARGE_FLEET_NODES = 10000


@dataclass(frozen=True)
class Target:
    key: str
    label: str
    target: str
    value: Callable[[dict[str, Any]], Any]
    ok: Callable[[Any, dict[str, Any]], bool]
    unit: str = ""


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not (isinstance(v, float) and math.isnan(v))


def path(*keys: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The results' block at ``keys`` (KeyError where the run lacks it: "not measured")."""

    def at(r: dict[str, Any]) -> dict[str, Any]:
        for k in keys:
            r = r[k]
        return r

    return at


def latency(
    key: str, label: str, at: Callable[[dict[str, Any]], dict[str, Any]], p50_ms: float = 200
) -> tuple[Target, Target]:
    """p50 <= ``p50_ms`` and p99 <= 1 s (with no timeouts) for the latency summary ``at`` gives of the results."""
    return (
        Target(
            f"{key}_p50",
            f"{label}, p50",
            f"<= {p50_ms:g} ms",
            lambda r: at(r)["p50"],
            lambda v, r: _num(v) and v <= p50_ms,
            " ms",
        ),
        Target(
            f"{key}_p99",
            f"{label}, p99",
            "<= 1000 ms",
            lambda r: at(r)["p99"],
            lambda v, r: _num(v) and v <= 1000 and at(r)["timeouts"] == 0,
            " ms",
        ),
    )


def measured(entry: dict[str, Any] | None) -> bool:
    """Whether a target entry (of a run filed before the target existed: None) was measured."""
    return entry is not None and entry.get("measured", True) is not False


def verdict(entry: dict[str, Any] | None, met: str, missed: str) -> str:
    if not measured(entry):
        return "not measured"
    assert entry is not None
    return met if entry["pass"] else missed


def _fmt(v: Any, unit: str) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.1f}{unit}" if abs(v) >= 10 else f"{v:.2f}{unit}"
    return f"{v}{unit}"


def _rows(res: dict[str, Any], targets: list[Target], met: str, missed: str) -> list[str]:
    rows = []
    for t in targets:
        e = res["targets"].get(t.key)
        value = _fmt(e["value"], t.unit) if e and measured(e) else "not measured"
        rows.append(f"| {t.label} | {value} | {t.target} | {verdict(e, met, missed)} |")
    return rows
