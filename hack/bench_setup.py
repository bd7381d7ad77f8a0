"""The setting of `make bench`: the control plane with faster clients, the machine it ran on, the policy
under test and the running pods.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from tests.support.cluster import LocalCluster
from tests.support.k8s import wait_for

from gpuhealth.api.durations import format_duration
from hack.bench_support import log

# Local control-plane clients default to 20 (controller-manager) and 50 (scheduler) requests per second, which
# makes creating 8,000 pods take many minutes; the bench raises them. Nothing of gpuhealth's is tuned.
CONTROL_PLANE_ARGS = {
    "kube-controller-manager": ["--kube-api-qps=300", "--kube-api-burst=600", "--concurrent-replicaset-syncs=10"],
    "kube-scheduler": ["--kube-api-qps=300", "--kube-api-burst=600"],
}


class BenchCluster(LocalCluster):
    """The test control plane, with faster control-plane clients for creating thousands of pods."""

    def _proc(self, name: str, args: list[str]) -> Any:
        return super()._proc(name, [*args, *CONTROL_PLANE_ARGS.get(name, [])])


def machine() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    osname = platform.platform()
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                osname = f"{line.split('=', 1)[1].strip(chr(34))}, Linux {platform.release()}"
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {mem_gib:.0f} GiB RAM, {osname}"


def agent_silence(heartbeat_s: float) -> str:
    """The policy's agentSilence.after: 2 minutes, or four heartbeats where those are longer."""
    return format_duration(max(120, math.ceil(4 * heartbeat_s)))


def policy_spec(max_unhealthy: str, heartbeat_s: float = 30.0) -> dict[str, Any]:
    return {
        "nodeSelector": {
            "matchLabels": {"nvidia.com/gpu.present": "true"},
            "matchExpressions": [
                {"key": "bench-floor", "operator": "DoesNotExist"},
                {"key": "bench-agent", "operator": "DoesNotExist"},
            ],
        },
        "mode": "Enforce",
        "rules": {
            "xid": {"overrides": [{"code": 79, "action": "cordon"}]},
            "agentSilence": {"after": agent_silence(heartbeat_s)},
        },
        # Device scope (the default, stated): an uncorrected ECC error on a DRA node takes out that GPU only.
        # The GPU budget is the whole fleet's GPUs, so no device storm is ever held back by it.
        "devices": {"scope": "Device"},
        "safety": {"maxUnhealthy": max_unhealthy, "maxUnhealthyGPUs": "100%", "probation": "2s"},
    }


def agent_policy_spec(heartbeat_s: float = 30.0) -> dict[str, Any]:
    """The real agents' nodes under a policy of their own: the same rules, no breaker limit.

    Their faults (the end-to-end figure) then neither count against nor move the fleet policy's breaker.
    """
    spec = policy_spec("100%", heartbeat_s)
    spec["nodeSelector"] = {"matchLabels": {"nvidia.com/gpu.present": "true", "bench-agent": "true"}}
    return spec


def deployments(pods: int, per: int = 200) -> list[dict[str, Any]]:
    """Deployments of 1-GPU pods, kept off the floor and agent nodes."""
    out = []
    count = max(1, math.ceil(pods / per))
    for i in range(count):
        replicas = pods // count + (1 if i < pods % count else 0)
        labels = {"app": f"train-{i:03d}"}
        out.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": f"train-{i:03d}", "namespace": "bench"},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "containers": [
                                {
                                    "name": "train",
                                    "image": "train:latest",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                }
                            ],
                            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                            "affinity": {
                                "nodeAffinity": {
                                    "requiredDuringSchedulingIgnoredDuringExecution": {
                                        "nodeSelectorTerms": [
                                            {
                                                "matchExpressions": [
                                                    {"key": "bench-floor", "operator": "DoesNotExist"},
                                                    {"key": "bench-agent", "operator": "DoesNotExist"},
                                                ]
                                            }
                                        ]
                                    }
                                }
                            },
                            "terminationGracePeriodSeconds": 0,
                        },
                    },
                },
            }
        )
    return out


def count_running(core: client.CoreV1Api, namespace: str) -> int:
    """Pods in phase Running (KWOK sometimes leaves a running pod's Ready condition False)."""
    running, cont = 0, None
    while True:
        kw: dict[str, Any] = {"field_selector": "status.phase=Running", "limit": 2000, "_preload_content": False}
        if cont:
            kw["_continue"] = cont
        data = json.loads(core.list_namespaced_pod(namespace, **kw).data)
        running += len(data.get("items") or [])
        cont = (data.get("metadata") or {}).get("continue")
        if not cont:
            return running


def run_pods(cluster: LocalCluster, apps: client.AppsV1Api, core: client.CoreV1Api, pods: int) -> int:
    cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}}])
    wait_for(lambda: core.read_namespaced_service_account("default", "bench"), what="namespace bench ready")
    cluster.apply_objects(deployments(pods))
    deadline = time.monotonic() + max(300.0, pods * 0.15)
    running, last_print, last_count = 0, 0.0, time.monotonic()
    while time.monotonic() < deadline:
        # Deployment status is cheap to poll; the (expensive) pod count once it is nearly done, or every
        # 30 s (KWOK may leave running pods not Ready, so readiness alone can stall).
        data = json.loads(apps.list_namespaced_deployment("bench", _preload_content=False).data)
        ready = sum(int((d.get("status") or {}).get("readyReplicas") or 0) for d in data["items"])
        if ready >= 0.98 * pods or time.monotonic() - last_count > 30:
            running, last_count = count_running(core, "bench"), time.monotonic()
        if time.monotonic() - last_print > 10 or running >= pods:
            log(f"  pods ready: {ready}/{pods}, running: {running or '-'}")
            last_print = time.monotonic()
        if running >= pods:
            break
        time.sleep(3)
    return running or count_running(core, "bench")
