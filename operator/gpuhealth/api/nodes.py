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


MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # the device plugin's mixed strategy: nvidia.com/mig-3g.40gb
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"  # set by GPU feature discovery: none, single, mixed
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # single strategy: "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"


def device_plugin_mig(node: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The MIG devices a Node serves through NVIDIA's device plugin, as resource names: the mixed
    strategy's ``nvidia.com/mig-<profile>`` resources with a capacity, or, under the single strategy,
    ``nvidia.com/gpu`` (each one a MIG device, the product label ending in ``-MIG-<profile>``)."""
    if not node:
        return ()
    capacity = (node.get("status") or {}).get("capacity") or {}
    mixed = sorted(k for k, v in capacity.items() if str(k).startswith(MIG_RESOURCE_PREFIX) and str(v) not in ("", "0"))
    if mixed:
        return tuple(mixed)
    labels = (node.get("metadata") or {}).get("labels") or {}
    product = str(labels.get(GPU_PRODUCT_LABEL) or "")
    if labels.get(MIG_STRATEGY_LABEL) == "single" and "-MIG-" in product:
        return (f"{GPU_RESOURCE} as MIG {product.rpartition('-MIG-')[2]}, single strategy",)
    return ()
