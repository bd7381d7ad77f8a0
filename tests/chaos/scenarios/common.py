"""Small pieces several scenarios share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def drain_policy(**safety: Any) -> dict[str, Any]:
    return {
        "rules": {"agentSilence": {"after": "10m"}},
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
