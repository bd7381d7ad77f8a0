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


def plugin_gpus(node: Mapping[str, Any] | None) -> tuple[int, int] | None:
    """``(capacity, allocatable)`` of ``nvidia.com/gpu`` on a Node, as the device plugin registered
    them with the kubelet; None where the Node has no such capacity (no device plugin serves GPUs).
    A GPU the plugin holds ``Unhealthy`` stays in capacity and leaves allocatable."""
    status = (node or {}).get("status") or {}
    capacity = count_of((status.get("capacity") or {}).get(GPU_RESOURCE))
    if capacity is None or capacity == 0:
        return None
    allocatable = count_of((status.get("allocatable") or {}).get(GPU_RESOURCE))
    return capacity, capacity if allocatable is None else allocatable


def plugin_withholds(node: Mapping[str, Any] | None, out: int) -> bool:
    """Whether the device plugin already keeps ``out`` GPUs of the Node from new pods: allocatable
    ``nvidia.com/gpu`` is at most its capacity less ``out`` (the plugin dropped them, as NVIDIA's does
    on a critical XID). A count, not the GPUs by name: a GPU the plugin withholds for a fault of its
    own counts too (docs/devices.md says so). False without such a capacity."""
    gpus = plugin_gpus(node)
    return gpus is not None and out > 0 and gpus[1] <= gpus[0] - out


def plugin_offers(node: Mapping[str, Any] | None, others: int) -> bool:
    """Whether the device plugin offers a repaired GPU again: allocatable ``nvidia.com/gpu`` is at least
    its capacity less the ``others`` GPUs of the Node still held out. A count, as ``plugin_withholds``:
    a GPU the plugin still holds ``Unhealthy`` is one short of that. False without such a capacity (no
    plugin serves GPUs on the Node, or it has not registered again)."""
    gpus = plugin_gpus(node)
    return gpus is not None and gpus[1] >= gpus[0] - max(0, others)
