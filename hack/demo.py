#!/usr/bin/env python3
"""`make demo`: gpuhealth end to end on a local control plane with 8 fake GPU nodes.

Real agents (one per node, reading a fake NVML library) report to the real API server; the real
operator decides and acts. Faults are injected into the fake NVML: an XID 79 on one node (the whole
node goes), a sustained thermal slowdown on GPU 2 of a DRA node (only that GPU goes: a
DeviceTaintRule, and only the pod holding it checkpoints and moves; the real scheduler keeps its
replacement off GPU 2), and an application XID that must be ignored.
Prints a timeline, `kubectl get gpuhealth`, `kubectl get gpunodes` and the Node events, and writes
build/demo/summary.json. `--keep` leaves everything running for exploring.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import watch
from tests.support import dra, pidfile
from tests.support.agents import AgentFleet
from tests.support.cluster import LocalCluster
from tests.support.k8s import Kube, OperatorProcess, wait_for
from tests.support.workloads import indexed_training_job

REPO = Path(__file__).resolve().parents[1]

OUT = REPO / "build" / "demo"
TAINT = "gpuhealth.dev/unhealthy"

DEMO_POLICY = {
    "nodeSelector": {"matchLabels": {"nvidia.com/gpu.present": "true"}},
    "mode": "Enforce",
    "rules": {
        "thermal": {"sustainedFor": "8s", "temperatureThresholdC": 90, "action": "drain"},
        "agentSilence": {"after": "30s"},
    },
    # The GPU budget is left unset: the node budget in GPUs (2 of 8 nodes, 16 GPUs), so the node
    # quarantine (8 GPUs) leaves room for the GPU quarantines.
    "safety": {"maxUnhealthy": "25%", "probation": "1m"},
}


class Timeline:
    """What the operator saw and did, from an independent watch on the Nodes."""

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


def training_ranks(kube: Kube, app: str = "llm-pretrain") -> list[Any]:
    pods = kube.core.list_namespaced_pod("ml", label_selector=f"app={app}").items
    return [p for p in pods if not p.metadata.deletion_timestamp]


def dra_serving(node: str) -> list[dict[str, Any]]:
    """Eight 1-GPU pods on ``node`` whose GPUs come from DRA claims (the real scheduler allocates them)."""
    pod_spec = dra.claim_pod("ml", "x", "one-gpu", node)["spec"]
    return [
        dra.claim_template("ml", "one-gpu", 1),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "dra-serving", "namespace": "ml"},
            "spec": {
                "replicas": 8,
                "selector": {"matchLabels": {"app": "dra-serving"}},
                "template": {
                    "metadata": {
                        "labels": {"app": "dra-serving"},
                        "annotations": {"gpuhealth.dev/checkpoint": "annotation"},
                    },
                    "spec": pod_spec,
                },
            },
        },
    ]


def act_as_trainer(kube: Kube, timeline: Timeline, stop: threading.Event, acked: set[str]) -> None:
    """Each rank's sidecar: see the request (downward-API file), save a checkpoint, acknowledge."""
    from gpuhealth.workload import CheckpointRequest, acknowledge

    files = OUT / "podinfo"
    files.mkdir(exist_ok=True)
    while not stop.is_set():
        for p in training_ranks(kube) + training_ranks(kube, "dra-serving"):
            ann = p.metadata.annotations or {}
            if p.metadata.name in acked or "gpuhealth.dev/checkpoint-requested" not in ann:
                continue
            f = files / p.metadata.name  # what the kubelet's downward-API volume would show the pod
            f.write_text("\n".join(f"{k}={json.dumps(v)}" for k, v in ann.items()))
            if CheckpointRequest(annotations_file=f).pending():
                time.sleep(0.3)  # "saving the checkpoint"
                acknowledge("ml", p.metadata.name, kube.api)
                acked.add(p.metadata.name)
                timeline.add(f"{p.spec.node_name}: {p.metadata.name} saved its checkpoint and acknowledged")
        time.sleep(0.2)


def run_workloads(cluster: LocalCluster, kube: Kube, training_node: str) -> None:
    """GPU work: a checkpointing training job (4 ranks) on one node, an inference Deployment on the rest."""
    cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}])
    wait_for(lambda: kube.core.read_namespaced_service_account("default", "ml"), what="namespace ready")
    cluster.apply_objects(
        [indexed_training_job("llm-pretrain", training_node, image="llm-trainer:1.4", namespace="ml")]
    )
    wait_for(
        lambda: len([p for p in training_ranks(kube) if p.status.phase == "Running"]) == 4,
        timeout=90,
        what="training ranks running",
    )
    cluster.apply_objects(
        [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "inference", "namespace": "ml"},
                "spec": {
                    "replicas": 8,
                    "selector": {"matchLabels": {"app": "inference"}},
                    "template": {
                        "metadata": {"labels": {"app": "inference"}},
                        "spec": {
                            "containers": [
                                {
                                    "name": "server",
                                    "image": "inference:latest",
                                    "resources": {"limits": {"nvidia.com/gpu": "4"}},
                                }
                            ],
                        },
                    },
                },
            }
        ]
    )
    wait_for(
        lambda: (
            sum(
                1
                for p in kube.core.list_namespaced_pod("ml", label_selector="app=inference").items
                if p.status.phase == "Running"
            )
            >= 8
        ),
        timeout=90,
        what="inference pods running",
    )


def keep_for_cluster_down(cluster: LocalCluster, operator: OperatorProcess | None, agents: AgentFleet | None) -> None:
    """Record everything left running (control plane, operator, agents) where `make cluster-down` looks."""
    extra = {"operator": operator.popen.pid} if operator and operator.popen else {}
    if agents:
        extra.update({f"agent/{n}": a.popen.pid for n, a in agents.agents.items() if a.popen})
    pidfile.hand_over(cluster.workdir, OUT.parent / "cluster", extra)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="leave the cluster, operator and agents running")
    ap.add_argument("--nodes", type=int, default=8)
    args = ap.parse_args()

    if (OUT.parent / "cluster" / pidfile.PIDFILE).exists():
        print("a local cluster (or a kept demo) is still running; `make cluster-down` first")
        return 1
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    print(f"== Starting a local control plane with {args.nodes} fake GPU nodes (logs in {OUT}) ==")
    cluster = LocalCluster(OUT / "cluster", nodes=args.nodes).start()
    kube = Kube(cluster.kubeconfig)
    nodes = sorted(n.metadata.name for n in kube.core.list_node(label_selector="nvidia.com/gpu.present=true").items)
    operator = agents = None
    stop = threading.Event()
    try:
        kube.apply_policy("demo-fleet", DEMO_POLICY)
        operator = OperatorProcess(cluster, OUT / "operator.log").start()
        print("== Operator running; starting one real agent per node (fake NVML) ==")
        t0 = time.time()
        timeline = Timeline(t0)
        threading.Thread(target=watch_nodes, args=(kube, timeline, stop), daemon=True).start()
        agents = AgentFleet(cluster.kubeconfig, OUT / "agents").start(nodes)
        wait_for(lambda: all(kube.state(n) == "Healthy" for n in nodes), timeout=60, what="all nodes Healthy")
        timeline.add(f"all {len(nodes)} nodes reported by their agents and Healthy")
        xid_node, hot_node, app_node = nodes[0], nodes[1], nodes[2]
        print("== Running GPU workloads ==")
        run_workloads(cluster, kube, xid_node)
        dra.publish_device_classes(kube)
        dra.publish_slices(kube, [hot_node])  # a DRA driver publishes its GPUs (the fake NVML's UUIDs)
        cluster.apply_objects(dra_serving(hot_node))
        wait_for(
            lambda: len([p for p in training_ranks(kube, "dra-serving") if p.status.phase == "Running"]) == 8,
            timeout=90,
            what="DRA serving pods running",
        )
        timeline.add(f"{hot_node}: DRA node; 8 serving pods, one GPU each from a ResourceClaim")
        before = {p.metadata.name for p in training_ranks(kube)}
        timeline.add(f"training job llm-pretrain: 4 ranks (2 GPUs each) on {xid_node}, checkpoint mode: annotation")
        timeline.add("8 inference pods running (4 GPUs each)")
        acked: set[str] = set()
        threading.Thread(target=act_as_trainer, args=(kube, timeline, stop, acked), daemon=True).start()
        print(
            f"== Injecting faults: XID 79 on {xid_node}, thermal slowdown on {hot_node}, "
            f"application XID 13 on {app_node} =="
        )
        injected: dict[str, float] = {}
        injected[xid_node] = time.time()
        agents[xid_node].inject_xid(gpu=3, code=79)
        timeline.add(f"{xid_node}: fault injected: XID 79 on GPU 3 (fallen off the bus)", injected[xid_node])
        injected[app_node] = time.time()
        agents[app_node].inject_xid(gpu=1, code=13)
        timeline.add(f"{app_node}: fault injected: XID 13 on GPU 1 (application error)", injected[app_node])
        injected[hot_node] = time.time()
        agents[hot_node].set("gpu 2 temp 93")
        agents[hot_node].set("gpu 2 clock_reasons 0x40")
        timeline.add(
            f"{hot_node}: fault injected: GPU 2 at 93C with HW thermal slowdown (policy: sustained 8s)",
            injected[hot_node],
        )

        rule = f"gpuhealth-{hot_node}-gpu-2"

        def rule_seen() -> bool:
            kube.custom.get_cluster_custom_object(dra.G, dra.V, "devicetaintrules", rule)
            timeline.taint_seen.setdefault(hot_node, time.time())  # polled: within 0.2s of its creation
            return True

        wait_for(rule_seen, timeout=60, what="GPU 2 of the hot node held out by a DeviceTaintRule")
        timeline.add(f"{hot_node}: DeviceTaintRule {rule} (gpu-2 only, NoSchedule); node not tainted")
        wait_for(lambda: xid_node in timeline.taint_seen, timeout=60, what="the XID 79 node quarantined")
        moved = wait_for(
            lambda: (
                len(
                    r := [
                        p for p in training_ranks(kube) if p.status.phase == "Running" and p.spec.node_name != xid_node
                    ]
                )
                == 4
                and r
            ),
            timeout=90,
            what="training ranks running again on healthy nodes",
        )
        timeline.add("training job: 4 ranks running again on " + ", ".join(sorted({p.spec.node_name for p in moved})))
        wait_for(lambda: kube.state(xid_node) == "Quarantined", timeout=30, what="drain finished")

        def gpu2_state() -> str:
            devs = (kube.report(hot_node).get("status") or {}).get("devices") or []
            return str(next((d["state"] for d in devs if d["index"] == 2), ""))

        wait_for(lambda: gpu2_state() == "Quarantined", timeout=60, what="the pod on GPU 2 moved")
        serving = training_ranks(kube, "dra-serving")
        pending = [p.metadata.name for p in serving if not p.spec.node_name]
        timeline.add(
            f"{hot_node}: the pod on GPU 2 checkpointed and was evicted; its replacement stays Pending "
            f"({len(pending)}): the scheduler does not allocate the tainted GPU; 7 pods serve on"
        )
        time.sleep(3)
        app_taint = kube.our_taint(app_node)
        app_report = kube.report(app_node)
        timeline.add(
            f"{app_node}: still {app_report['status']['state']}, last XID "
            f"{app_report['status'].get('lastXid')}: the application XID was ignored"
        )
        stop.set()
        timeline.print()
        print("\n== kubectl get gpuhealth ==")
        print(cluster.kubectl("get", "gpuhealth").stdout)
        print("== kubectl get gpunodes ==")
        print(cluster.kubectl("get", "gpunodes").stdout)
        print("== Node events from gpuhealth ==")
        events = [
            e
            for e in kube.core.list_namespaced_event("default").items
            if e.source and e.source.component == "gpuhealth-operator"
        ]
        for e in sorted(events, key=lambda e: e.event_time or e.first_timestamp):
            print(f"  {e.involved_object.kind}/{e.involved_object.name}  {e.type:7s} {e.reason}: {e.message}")

        quarantined = sorted(n for n in nodes if kube.our_taint(n) is not None)
        statuses = {n: kube.report(n).get("status") or {} for n in nodes}
        devices_out = [
            {"node": n, "gpu": d["index"], "state": d["state"], "reason": d.get("reason"), "rule": d.get("taintRule")}
            for n, st in statuses.items()
            for d in st.get("devices") or []
            if d.get("state") != "InService"
        ]
        device_nodes = {d["node"] for d in devices_out} - set(quarantined)
        # The drains on both faulted nodes: the XID node's four ranks and the DRA node's pod on GPU 2.
        node_events = [e for e in events if e.involved_object.name in (xid_node, hot_node)]
        summary: dict[str, Any] = {
            "nodes": len(nodes),
            "quarantined_nodes": quarantined,
            "ignored_faults": [{"node": app_node, "xid": 13, "gpu": 1}] if app_taint is None else [],
            "events": len(events),
            "detection_to_taint_ms": {
                n: round((timeline.taint_seen[n] - injected[n]) * 1000, 1) for n in (xid_node, hot_node)
            },
            "checkpoints_requested": sum(1 for e in node_events if e.reason == "CheckpointRequested"),
            "checkpoints_acknowledged": len(acked),
            "evicted_pods": sum(1 for e in node_events if e.reason == "Evicted"),
            "rescheduled_pods": sum(1 for p in moved if p.metadata.name not in before),
            "devices_quarantined": devices_out,
            "gpus_held_out": sum(
                int(st.get("totalGPUs") or 0) - int(st.get("inServiceGPUs") or 0)
                for st in statuses.values()
                if st.get("inServiceGPUs") is not None
            ),
            "gpus_kept_in_service": sum(int(statuses[n].get("inServiceGPUs") or 0) for n in device_nodes),
            "device_pods_running": len([p for p in serving if p.status.phase == "Running"]),
            "note": "the thermal fault must be sustained for the policy's 8s before it counts; "
            "for the DRA node the time is to its DeviceTaintRule (polled every 0.2s)",
        }
        (OUT / "summary.json").write_text(json.dumps(summary, indent=2))
        print(f"\n== Summary (build/demo/summary.json) ==\n{json.dumps(summary, indent=2)}")
        ok = (
            quarantined == [xid_node]
            and [(d["node"], d["gpu"]) for d in devices_out] == [(hot_node, 2)]
            and summary["gpus_kept_in_service"] == 7
            and bool(summary["ignored_faults"])
            and summary["checkpoints_acknowledged"] == summary["checkpoints_requested"] == 5
            and summary["rescheduled_pods"] == 4
        )
        if args.keep:
            print(
                f"\nLeft running. export KUBECONFIG={cluster.kubeconfig}; stop with: make cluster-down "
                "(the operator and agents log to build/demo)"
            )
            return 0 if ok else 1
        return 0 if ok else 1
    finally:
        stop.set()
        if args.keep:  # also after a failure: whatever was started is left for `make cluster-down`
            keep_for_cluster_down(cluster, operator, agents)
        else:
            if agents:
                agents.stop()
            if operator:
                operator.stop()
            cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
