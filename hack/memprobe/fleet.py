"""The fleet the memory probe feeds (``hack/memprobe/__init__.py``): each Node, report, Lease, pod and
the policy shaped as the watches deliver them (KWOK's fake nodes, the agent's own ``ReportBuilder``
with the status the operator writes)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpuhealth.agent.model import (
    DeviceFacts,
    EccCounts,
    NvmlStatus,
    RemappedRows,
    RetiredPages,
    Snapshot,
    Temperature,
    XidEvent,
)
from gpuhealth.agent.report import AgentInfo, ReportBuilder, rfc3339
from gpuhealth.api.status import Record, node_status
from hack.memprobe import mig as memprobe_mig

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
PODS_PER_NODE = 8
GPUS = 8


def policy_body() -> dict[str, Any]:
    return {
        "apiVersion": "gpuhealth.dev/v1alpha1",
        "kind": "GPUHealthPolicy",
        "metadata": {"name": "fleet", "uid": "uid-fleet", "generation": 1, "resourceVersion": "1"},
        "spec": {"nodeSelector": {"matchLabels": {"nvidia.com/gpu.present": "true"}}, "maxUnhealthy": "10%"},
    }


def node_body(i: int) -> dict[str, Any]:
    """A GPU Node as KWOK's fake nodes and the API server's watch deliver it."""
    name = f"gpu-node-{i:05d}"
    t = rfc3339(T0)
    cond = [
        {"type": c, "status": s, "reason": r, "message": m, "lastHeartbeatTime": t, "lastTransitionTime": t}
        for c, s, r, m in (
            ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            ("NetworkUnavailable", "False", "RouteCreated", "RouteController created a route"),
        )
    ]
    resources = {
        "cpu": "96",
        "memory": "1056Gi",
        "pods": "110",
        "ephemeral-storage": "3500Gi",
        "nvidia.com/gpu": str(GPUS),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"6f1c2d9e-0000-4000-8000-{i:012d}",
            "resourceVersion": str(1000 + i),
            "creationTimestamp": t,
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/role": "agent",
                "node-role.kubernetes.io/agent": "",
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "topology.kubernetes.io/region": "us-east-1",
                "topology.kubernetes.io/zone": f"us-east-1{'abcd'[i % 4]}",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.count": str(GPUS),
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.memory": "81559",
                "pool": f"pool-{i % 16}",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "kwok.x-k8s.io/node": "fake",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "managedFields": [
                {
                    "manager": m,
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": t,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {f'k:{{"type":"{c["type"]}"}}': {} for c in cond}}},
                }
                for m in ("kwok", "kube-controller-manager", "kubectl")
            ],
        },
        "spec": {"providerID": f"kwok://{name}", "podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24"},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": cond,
            "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 256 % 256}.{i % 256}"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "kubeletVersion": "fake",
                "kubeProxyVersion": "fake",
                "operatingSystem": "linux",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "containerRuntimeVersion": "",
                "kernelVersion": "",
                "osImage": "",
            },
            "images": [{"names": [f"registry.example/train:{v}"], "sizeBytes": 9_000_000_000} for v in range(3)],
        },
    }


def report_body(i: int, node: str, mig: bool = False) -> dict[str, Any]:
    """The agent's report as its ReportBuilder renders it, with the status the operator writes."""
    builder = ReportBuilder(node, AgentInfo(version="0.9.0", sources=("nvml",), boot_time=T0))
    devices = tuple(
        DeviceFacts(
            index=g,
            uuid=f"GPU-{i:08x}-{g:04x}-4000-8000-{i * GPUS + g:012x}",
            pci_bus_id=f"00000000:{0x18 + g * 0x10:02X}:00.0",
            model="NVIDIA H100 80GB HBM3",
            ecc_mode="Enabled",
            ecc=EccCounts(0, (i + g) % 7, 0, (i * g) % 31),
            retired_pages=RetiredPages(0, 0, False),
            remapped_rows=RemappedRows(g % 3, 0, False, False),
            temperature=Temperature(40 + (i + g) % 30, 87, 92),
            clock_event_reasons=0,
            power_w=300.0 + g,
        )
        for g in range(GPUS)
    )
    if mig:
        devices = memprobe_mig.with_mig(i, devices)
    # A few application XIDs in history, as a busy fleet has (bounded by the agent's own limit).
    for k in range(i % 4):
        builder.add_xid(XidEvent(xid=13, time=T0 + dt.timedelta(minutes=k), source="nvml", gpu=k, detail="pid=1"))
    snap = Snapshot(time=T0, nvml=NvmlStatus(True, driver_version="570.86.15", cuda_version="12.8"), devices=devices)
    spec = builder.render(snap, T0)
    status = node_status(
        Record(since=T0, healthy_since=T0),
        policy="fleet",
        overridden=[],
        dry_run=False,
        total_gpus=GPUS,
        healthy_gpus=GPUS,
        last_xid="",
        evidence=[],
        pending={},
        in_service_gpus=GPUS,
    )
    return {
        "apiVersion": "gpuhealth.dev/v1alpha1",
        "kind": "GPUNodeHealth",
        "metadata": {
            "name": node,
            "uid": f"8a2b-{i:012d}",
            "resourceVersion": str(500_000 + i),
            "generation": 1,
            "creationTimestamp": rfc3339(T0),
            "managedFields": [{"manager": "gpuhealth-agent", "operation": "Update", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": spec,
        "status": {k: v for k, v in status.items() if v is not None},  # as stored: a merge patch's nulls drop keys
    }


def lease_body(i: int, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": node, "namespace": "gpuhealth-system", "uid": f"lease-{i}", "resourceVersion": str(i)},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": "2026-11-30T12:00:00.000000Z"},
    }


def pod_body(i: int, k: int, node: str) -> dict[str, Any]:
    job = f"train-{i // 4:05d}"
    t = rfc3339(T0)
    return {
        "metadata": {
            "name": f"{job}-rank-{i % 4 * PODS_PER_NODE + k}",
            "namespace": "training",
            "uid": f"3d2a7c55-{k:04d}-4000-8000-{i:012d}",
            "resourceVersion": str(2_000_000 + i * PODS_PER_NODE + k),
            # As the Job controller labels an indexed Job's pods: the index makes each pod's labels its own.
            "labels": {
                "app": "llm-train",
                "job-name": job,
                "batch.kubernetes.io/job-name": job,
                "controller-uid": f"0b6f3c1e-0000-4000-8000-{i // 4:012d}",
                "batch.kubernetes.io/controller-uid": f"0b6f3c1e-0000-4000-8000-{i // 4:012d}",
                "batch.kubernetes.io/job-completion-index": str(i % 4 * PODS_PER_NODE + k),
            },
            "annotations": {
                "gpuhealth.dev/checkpoint": "signal",
                "batch.kubernetes.io/job-completion-index": str(i % 4 * PODS_PER_NODE + k),
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job,
                    "uid": f"0b6f3c1e-0000-4000-8000-{i // 4:012d}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "trainer", "image": "registry.example/train:1", "resources": {}}],
        },
        "status": {
            "phase": "Running",
            "startTime": t,
            "podIP": f"10.1.{i % 256}.{k}",
            "containerStatuses": [
                {"name": "trainer", "restartCount": 0, "ready": True, "state": {"running": {"startedAt": t}}}
            ],
        },
    }
