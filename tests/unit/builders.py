"""Builders shared by the operator's unit tests: fixed clock, CRD-shaped objects, findings."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from gpuhealth.api.names import Action, Signal
from gpuhealth.api.policy import Policy, parse_policy
from gpuhealth.api.report import Report, parse_report
from gpuhealth.api.timeutil import format_time
from gpuhealth.evaluation.assess import Assessment, Finding

T0 = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
NODE = "gpu-node-1"


def at(seconds: float) -> dt.datetime:
    """T0 + ``seconds``."""
    return T0 + dt.timedelta(seconds=seconds)


def iso(seconds: float) -> str:
    return format_time(at(seconds))


def make_policy(spec: dict[str, Any] | None = None, name: str = "default", **meta: Any) -> Policy:
    return parse_policy({"metadata": {"name": name, **meta}, "spec": spec or {}})


def gpu(index: int, **fields: Any) -> dict[str, Any]:
    """A device entry as the agent writes it in GPUNodeHealth spec.devices."""
    return {"index": index, "uuid": f"GPU-{index:04d}", "model": "NVIDIA H100 80GB HBM3", **fields}


def xid_event(code: int, seconds: float, gpu_index: int | None = 0) -> dict[str, Any]:
    ev: dict[str, Any] = {"xid": code, "time": iso(seconds), "source": "nvml"}
    if gpu_index is not None:
        ev["gpu"] = gpu_index
    return ev


def report_obj(
    devices: list[dict[str, Any]] | None = None,
    xids: list[dict[str, Any]] | None = None,
    heartbeat: float | None = 0.0,
    nvml: dict[str, Any] | None = None,
    name: str = NODE,
    **spec: Any,
) -> dict[str, Any]:
    """A GPUNodeHealth object shaped like crds/gpunodehealths.yaml; 8 healthy GPUs unless told."""
    body: dict[str, Any] = {
        "nodeName": name,
        "observedTime": iso(0),
        "nvml": nvml if nvml is not None else {"available": True, "driverVersion": "570.86.15"},
        "devices": devices if devices is not None else [gpu(i) for i in range(8)],
        "xidEvents": xids or [],
        **spec,
    }
    if heartbeat is not None and "heartbeatTime" not in body:
        body["heartbeatTime"] = iso(heartbeat)
    return {
        "apiVersion": "gpuhealth.dev/v1alpha1",
        "kind": "GPUNodeHealth",
        "metadata": {"name": name, "resourceVersion": "42"},
        "spec": body,
    }


def make_report(**kw: Any) -> Report:
    return parse_report(report_obj(**kw))


def finding(action: Action, signal: Signal = Signal.ECC, gpu_index: int | None = 0, code: int | None = None) -> Finding:
    return Finding(signal, action, f"{signal} asks for {action}", gpu_index, "", code, T0)


def clean() -> Assessment:
    return Assessment(total_gpus=8, healthy_gpus=8)


def faulty(action: Action, signal: Signal = Signal.ECC) -> Assessment:
    return Assessment(findings=(finding(action, signal),), total_gpus=8, healthy_gpus=7)


def unknown(*findings: Finding) -> Assessment:
    return Assessment(findings=findings, unknown=True, unknown_reason="no heartbeat from the agent for 300s")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, returning a new document: None deletes, dicts merge, lists are replaced."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out
