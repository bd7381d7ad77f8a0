"""The setting of `make bench`: the control plane with faster clients, the machine it ran on, the policy
under test and the running pods.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from devkit.cluster import LocalCluster
from devkit.k8s import wait_for
from gpuhealth.api.durations import format_duration
from hack.bench.support import log, publish_all

METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

# Local control-plane clients default to 20 (controller-manager) and 50 (scheduler) requests per second, which
# makes creating 8,000 pods take many minutes; the bench raises them. Nothing of gpuhealth's is tuned.
CONTROL_PLANE_ARGS = {
    "kube-controller-manager": ["--kube-api-qps=500", "--kube-api-burst=1000", "--concurrent-replicaset-syncs=20"],
    "kube-scheduler": ["--kube-api-qps=300", "--kube-api-burst=600"],
}


# KWOK plays each pod's stages on a few workers by default, about 50 status patches a second on this machine: the
# bottleneck once pods are created bound to their nodes. More workers, and the single-patch "fast" pod stage
# KWOK's own scale tests use (Pending straight to Running, no ContainerCreating patch and Event) in place of
# the general pod-create and pod-ready stages. Pods still end Running; nothing of gpuhealth is involved.
KWOK_CONFIG = """apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: 32
  nodePlayStageParallelism: 8
  nodeLeaseParallelism: 8
  podsOnNodeSyncParallelism: 8
"""
KWOK_FAST_PODS = {"pod/general/pod-create.yaml": None, "pod/general/pod-ready.yaml": "pod/fast/pod-ready.yaml"}


def kwok_args(args: list[str], config: Path) -> list[str]:
    """KWOK's arguments with the bench's configuration added and the fast pod stage in place of the general."""
    out = []
    for a in args:
        for general, fast in KWOK_FAST_PODS.items():
            if a.startswith("--config=") and a.endswith(general):
                a = "" if fast is None else a[: -len(general)] + fast
        if a:
            out.append(a)
    return [*out, f"--config={config}"]


def kubelet_lease_args(name: str, lease_s: int) -> list[str]:
    """KWOK's node Lease duration (it renews every quarter of it, as a kubelet does) and the node
    controller's grace period to match; nothing for the other processes. Later flags win."""
    if name == "kwok":
        return [f"--node-lease-duration-seconds={lease_s}"]
    if name == "kube-controller-manager":
        return [f"--node-monitor-grace-period={max(60, lease_s * 3 // 2)}s"]
    return []


@dataclass
class BenchCluster(LocalCluster):
    """The test control plane, with faster control-plane clients and KWOK for creating thousands of pods.

    ``kubelet_lease_s``: the emulated kubelets' node Lease duration. A kubelet's default is 40 s,
    renewed every 10 s: at 10,000 KWOK nodes that is a thousand Lease writes a second, three times
    the gpuhealth agents' own heartbeats, all on the same 2-core API server. A longer lease (the
    10k profile's) keeps the emulated kubelets from taking the API server that the measured fleet's
    heartbeats need; nothing gpuhealth reads or writes changes.
    """

    kubelet_lease_s: int = 40

    def _proc(self, name: str, args: list[str]) -> Any:
        if name == "kwok":
            config = self.workdir / "kwok-bench.yaml"
            config.write_text(KWOK_CONFIG)
            args = kwok_args(args, config)
        extra = kubelet_lease_args(name, self.kubelet_lease_s) if self.kubelet_lease_s != 40 else []
        return super()._proc(name, [*args, *CONTROL_PLANE_ARGS.get(name, []), *extra])


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


def breaker_setting(nodes: int, storm: int) -> tuple[int | str, int]:
    """The breaker phase's ``maxUnhealthy`` and the limit it gives: 5% of the nodes, as at 1,000 nodes
    (limit 50 under a storm of 100), unless 5% is not below the storm (10,000 nodes: 500 against 100),
    where the breaker would never hold a node back; then an absolute half of the storm.
    """
    limit = math.ceil(nodes * 5 / 100)
    if limit < storm:
        return "5%", limit
    return storm // 2, storm // 2


def agent_policy_spec(heartbeat_s: float = 30.0) -> dict[str, Any]:
    """The real agents' nodes under a policy of their own: the same rules, no breaker limit.

    Their faults (the end-to-end figure) then neither count against nor move the fleet policy's breaker.
    """
    spec = policy_spec("100%", heartbeat_s)
    spec["nodeSelector"] = {"matchLabels": {"nvidia.com/gpu.present": "true", "bench-agent": "true"}}
    return spec


def pods_per_node(pods: int, nodes: int) -> list[int]:
    """How many pods each node runs: ``pods`` spread over ``nodes`` as evenly as whole pods allow."""
    if nodes <= 0:
        return []
    return [pods // nodes + (1 if i < pods % nodes else 0) for i in range(nodes)]


def replica_set(node: str, replicas: int) -> dict[str, Any]:
    """A ReplicaSet whose 1-GPU pods are bound to ``node`` already (``spec.nodeName`` in the template).

    KWOK's own scale tests place pods this way: the scheduler is not involved, so placement does not slow
    down as the fleet grows (scheduling 1-GPU pods over 3,000 nodes ran at ~8 pods/s). The pods are
    still owned as a Deployment's would be, through a ReplicaSet as their controller, and still request
    ``nvidia.com/gpu: 1``; the ReplicaSet controller creates them and KWOK marks them Running.
    """
    labels = {"app": f"train-{node}"}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": f"train-{node}", "namespace": "bench", "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeName": node,
                    "containers": [
                        {"name": "train", "image": "train:latest", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                    ],
                    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                    "terminationGracePeriodSeconds": 0,
                },
            },
        },
    }


def replica_sets(pods: int, nodes: Sequence[str]) -> list[dict[str, Any]]:
    """One ReplicaSet per node that runs pods (at most 8 per node: one per GPU)."""
    return [replica_set(n, k) for n, k in zip(nodes, pods_per_node(pods, len(nodes)), strict=True) if k > 0]


def count_running(core: client.CoreV1Api, namespace: str) -> int:
    """Pods in phase Running (KWOK sometimes leaves a running pod's Ready condition False).

    Listed as metadata only (PartialObjectMetadataList): 80,000 full pods would be hundreds of MB a count.
    """
    running, cont = 0, None
    while True:
        kw: dict[str, Any] = {
            "field_selector": "status.phase=Running",
            "limit": 5000,
            "_preload_content": False,
            "_headers": {"Accept": METADATA_ONLY},
        }
        if cont:
            kw["_continue"] = cont
        data = json.loads(core.list_namespaced_pod(namespace, **kw).data)
        running += len(data.get("items") or [])
        cont = (data.get("metadata") or {}).get("continue")
        if not cont:
            return running


def run_pods(
    cluster: LocalCluster,
    apps: client.AppsV1Api,
    core: client.CoreV1Api,
    pods: int,
    nodes: Sequence[str],
    pool: ThreadPoolExecutor,
) -> int:
    """Create the pods already bound to ``nodes`` (one ReplicaSet per node) and wait until they are Running."""
    cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}}])
    wait_for(lambda: core.read_namespaced_service_account("default", "bench"), what="namespace bench ready")

    def create(rs: dict[str, Any]) -> None:
        try:
            apps.create_namespaced_replica_set("bench", rs)
        except client.ApiException as e:
            if e.status != 409:  # already there: creating is idempotent
                raise

    sets = replica_sets(pods, nodes)
    failed = publish_all(pool, create, sets)
    if failed:
        raise RuntimeError(f"{failed} of {len(sets)} ReplicaSets could not be created")
    deadline = time.monotonic() + max(300.0, pods * 0.05)
    running, last_print = 0, 0.0
    while time.monotonic() < deadline:
        running = count_running(core, "bench")
        if time.monotonic() - last_print > 10 or running >= pods:
            log(f"  pods running: {running}/{pods}")
            last_print = time.monotonic()
        if running >= pods:
            break
        time.sleep(3 if pods < 20000 else 10)
    return running
