"""Helpers shared by the tests of per-GPU quarantine through the node pipeline (and the remediator's,
which starts from the same node): node n1 with GPU 3's ECC bad, its ResourceSlice and claims, a
clock the test moves, and a Runtime loaded against the in-memory fake API."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpuhealth.actions.slices import slim_slice
from gpuhealth.api import pods as P
from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import at, gpu, report_obj
from tests.unit.fake_kube import FakeKube

RULE = "gpuhealth-n1-gpu-3"


def slice_of(node: str, gpus: int = 8) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"index": {"int": i}, "uuid": {"string": f"GPU-{i:04d}"}}}
                for i in range(gpus)
            ],
        },
    }


def ecc_on(*bad: int, seconds: float = 0.0) -> dict[str, Any]:
    devices = [gpu(i, ecc={"volatileUncorrected": 1}) if i in bad else gpu(i) for i in range(8)]
    return report_obj(name="n1", devices=devices, heartbeat=seconds)


def claim(name: str, device: str, pod: str, namespace: str = "ml") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "status": {
            "allocation": {"devices": {"results": [{"driver": "gpu.nvidia.com", "pool": "n1", "device": device}]}},
            "reservedFor": [{"resource": "pods", "name": pod, "uid": f"uid-{namespace}-{pod}"}],
        },
    }


class Clock:
    def __init__(self) -> None:
        self.t = at(10)

    def __call__(self) -> dt.datetime:
        return self.t


async def runtime(kube: FakeKube, clock: Clock, slices: bool | None = True) -> Runtime:
    """``slices``: True, n1's slice is listed; False, the list is in and has none; None, not in yet."""
    rt = Runtime(kube, clock=clock, workers=1)
    if slices is not None:
        rt.slice_watch.cache.replace([slim_slice(slice_of("n1"))] if slices else [])
    await rt._load()
    await rt._list_pods()
    return rt


def setup(policy: dict[str, Any] | None = None) -> FakeKube:
    """n1 with GPU 3's ECC bad, a pod holding GPU 3 and one holding GPU 5, under one policy."""
    kube = FakeKube()
    kube.add_policy("p", policy or {"safety": {"maxUnhealthyGPUs": 4}})
    kube.add_node("n1")
    kube.add_report(ecc_on(3))
    kube.add_pod("ml", "on-gpu-3", "n1", {P.CHECKPOINT_MODE: "annotation"})
    kube.add_pod("ml", "on-gpu-5", "n1", {P.CHECKPOINT_MODE: "annotation"})
    kube.claims = [claim("c3", "gpu-3", "on-gpu-3"), claim("c5", "gpu-5", "on-gpu-5")]
    return kube
