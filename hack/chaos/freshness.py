"""Nothing Healthy without a fresh report, judged by the sampler's own clock (pure).

Judging freshness by the report's ``heartbeatTime`` alone trusts the agent's clock: an agent whose
clock runs ahead writes a heartbeat from the future and looks fresh long after it fell silent. So
the tracker remembers, per node, when it first saw the current heartbeat value: a node the operator
calls Healthy must have had its heartbeat change within ``agentSilence.after`` (+ slack for one
sweep and a reconcile) of the sampler's clock, and by the agent's clock too. A node whose report is
gone may not be (or stay) Healthy on its Node at all. Time the sampler could not read (the API was
down on purpose) is not held against the operator, which could not write either: after an outage it
gets ``slack`` seconds from the first successful read.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from devkit.timeparse import parse_time

STATE_LABEL = "gpuhealth.dev/state"


def node_says_healthy(node: Mapping[str, Any] | None) -> bool:
    """The Node's own verdict: gpuhealth's state label or its GPUHealthy condition."""
    if node is None:
        return False
    label = ((node.get("metadata") or {}).get("labels") or {}).get(STATE_LABEL)
    conds = (node.get("status") or {}).get("conditions") or []
    cond = next((c for c in conds if c.get("type") == "GPUHealthy"), None)
    return label == "Healthy" or (cond or {}).get("status") == "True"


@dataclass
class Freshness:
    slack: float = 5.0
    _seen: dict[str, tuple[str | None, float]] = field(default_factory=dict)  # heartbeat, first seen
    _missing: dict[str, float] = field(default_factory=dict)  # report gone since
    _back: float = float("-inf")  # first good read after reads failed
    _blind: bool = False

    def unreadable(self) -> None:
        """A sample could not be read (the API server may be down on purpose)."""
        self._blind = True

    def observe(
        self,
        at: float,
        wall: dt.datetime,
        name: str,
        report: Mapping[str, Any] | None,
        node: Mapping[str, Any] | None,
        after: float,
    ) -> list[tuple[str, str]]:
        """(kind, message) for each way this sample of one node breaks freshness. ``at`` is the
        sampler's monotonic clock in seconds, ``wall`` its wall clock, ``after`` the node's
        agentSilence.after in seconds."""
        if self._blind:
            self._blind, self._back = False, at
        if report is None:
            self._seen.pop(name, None)
            since = self._missing.setdefault(name, at)
            if node_says_healthy(node) and at > max(since, self._back) + self.slack:
                return [
                    ("missing", f"{name}: the Node still says Healthy {at - since:.1f}s after its report went away")
                ]
            return []
        self._missing.pop(name, None)
        hb_raw = (report.get("spec") or {}).get("heartbeatTime")
        if name not in self._seen or self._seen[name][0] != hb_raw:
            self._seen[name] = (hb_raw, at)
        if ((report.get("status") or {}).get("state")) != "Healthy":
            return []
        hb = parse_time(hb_raw)
        if hb is None:
            return [("fresh", f"{name}: Healthy, but its report has no heartbeatTime")]
        out = []
        first = self._seen[name][1]
        if at > max(first + after, self._back) + self.slack:
            ahead = (hb - wall).total_seconds()
            out.append(
                (
                    "fresh",
                    f"{name}: Healthy, but its heartbeat has not changed for {at - first:.1f}s "
                    f"(agentSilence.after {after:.0f}s)"
                    + (f"; heartbeatTime {hb_raw} is {ahead:.0f}s ahead of this clock" if ahead > 1 else ""),
                )
            )
        age = (wall - hb).total_seconds()
        if age > after + self.slack and at > self._back + self.slack:
            out.append(("fresh-agent-clock", f"{name}: Healthy without a fresh report (heartbeat age {age:.1f}s)"))
        return out
