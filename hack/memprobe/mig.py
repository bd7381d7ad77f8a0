"""The MIG fleet of the memory probe (``python -m hack.memprobe --mig``): what a node adds when its 8
GPUs are in static MIG mode with 7 MIG devices each (hack/bench/mig.py's layout, 56 DRA devices).

Each node then also has its ResourceSlice, shaped as NVIDIA's DRA driver publishes static MIG
(devkit/dra_shapes.py) with the metadata the API server adds, and its agent reports every GPU
with ``migMode: Enabled`` and its ``migDevices``. Target (issue #23): a slope of at most 25 KB per node.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.agent.model import DeviceFacts
from hack.bench.mig import GPUS, PROFILE, STARTS, mig_layout, mig_slices

TARGET_BYTES_PER_NODE = 25 * 1024  # "25 KB per node", read as KiB like every figure the probe prints


def fleet() -> dict[str, Any]:
    """The result file's ``fleet`` fields of a MIG probe."""
    return {"mig_profile": PROFILE, "mig_devices_per_gpu": len(STARTS), "mig_devices_per_node": GPUS * len(STARTS)}


def with_mig(i: int, devices: tuple[DeviceFacts, ...]) -> tuple[DeviceFacts, ...]:
    """Node ``i``'s GPUs as its agent samples them in MIG mode: the MIG UUIDs its slice publishes."""
    layout = mig_layout(i)
    return tuple(d.replace(mig_mode="Enabled", mig_devices=layout[d.index]) for d in devices)


def slice_body(i: int, node: str) -> dict[str, Any]:
    """Node ``i``'s ResourceSlice (56 MIG devices) as a watch delivers it."""
    (body,) = mig_slices(node, i).slices
    body["metadata"].update(
        {
            "uid": f"5c1e-{i:012d}",
            "resourceVersion": str(3_000_000 + i),
            "generation": 1,
            "creationTimestamp": "2026-11-30T12:00:00Z",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": f"node-{i}"}],
            "managedFields": [{"manager": "gpu-kubelet-plugin", "operation": "Update", "fieldsV1": {"f:spec": {}}}],
        }
    )
    return body


def verdict(data: dict[str, Any]) -> str:
    """The docs' sentence on the target, for a MIG result file."""
    slope = data["slope_bytes_per_node"]
    met = "met" if slope <= TARGET_BYTES_PER_NODE else "**missed**"
    return f"Target: <= {TARGET_BYTES_PER_NODE / 1024:.0f} KiB per node with MIG slices: {met}."
