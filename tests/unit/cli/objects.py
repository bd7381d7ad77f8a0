"""CRD- and API-shaped objects for the plugin's unit tests (plain dicts, as the API returns them)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpuhealth.api.timeutil import format_time

NOW = dt.datetime(2025, 6, 1, 12, 0, 0, tzinfo=dt.UTC)


def ago(seconds: float) -> str:
    return format_time(NOW - dt.timedelta(seconds=seconds))


def node(
    name: str,
    gpus: int = 8,
    labels: dict[str, str] | None = None,
    taint: str | None = None,
    cordoned: bool = False,
    annotations: dict[str, str] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    other_taints: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    taints = list(other_taints or [])
    if taint:
        taints.append({"key": "gpuhealth.dev/unhealthy", "value": taint, "effect": "NoSchedule"})
    return {
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(gpus), **(labels or {})},
            "annotations": annotations or {},
            "resourceVersion": "1",
        },
        "spec": {"taints": taints, **({"unschedulable": True} if cordoned else {})},
        "status": {"capacity": {"nvidia.com/gpu": str(gpus)}, "conditions": conditions or []},
    }


def report(
    name: str, state: str | None = None, since_s: float = 0, spec: dict[str, Any] | None = None, **status: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": name, "resourceVersion": "7"},
        "spec": {"nodeName": name, **(spec or {})},
    }
    if state is not None:
        body["status"] = {
            "state": state,
            "since": ago(since_s),
            "policy": status.pop("policy", "train"),
            "totalGPUs": status.pop("totalGPUs", 8),
            "healthyGPUs": status.pop("healthyGPUs", 8),
            **status,
        }
    return body


def policy(
    name: str = "train",
    mode: str | None = None,
    cost: dict[str, Any] | None = None,
    selector: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"nodeSelector": selector or {}, **spec}
    if mode:
        body["mode"] = mode
    if cost is not None:
        body["cost"] = cost
    return {
        "metadata": {"name": name, "resourceVersion": "42", "annotations": annotations or {}},
        "spec": body,
    }
