"""What every story of the demo shares: where it writes, the policy, the timeline, the Node watch and
the pods' checkpointing sidecar."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import watch

from devkit.k8s import Kube

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "build" / "demo"
TAINT = "gpuhealth.dev/unhealthy"
NS = "ml"
REMEDIATION_NS = "gpuhealth-remediation"
MANAGED = "app.kubernetes.io/managed-by=gpuhealth"
# The apps whose pods run the checkpoint sidecar (act_as_trainer acknowledges for them).
CHECKPOINTING_APPS = ("llm-pretrain", "dra-serving", "mig-serving", "reset-serving")

DEMO_POLICY: dict[str, Any] = {
    # The NVLink domain's nodes (hack/demo/fabric.py) have a policy of their own.
    "nodeSelector": {
        "matchLabels": {"nvidia.com/gpu.present": "true"},
        "matchExpressions": [{"key": "nvidia.com/gpu.clique", "operator": "DoesNotExist"}],
    },
    "mode": "Enforce",
    "rules": {
        "thermal": {"sustainedFor": "8s", "temperatureThresholdC": 90, "action": "drain"},
        "agentSilence": {"after": "30s"},
    },
    # The GPU budget is left unset: the node budget in GPUs (2 of 8 nodes, 16 GPUs), so the node
    # quarantine (8 GPUs) leaves room for the three GPU quarantines. Probation is short so that the
    # reset GPU is back within the demo.
    "safety": {"maxUnhealthy": "25%", "probation": "10s"},
    # The repair ladder: a fault a reset clears (the uncorrected ECC) gets a reset Job; faults with
    # no ladder in the catalog (heat, a failed row remap) are held and reported.
    "remediation": {"enabled": True},
    # Proof before return: the reset GPU returns only after a validation Job (the default DCGM diag,
    # ended by KWOK's stage with a DCGM pass, devkit/kwok/pod-validation.yaml) passed on it.
    "validation": {"enabled": True, "level": 2},
}


class Timeline:
    """What the operator saw and did, from independent watches on the cluster."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.rows: list[tuple[float, str]] = []
        self.taint_seen: dict[str, float] = {}
        self.lock = threading.Lock()

    def add(self, text: str, at: float | None = None) -> None:
        with self.lock:
            self.rows.append(((at or time.time()) - self.start, text))

    def print(self) -> None:
        print("\n== Timeline (seconds since the agents started) ==")
        for t, text in sorted(self.rows):
            print(f"  {t:7.2f}s  {text}")


def watch_nodes(kube: Kube, timeline: Timeline, stop: threading.Event) -> None:
    last: dict[str, tuple[str, bool, bool]] = {}
    w = watch.Watch()
    while not stop.is_set():
        try:
            for ev in w.stream(kube.core.list_node, label_selector="nvidia.com/gpu.present=true", timeout_seconds=5):
                node = ev["object"]
                name = node.metadata.name
                taint = next((t for t in node.spec.taints or [] if t.key == TAINT), None)
                state = (node.metadata.labels or {}).get("gpuhealth.dev/state", "-")
                key = (state, taint is not None, bool(node.spec.unschedulable))
                if last.get(name) != key:
                    if taint is not None and name not in timeline.taint_seen:
                        timeline.taint_seen[name] = time.time()
                        timeline.add(
                            f"{name}: tainted {TAINT}={taint.value}:{taint.effect}"
                            f"{', cordoned' if node.spec.unschedulable else ''}"
                        )
                    if last.get(name, ("",))[0] != state and state != "-":
                        timeline.add(f"{name}: state -> {state}")
                    last[name] = key
                if stop.is_set():
                    break
        except Exception:
            time.sleep(0.5)


def pods_of(kube: Kube, app: str) -> list[Any]:
    """The app's pods that are not being deleted."""
    pods = kube.core.list_namespaced_pod(NS, label_selector=f"app={app}").items
    return [p for p in pods if not p.metadata.deletion_timestamp]


def running(kube: Kube, app: str) -> list[Any]:
    return [p for p in pods_of(kube, app) if p.status.phase == "Running"]


def act_as_trainer(
    kube: Kube, timeline: Timeline, stop: threading.Event, acked: set[str], apps: tuple[str, ...] = CHECKPOINTING_APPS
) -> None:
    """Each pod's sidecar: see the request (downward-API file), save a checkpoint, acknowledge.
    ``apps``: whose pods (a story with its own gang counts its acknowledgements apart)."""
    from gpuhealth.workload import CheckpointRequest, acknowledge

    files = OUT / "podinfo"
    files.mkdir(exist_ok=True)
    while not stop.is_set():
        try:
            pods = [p for app in apps for p in pods_of(kube, app)]
        except Exception:
            time.sleep(0.5)
            continue
        for p in pods:
            ann = p.metadata.annotations or {}
            if p.metadata.name in acked or "gpuhealth.dev/checkpoint-requested" not in ann:
                continue
            f = files / p.metadata.name  # what the kubelet's downward-API volume would show the pod
            f.write_text("\n".join(f"{k}={json.dumps(v)}" for k, v in ann.items()))
            if CheckpointRequest(annotations_file=f).pending():
                time.sleep(0.3)  # "saving the checkpoint"
                acknowledge(NS, p.metadata.name, kube.api)
                acked.add(p.metadata.name)
                timeline.add(f"{p.spec.node_name}: {p.metadata.name} saved its checkpoint and acknowledged")
        time.sleep(0.2)


def claim_deployment(name: str, template: str, node: str, replicas: int) -> dict[str, Any]:
    """``replicas`` checkpointing pods on ``node``, each with one device from a claim of ``template``."""
    from devkit import dra

    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": {"gpuhealth.dev/checkpoint": "annotation"}},
                "spec": dra.claim_pod(NS, "x", template, node)["spec"],
            },
        },
    }


def allocated(kube: Kube, pod: Any) -> list[str]:
    """The DRA devices the scheduler allocated to ``pod`` (empty while it has none)."""
    from devkit import dra

    claim = dra.pod_claim(kube, NS, pod.metadata.name)
    return dra.allocated_devices(claim) if claim else []


def devices_of(kube: Kube, node: str) -> dict[int, dict[str, Any]]:
    """GPUNodeHealth ``status.devices`` of ``node`` by GPU index."""
    devs = (kube.report(node).get("status") or {}).get("devices") or []
    return {int(d["index"]): d for d in devs}


def gpuhealth_rules(kube: Kube) -> list[dict[str, Any]]:
    """gpuhealth's DeviceTaintRules (by its label)."""
    from devkit import dra

    got = kube.custom.list_cluster_custom_object(dra.G, dra.V, "devicetaintrules", label_selector=MANAGED)
    return list(got.get("items") or [])


def slice_devices(kube: Kube) -> list[tuple[str, str, str]]:
    """(pool, device name, type) of every device in the ResourceSlices."""
    from devkit import dra

    out = []
    for s in kube.custom.list_cluster_custom_object(dra.G, dra.V, "resourceslices").get("items") or []:
        pool = s["spec"]["pool"]["name"]
        for d in s["spec"].get("devices") or []:
            kind = ((d.get("attributes") or {}).get("type") or {}).get("string", "")
            out.append((pool, d["name"], kind))
    return out
