"""Facts read off a Node object the same way by the operator and the plugin."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuhealth.api.names import GPU_COUNT_LABEL, GPU_RESOURCE


def count_of(v: Any) -> int | None:
    """A non-negative count from an int or a digit string (labels and quantities are strings)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.isdigit():
        return int(v)
    return None


def node_gpus(node: Mapping[str, Any] | None) -> int | None:
    """GPUs a Node should have: its ``nvidia.com/gpu.count`` label, else its ``nvidia.com/gpu`` capacity."""
    if not node:
        return None
    labels = (node.get("metadata") or {}).get("labels") or {}
    count = count_of(labels.get(GPU_COUNT_LABEL))
    if count is not None:
        return count
    return count_of(((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE))
