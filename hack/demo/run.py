"""`make demo`'s driver: starts the control plane, the operator and the agents, tells every story
(see the package docstring, ``hack/demo/__init__.py``), prints the timeline and writes
build/demo/summary.json. Exits 0 only if every story happened."""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

import hack.demo as package
from devkit import dra, pidfile
from devkit import nvidia_plugins as nv
from devkit.agents import AgentFleet
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, wait_for
from devkit.kueue import workload
from devkit.realnode import Installed
from hack.demo import deviceplugin, fabric, kueue, mig, realnode, reset
from hack.demo.common import (
    DEMO_POLICY,
    NS,
    OUT,
    Timeline,
    act_as_trainer,
    devices_of,
    pods_of,
    running,
    watch_nodes,
)
from hack.demo.devicewatch import DeviceWatch
from hack.demo.workloads import dra_serving, run_workloads


def keep_for_cluster_down(cluster: LocalCluster, operator: OperatorProcess | None, agents: AgentFleet | None) -> None:
    """Record everything left running (control plane, operator, agents) where `make cluster-down` looks."""
    extra = {"operator": operator.popen.pid} if operator and operator.popen else {}
    if agents:
        extra.update({f"agent/{n}": a.popen.pid for n, a in agents.agents.items() if a.popen})
    pidfile.hand_over(cluster.workdir, OUT.parent / "cluster", extra)


class Story(threading.Thread):
    """One story's checks, run beside the others; :meth:`result` re-raises what failed in it."""

    def __init__(self, fn: Callable[[], dict[str, Any]]) -> None:
        super().__init__(daemon=True)
        self.fn = fn
        self.value: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as e:
            self.error = e

    def result(self) -> dict[str, Any]:
        self.join()
        if self.error is not None:
            raise self.error
        return self.value


def main() -> int:
    ap = argparse.ArgumentParser(description=package.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="leave the cluster, operator and agents running")
    ap.add_argument("--nodes", type=int, default=8, help="fake GPU nodes (at least 5: one per story)")
    ap.add_argument(
        "--kueue",
        action="store_true",
        help="run the training job under Kueue, with gpuhealth's AdmissionCheck (make demo KUEUE=1)",
    )
    ap.add_argument(
        "--real-node",
        action="store_true",
        help="the device-plugin and XID 79 stories on a real kubelet node with NVIDIA's device plugin, through the "
        "installed chart (make demo REAL_NODE=1; root)",
    )
    args = ap.parse_args()
    if args.real_node and args.kueue:
        ap.error("--real-node and --kueue: one at a time")
    if args.nodes < 5:
        ap.error("--nodes: at least 5 (XID 79, thermal DRA, application XID, MIG and reset nodes)")

    if (OUT.parent / "cluster" / pidfile.PIDFILE).exists():
        print("a local cluster (or a kept demo) is still running; `make cluster-down` first")
        return 1
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    installed: Installed | None = None
    if args.real_node:
        print(f"== Starting a local control plane with {args.nodes} fake GPU nodes and a real node (logs in {OUT}) ==")
        installed = realnode.start(OUT, args.nodes)
        cluster = installed.cluster
    else:
        print(f"== Starting a local control plane with {args.nodes} fake GPU nodes (logs in {OUT}) ==")
        cluster = LocalCluster(OUT / "cluster", nodes=args.nodes).start()
    kube = Kube(cluster.kubeconfig)
    nodes = sorted(n.metadata.name for n in kube.core.list_node(label_selector="nvidia.com/gpu.present=true").items)
    # The real node is the XID 79 story's; the KWOK nodes tell the others.
    fake_nodes = [n for n in nodes if installed is None or n != installed.node.name]
    nvl = fabric.add_nodes(cluster)  # the NVLink domain's nodes, beside the fleet's
    operator = agents = queues = None
    operator_pod: dict[str, Any] = {}
    stop = threading.Event()
    plugins: nv.NvidiaPlugins | None = None
    dp_result: dict[str, Any] = {}
    try:
        if installed:  # the real node has a policy of its own (its repair Jobs run in real containers)
            kube.apply_policy("demo-fleet", deviceplugin.fleet_policy(DEMO_POLICY, installed.node.name))
            kube.apply_policy(
                "demo-real-node", deviceplugin.policy(DEMO_POLICY, installed.node.name, installed.image.ref)
            )
        else:
            kube.apply_policy("demo-fleet", DEMO_POLICY)
        kube.apply_policy("demo-nvl", fabric.FABRIC_POLICY)
        if args.kueue:
            print("== Starting Kueue (its manager beside the control plane; logs in build/demo/cluster/kueue) ==")
            queues = kueue.start(cluster)
        flags = ["--kueue=on"] if args.kueue else []
        if installed:
            print(f"== helm install of charts/gpuhealth ({installed.image.ref}) on real node {installed.node.name} ==")
            operator_pod, plugins = realnode.install(installed)
        else:
            operator = OperatorProcess(cluster, OUT / "operator.log", extra_args=flags).start()
        print("== Operator running; starting one real agent per node (fake NVML) ==")
        t0 = time.time()
        timeline = Timeline(t0)
        if installed:
            timeline.add(
                f"operator: installed chart, Pod {operator_pod['metadata']['name']} on real node "
                f"{installed.node.name} (image {installed.image.ref}, {installed.image.id})"
            )
        threading.Thread(target=watch_nodes, args=(kube, timeline, stop), daemon=True).start()
        if args.kueue:  # from before the Workload exists: its admission is on the timeline too
            wlwatch = kueue.WorkloadWatch(kube, timeline, "llm-pretrain")
            threading.Thread(target=wlwatch.run, args=(stop,), daemon=True).start()
        agents = AgentFleet(cluster.kubeconfig, OUT / "agents").start(fake_nodes + nvl)
        if installed:
            xid_node, (hot_node, app_node, mig_node, reset_node) = installed.node.name, fake_nodes[:4]
        else:
            xid_node, hot_node, app_node, mig_node, reset_node = nodes[:5]
        mig.configure_agent(agents[mig_node])
        reset.configure_agent(agents[reset_node])
        for n in nvl:
            fabric.configure_agent(agents[n])
        wait_for(lambda: all(kube.state(n) == "Healthy" for n in nodes + nvl), timeout=120, what="all nodes Healthy")
        timeline.add(f"all {len(nodes) + len(nvl)} nodes reported by their agents and Healthy")
        if installed and plugins:
            print(f"== Device-plugin story on {installed.node.name}: XID {deviceplugin.XID} on one pod's GPU ==")
            dp_result = deviceplugin.run(kube, installed.node, plugins, timeline)
        domain = {n: agents[n] for n in nvl}
        fabric.setup(kube, domain, timeline)  # first: the gang fills the domain's GPUs before other work lands
        print("== Running GPU workloads ==")
        run_workloads(cluster, kube, xid_node, queued=args.kueue, image=realnode.TRAINER_IMAGE if installed else None)
        dra.publish_device_classes(kube)
        dra.publish_slices(kube, [hot_node])  # a DRA driver publishes its GPUs (the fake NVML's UUIDs)
        cluster.apply_objects(dra_serving(hot_node))
        wait_for(lambda: len(running(kube, "dra-serving")) == 8, timeout=90, what="DRA serving pods running")
        timeline.add(f"{hot_node}: DRA node; 8 serving pods, one GPU each from a ResourceClaim")
        mig_held = mig.setup(cluster, kube, mig_node, timeline)
        reset_pod, reset_gpu = reset.setup(cluster, kube, reset_node, timeline)
        before = {p.metadata.name for p in pods_of(kube, "llm-pretrain")}
        queued_in = (
            f", queued in Kueue (LocalQueue {kueue.LOCAL_QUEUE}, ClusterQueue {kueue.CLUSTER_QUEUE} with "
            f"gpuhealth's AdmissionCheck)"
            if args.kueue
            else ""
        )
        in_containers = " (real containers on the real node)" if installed else ""
        timeline.add(
            f"training job llm-pretrain: 4 ranks (2 GPUs each) on {xid_node}{in_containers}, "
            f"checkpoint mode: annotation{queued_in}"
        )
        timeline.add("8 inference pods running (4 GPUs each)")
        # The ranks' containers on the real node, before the fault takes them off it.
        real_ranks = realnode.containers(kube, NS, "llm-pretrain", xid_node) if installed else {}
        acked: set[str] = set()
        threading.Thread(target=act_as_trainer, args=(kube, timeline, stop, acked), daemon=True).start()
        devwatch = DeviceWatch(kube, timeline, [mig_node, reset_node])
        devwatch.poll()  # the starting point: no rules, every GPU in service
        threading.Thread(target=devwatch.run, args=(stop,), daemon=True).start()
        print(
            f"== Injecting faults: XID 79 on {xid_node}, thermal slowdown on {hot_node}, "
            f"application XID 13 on {app_node}, row remap failure on MIG GPU {mig.BAD_GPU} of {mig_node}, "
            f"uncorrected ECC on GPU {reset_gpu} of {reset_node}, unhealthy fabric routes on GPU "
            f"{fabric.SICK_GPU} of {nvl[fabric.SICK_NODE]} =="
        )
        injected: dict[str, float] = {}
        injected[xid_node] = time.time()
        if plugins:
            realnode.inject_xid(plugins, gpu=3, code=79)
        else:
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
        injected[mig_node] = mig.inject(agents[mig_node], timeline)
        injected[reset_node] = reset.inject(agents[reset_node], reset_gpu, timeline)
        fabric_at = fabric.inject(agents[nvl[fabric.SICK_NODE]], timeline)
        # The per-GPU stories run beside the node story, each at its own pace (the reset's MTTR must
        # not wait for the training job's ranks to come back).
        mig_story = Story(lambda: mig.verify(kube, mig_node, mig_held, timeline))
        reset_agent, reset_at = agents[reset_node], injected[reset_node]
        reset_story = Story(lambda: reset.verify(kube, reset_agent, reset_pod, reset_gpu, reset_at, devwatch, timeline))
        fabric_story = Story(lambda: fabric.verify(kube, domain, fabric_at, timeline))

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
                (r := [p for p in running(kube, "llm-pretrain") if p.spec.node_name != xid_node]) and len(r) == 4 and r
            ),
            timeout=180,  # the Job recreates evicted ranks with a backoff; slow on a loaded machine
            what="training ranks running again on healthy nodes",
        )
        timeline.add("training job: 4 ranks running again on " + ", ".join(sorted({p.spec.node_name for p in moved})))
        wait_for(lambda: kube.state(xid_node) == "Quarantined", timeout=30, what="drain finished")
        wait_for(
            lambda: devices_of(kube, hot_node).get(2, {}).get("state") == "Quarantined",
            timeout=60,
            what="the pod on GPU 2 moved",
        )
        serving = pods_of(kube, "dra-serving")
        pending = [p.metadata.name for p in serving if not p.spec.node_name]
        timeline.add(
            f"{hot_node}: the pod on GPU 2 checkpointed and was evicted; its replacement stays Pending "
            f"({len(pending)}): the scheduler does not allocate the tainted GPU; 7 pods serve on"
        )
        mig_result = mig_story.result()
        reset_result = reset_story.result()
        fabric_result = fabric_story.result()
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
        # The drains: the XID node's four ranks, the pods on the thermal GPU, the MIG GPU and the ECC GPU.
        drained_nodes = (xid_node, hot_node, mig_node, reset_node)
        node_events = [e for e in events if e.involved_object.name in drained_nodes]
        held_out, kept = mig.partitions(kube)
        resets = reset.gpus_reset(kube)
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
            "partitions_held_out": held_out,
            "partitions_kept_in_service": kept,
            **mig_result,
            "gpus_reset": resets,
            "validations": reset.validations(kube),
            "mttr_s": reset_result["mttr_s"],
            "reset_ladder": reset_result["reset_ladder"],
            **fabric_result,
            **(
                kueue.summary_fields(
                    workload(kube, NS, "llm-pretrain"),
                    len(kube.node_events(xid_node, "WorkloadMoved")),
                    sum(1 for e in node_events if e.reason == "Evicted" and e.involved_object.name == xid_node),
                )
                if args.kueue
                else {"kueue": False}
            ),
            **(realnode.summary(installed, operator_pod, real_ranks) if installed else {"real_node": False}),
            **({"device_plugin": dp_result} if installed else {}),
            "note": "the thermal fault must be sustained for the policy's 8s before it counts; "
            "for the DRA node the time is to its DeviceTaintRule (polled every 0.2s); mttr_s is from the "
            "injected ECC error to its GPU seen back in service (polled every 0.3s), probation 10s included; "
            "fabric.decision_s is from the injected fabric mask to the last member's taint seen by a Node watch, "
            "returned_s from the healed mask to the last member seen Healthy and untainted (probation 5s)",
        }
        (OUT / "summary.json").write_text(json.dumps(summary, indent=2))
        print(f"\n== Summary (build/demo/summary.json) ==\n{json.dumps(summary, indent=2)}")
        failures = check(summary, xid_node, hot_node, mig_node, reset_node, reset_gpu)
        for f in failures:
            print(f"FAILED: {f}")
        if args.keep:
            print(
                f"\nLeft running. export KUBECONFIG={cluster.kubeconfig}; stop with: make cluster-down "
                "(the operator and agents log to build/demo)"
            )
        return 1 if failures else 0
    finally:
        stop.set()
        if args.keep:  # also after a failure: whatever was started is left for `make cluster-down`
            keep_for_cluster_down(cluster, operator, agents)
        else:
            if agents:
                agents.stop()
            if operator:
                operator.stop()
            if queues:
                queues.stop()
            if installed:
                installed.stop()
            else:
                cluster.stop()


def check(summary: dict[str, Any], xid: str, hot: str, mig_node: str, reset_node: str, reset_gpu: int) -> list[str]:
    """What every story must have left in the cluster; each miss in words."""
    out = []
    if summary["quarantined_nodes"] != [xid]:
        out.append(f"quarantined nodes {summary['quarantined_nodes']}, expected only the XID 79 node {xid}")
    out_gpus = sorted((d["node"], d["gpu"]) for d in summary["devices_quarantined"])
    if out_gpus != sorted([(hot, 2), (mig_node, mig.BAD_GPU)]):
        out.append(f"GPUs held out {out_gpus}, expected GPU 2 of {hot} and GPU {mig.BAD_GPU} of {mig_node}")
    if summary["gpus_kept_in_service"] != 14:
        out.append(f"{summary['gpus_kept_in_service']} GPUs kept in service on the degraded nodes, expected 7 + 7")
    if not summary["ignored_faults"]:
        out.append("the application XID was not ignored")
    # 4 training ranks, 1 pod on the hot GPU, 2 on the MIG GPU's partitions, 1 on the ECC GPU.
    if not summary["checkpoints_acknowledged"] == summary["checkpoints_requested"] == 8:
        out.append(
            f"checkpoints requested {summary['checkpoints_requested']}, acknowledged "
            f"{summary['checkpoints_acknowledged']}, expected 8 and 8"
        )
    if summary["rescheduled_pods"] != 4:
        out.append(f"{summary['rescheduled_pods']} training ranks rescheduled, expected 4")
    held = sorted(p["device"] for p in summary["partitions_held_out"])
    want = sorted(mig.device_names(mig.BAD_GPU))
    if held != want:
        out.append(f"MIG devices held out {held}, expected exactly GPU {mig.BAD_GPU}'s {want}")
    if summary["partitions_kept_in_service"] != 14:
        out.append(f"{summary['partitions_kept_in_service']} MIG devices without a rule, expected 14")
    # The device-plugin story's reset and validation on the real node are its own (deviceplugin.misses).
    dp_node = (summary.get("device_plugin") or {}).get("node")
    resets = [(g["node"], g["gpu"]) for g in summary["gpus_reset"] if g["node"] != dp_node]
    if resets != [(reset_node, reset_gpu)]:
        out.append(f"succeeded reset Jobs {summary['gpus_reset']}, expected one for GPU {reset_gpu} of {reset_node}")
    history = [(h.get("step"), h.get("result")) for h in summary["reset_ladder"].get("history") or []]
    if history != [("GPUReset", "Succeeded")]:
        out.append(f"the GPU's ladder history (status.remediation) is {history}, expected one GPUReset Succeeded")
    validated = [(v["node"], v["gpu"], v["result"]) for v in summary.get("validations") or [] if v["node"] != dp_node]
    if validated != [(reset_node, reset_gpu, "Passed")]:
        out.append(f"validations {validated}, expected one that passed for GPU {reset_gpu} of {reset_node}")
    return (
        out + fabric.misses(summary) + kueue.misses(summary) + realnode.misses(summary) + deviceplugin.misses(summary)
    )


if __name__ == "__main__":
    import sys

    sys.exit(main())
