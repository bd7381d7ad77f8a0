"""Small pieces several scenarios share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# agentSilence.after of every scenario whose reports come from the heartbeater (context.HEARTBEAT_S):
# four beats, so a missed beat or two under load is no silence, while a node that stays Healthy on a
# stale report is caught well within any scenario's length.
SILENCE = "10s"


def drain_policy(**safety: Any) -> dict[str, Any]:
    return {
        "rules": {"agentSilence": {"after": SILENCE}},
        "actions": {"drain": {"checkpointTimeout": "2m"}},
        "safety": {
            "maxUnhealthy": "100%",
            "maxConcurrentDrains": 100,
            "probation": "2s",
            "flapping": {"maxQuarantines": 100, "window": "24h"},
            **safety,
        },
    }


def drained(s: Mapping[str, Any]) -> bool:
    return s.get("state") == "Quarantined" and bool(s.get("drained"))
