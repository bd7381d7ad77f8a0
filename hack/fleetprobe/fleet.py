"""The fleet the fleet probe drives (``hack/fleetprobe/__init__.py``): the memory probe's Nodes, reports,
Leases and pods (``hack/memprobe/fleet.py``), as a fleet the operator has already evaluated, plus the
events a running fleet sends: pod churn, report changes, Lease renewals, Node updates and faults.

Settled: each Node carries the state label and ``GPUHealthy`` condition, each report the status the
operator writes, so a pass over a healthy node writes nothing (the probe checks it) and the probe
measures a running fleet, not the first evaluation of a new one. Each pod holds one GPU, as a training
Job's pods do (8 per node).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from gpuhealth.agent.model import XidEvent
from gpuhealth.agent.report import rfc3339, xid_spec
from hack.memprobe.fleet import GPUS, PODS_PER_NODE, T0, lease_body, node_body, pod_body, report_body

# The Llama 3 405B run (Meta, "The Llama 3 Herd of Models", arXiv:2407.21783, section 3.3.4, Table 5):
# 419 unexpected interruptions in 54 days of pre-training on 16,384 H100 GPUs, 30.1% of them "Faulty GPU"
# and 17.2% "GPU HBM3 Memory" (each GPU-attributed). Scaled to a fleet's GPUs by their count.
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16_384
LLAMA3_GPU_SHARE = 0.301 + 0.172
# The agent's Lease heartbeat (``agent/lease.py`` default) and how often a healthy node's report changes
# (an assumption of the probe: one agent write per node per ten minutes, a temperature or ECC count).
LEASE_PERIOD_S = 30.0
REPORT_PERIOD_S = 600.0
NODE_PERIOD_S = 300.0  # the kubelet's Node status update when nothing changed (nodeStatusReportFrequency, 5 min)
FAULT_XID = 79  # GPU has fallen off the bus: the node is quarantined at once (catalog/xid.py)


def fault_rate_per_s(nodes: int) -> float:
    """Interruptions per second a fleet of ``nodes`` x 8 GPUs sees at the Llama 3 run's rate, all causes."""
    return LLAMA3_INTERRUPTIONS / LLAMA3_DAYS / 86_400 * nodes * GPUS / LLAMA3_GPUS


def name(i: int) -> str:
    return f"gpu-node-{i:05d}"


def settled_node(i: int) -> dict[str, Any]:
    body = node_body(i)
    t = rfc3339(T0)
    body["metadata"]["labels"]["gpuhealth.dev/state"] = "Healthy"
    cond = {
        "type": "GPUHealthy",
        "status": "True",
        "reason": "Healthy",
        "message": "",
        "lastHeartbeatTime": t,
        "lastTransitionTime": t,
    }
    body["status"]["conditions"].append(cond)
    return body


def settled_report(i: int, *, at: dt.datetime | None = None, rv: int = 0, xid: int | None = None) -> dict[str, Any]:
    """The report with the status the operator writes for it; with ``at``, the agent's next write at that
    time (a new heartbeat and a GPU's temperature one degree up), and with ``xid`` that XID on GPU 0."""
    body = report_body(i, name(i))
    status = body["status"]
    devices = body["spec"]["devices"]
    status["devices"] = [{"index": d["index"], "state": "InService", "uuid": d["uuid"]} for d in devices]
    if i % 4:
        status["lastXid"] = f"13 (GPU {i % 4 - 1})"  # the last of its application XIDs (memprobe/fleet.py)
    if at is not None:
        body["spec"]["heartbeatTime"] = rfc3339(at)
        body["metadata"]["resourceVersion"] = str(rv)
        temperature = devices[rv % len(devices)].get("temperature")
        if isinstance(temperature, dict) and "currentC" in temperature:
            temperature["currentC"] += 1
    if xid is not None and at is not None:
        event = XidEvent(xid=xid, time=at, source="nvml", gpu=0, detail="")
        body["spec"]["xidEvents"] = [*body["spec"].get("xidEvents", []), xid_spec(event)]
    return body


def gpu_pod(i: int, k: int, rv: int = 0, restarts: int = 0) -> dict[str, Any]:
    """Pod ``k`` of node ``i``: one GPU, a rank of a training Job; ``rv`` makes an update (its readiness
    probe's time moved, as the kubelet's status updates of a running pod do), ``restarts`` one that
    restart-loop detection reads."""
    body = pod_body(i, k, name(i))
    body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    if rv:
        body["metadata"]["resourceVersion"] = str(rv)
        body["status"]["containerStatuses"][0]["restartCount"] = restarts
        body["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastProbeTime": f"rv-{rv}"}]
    return body


def updated_node(i: int, rv: int) -> dict[str, Any]:
    """The kubelet's periodic status update: new condition heartbeats, a new resourceVersion."""
    body = settled_node(i)
    body["metadata"]["resourceVersion"] = str(rv)
    for c in body["status"]["conditions"]:
        if c["type"] != "GPUHealthy":
            c["lastHeartbeatTime"] = rfc3339(T0 + dt.timedelta(seconds=rv % 3600))
    return body


def renewed_lease(i: int, at: dt.datetime) -> dict[str, Any]:
    body = lease_body(i, name(i))
    body["spec"]["renewTime"] = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return body


def line(event: str, body: dict[str, Any]) -> bytes:
    """One watch event as the API server streams it: what the watch thread decodes."""
    return json.dumps({"type": event, "object": body}).encode()


__all__ = ["GPUS", "PODS_PER_NODE", "T0", "lease_body"]
