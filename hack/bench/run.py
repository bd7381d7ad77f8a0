"""`make bench`'s driver: the results' header, the phases in the order they run, the outputs, and the
teardown of everything the run started, however far it got (what a run measures: hack/bench/__init__.py).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client
from tests.support.agents import AgentFleet
from tests.support.k8s import OperatorProcess, wait_for

from hack.bench.cli import parse_args
from hack.bench.cluster import (
    BenchCluster,
    agent_policy_spec,
    agent_silence,
    breaker_setting,
    machine,
    policy_spec,
    run_pods,
)
from hack.bench.devices import measure_devices, publish_dra
from hack.bench.e2e import measure_e2e, real_agents
from hack.bench.fleet import LEASE_NAMESPACE, HeartbeatDriver, HeartbeatStats, SimNode, heartbeat_workers
from hack.bench.mig import measure_mig, mig_layout, publish_mig
from hack.bench.report import write_outputs
from hack.bench.resilience import (
    ResilienceContext,
    measure_drain,
    measure_failover,
    measure_restart,
)
from hack.bench.support import (
    FAULT_TIMEOUT_S,
    FLOOR_TAINT,
    GROUP,
    TAINT,
    VERSION,
    AuditEntry,
    ProcSampler,
    api_client,
    api_rates,
    describe,
    find_log_line,
    log,
    percentile,
    phase_elapsed,
    publish_all,
    rate,
    read_audit,
    steady_writes_per_hour,
)
from hack.bench.traffic import TrafficContext, measure_traffic
from hack.bench.watch import NodeWatch, ReportWatch, RuleWatch

OPERATOR_USER, AGENT_USER, SIM_USER = "gpuhealth-operator", "gpuhealth-agent-bench", "gpuhealth-fleet-sim"
E2E_USER = (
    "gpuhealth-agent-e2e"  # the faulted real agents: their own user, so the footprint agent's writes stay its own
)
TOKENS = {
    "bench-operator-token": (OPERATOR_USER, "system:masters"),
    "bench-agent-token": (AGENT_USER, "system:masters"),
    "bench-e2e-token": (E2E_USER, "system:masters"),
    "bench-sim-token": (SIM_USER, "system:masters"),
}
POLICY = "bench"
AGENT_POLICY = "bench-agents"  # governs the real agents' nodes only, so the fleet's breaker figures stay its own
AGENT_NODE = "agent-node-0000"


def policy_status(custom: client.CustomObjectsApi) -> dict[str, Any]:
    status: dict[str, Any] = (
        custom.get_cluster_custom_object(GROUP, VERSION, "gpuhealthpolicies", POLICY).get("status") or {}
    )
    return status


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    res: dict[str, Any] = {
        "nodes": args.nodes,
        "quick": args.quick,
        "machine": machine(),
        "config": {
            "pods_requested": args.pods,
            "faults": args.faults,
            "storm": args.storm,
            "floor_nodes": args.floor_nodes,
            "floor_samples": args.floor_samples,
            "idle_window_s": args.idle,
            "operator_tick_s": args.tick,
            "heartbeat_s": args.heartbeat,
            "agent_silence": agent_silence(args.heartbeat),
            "device_faults": args.device_faults,
            "device_storm": args.device_storm,
            "real_agents": args.real_agents,
            "e2e_faults": args.e2e_faults,
            "traffic_per_s": args.traffic,
            "traffic_faults": args.traffic_faults,
            "profile": args.profile,
            "kubelet_lease_s": args.kubelet_lease,
            "phases": args.phases,
            "drain_nodes": args.drain_nodes,
            "drain_pods_per_node": args.drain_pods,
            "failover_samples": args.failover_samples,
            "mig_faults": args.mig_faults,
            "mig_storm": args.mig_storm,
        },
    }
    series: dict[str, Any] = {}
    bench_t0 = time.time()
    phases: list[tuple[str, float, float]] = []

    def phase(name: str) -> None:
        # The 1-minute load average says how busy the machine was (other work may share it).
        now = round(time.time() - bench_t0, 2)
        if phases:
            log(f"   ({phases[-1][0].split(':')[0]} took {phase_elapsed(phases[-1][1], now)}; {now / 60:.1f} min in)")
        phases.append((name, now, os.getloadavg()[0]))
        log(f"== {name} (load average {os.getloadavg()[0]:.1f}) ==")

    cluster = BenchCluster(
        out / "cluster",
        nodes=args.nodes,
        extra_tokens=TOKENS,
        audit_users=[OPERATOR_USER, AGENT_USER],
        apiserver_args=["--max-requests-inflight=1000", "--max-mutating-requests-inflight=500"],
        kubelet_lease_s=args.kubelet_lease,
    )
    operator: OperatorProcess | None = None
    operators: list[OperatorProcess] = []  # those the restart and failover phases start
    fleets: list[AgentFleet] = []
    watches: list[NodeWatch | ReportWatch | RuleWatch] = []
    heartbeats: HeartbeatDriver | None = None
    samplers: list[ProcSampler] = []
    pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="sim")
    rc = 1
    try:
        phase(f"control plane with {args.nodes} + {args.floor_nodes} floor + {args.real_agents} agent fake GPU nodes")
        t = time.monotonic()
        cluster.start()
        floor_names = cluster.add_gpu_nodes(args.floor_nodes, prefix="floor-node-", labels={"bench-floor": "true"})
        agent_nodes = cluster.add_gpu_nodes(args.real_agents, prefix="agent-node-", labels={"bench-agent": "true"})
        cluster.wait_nodes_ready(args.nodes + args.floor_nodes + args.real_agents, timeout=300)
        res["cluster_start_s"] = round(time.monotonic() - t, 1)
        # Memory of each control-plane process and of the bench itself (the simulated fleet and the watches):
        # whether a fleet this size fits the machine.
        mem_samplers = {
            name: ProcSampler(pid, period=5.0).start()
            for name, pid in [*((n, p.pid) for n, p in cluster.procs.items()), ("bench", os.getpid())]
            if pid is not None
        }
        samplers.extend(mem_samplers.values())
        total = args.nodes + args.floor_nodes + args.real_agents
        log(f"  control plane and {total} nodes ready in {res['cluster_start_s']}s")

        kc = {u: cluster.kubeconfig_with_token(tok, out / f"{u}.kubeconfig", u) for tok, (u, _) in TOKENS.items()}
        admin = api_client(cluster.kubeconfig, pool=32)
        core, apps, custom = client.CoreV1Api(admin), client.AppsV1Api(admin), client.CustomObjectsApi(admin)
        # The agents' heartbeat Leases live where a gpuhealth install puts them (and the operator watches).
        cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NAMESPACE}}])
        governed = sorted(
            n["metadata"]["name"]
            for n in json.loads(
                core.list_node(label_selector="nvidia.com/gpu.present=true", _preload_content=False).data
            )["items"]
            if not {"bench-floor", "bench-agent"} & set(n["metadata"].get("labels") or {})
        )
        assert len(governed) == args.nodes, f"expected {args.nodes} governed nodes, found {len(governed)}"

        # The real agents run for the whole bench, so the footprint agent's steady state is measured over minutes.
        phase(f"{args.real_agents} real agents (fake NVML, interval 10s, Lease heartbeat 30s), each on its own node")
        fleet = real_agents(kc[AGENT_USER], out / "agent", LEASE_NAMESPACE)
        fleets.append(fleet)
        fleet.start([AGENT_NODE])
        agent = fleet[AGENT_NODE]
        e2e_fleet = real_agents(kc[E2E_USER], out / "agents-e2e", LEASE_NAMESPACE, library=fleet.library)
        fleets.append(e2e_fleet)
        e2e_fleet.start([n for n in agent_nodes if n != AGENT_NODE])
        agent_proc = agent.popen
        assert agent_proc is not None
        agent_sampler = ProcSampler(agent_proc.pid, period=1.0).start()
        samplers.append(agent_sampler)

        phase(f"{args.pods} running 1-GPU pods (one ReplicaSet per node, pods bound to it)")
        t = time.monotonic()
        res["pods"] = run_pods(cluster, apps, core, args.pods, governed, pool)
        res["pods_start_s"] = round(time.monotonic() - t, 1)
        res["pods_per_s"] = round(res["pods"] / res["pods_start_s"], 1) if res["pods_start_s"] > 0 else None
        log(f"  {res['pods']} pods Running in {res['pods_start_s']}s ({res['pods_per_s']} pods/s)")

        phase(f"initial reports for {args.nodes + args.floor_nodes} nodes through the agent's publisher")
        sim_api = api_client(kc[SIM_USER], pool=48)
        hb_stats = HeartbeatStats()
        # The MIG fleet (--phases mig): every governed node's agent reports its GPUs in MIG mode.
        mig_fleet = set(governed) if "mig" in args.phases else set()
        sims = {
            n: SimNode(
                n, i, sim_api, heartbeat_s=args.heartbeat, stats=hb_stats, mig=mig_layout(i) if n in mig_fleet else None
            )
            for i, n in enumerate([*governed, *floor_names])
        }
        t = time.monotonic()
        failed = publish_all(pool, SimNode.start, list(sims.values()))
        res["initial_reports_s"] = round(time.monotonic() - t, 1)
        log(f"  {len(sims) - failed} reports created in {res['initial_reports_s']}s ({failed} failed)")
        workers = heartbeat_workers(len(sims), args.heartbeat)
        heartbeats = HeartbeatDriver(list(sims.values()), args.heartbeat, workers=workers).start()
        log(
            f"  {len(sims)} simulated agents renew their Leases every {args.heartbeat:g}s, spread evenly"
            f" ({workers} in flight at most)"
        )

        # The DRA nodes: the last governed ones, their GPUs published as NVIDIA's DRA driver would (one
        # ResourceSlice per node, pool = node name, devices gpu-0..7 with the UUIDs their reports carry).
        dra_nodes = governed[len(governed) - args.device_faults - args.device_storm :] if "core" in args.phases else []
        used = set(dra_nodes)  # nodes the core phases fault (the others' pick among the rest)
        if dra_nodes:
            phase(f"DRA: a DeviceClass and {len(dra_nodes)} ResourceSlices")
            publish_dra(custom, [sims[n] for n in dra_nodes])
        if mig_fleet:
            phase(f"MIG: a DeviceClass and {len(mig_fleet)} ResourceSlices of 8 GPUs x 7 MIG devices")
            t = time.monotonic()
            failed = publish_mig(custom, [sims[n] for n in governed], pool)
            log(f"  {len(mig_fleet) - failed} slices in {time.monotonic() - t:.1f}s ({failed} failed)")
        rule_watch = RuleWatch(api_client(cluster.kubeconfig, pool=2)).start()
        watches.append(rule_watch)

        node_watch = NodeWatch(api_client(cluster.kubeconfig, pool=2)).start()
        watches.append(node_watch)
        report_watch = ReportWatch(api_client(cluster.kubeconfig, pool=2), api_client(kc[SIM_USER], pool=2)).start()
        watches.append(report_watch)

        for name, spec in ((POLICY, policy_spec("100%", args.heartbeat)), (AGENT_POLICY, agent_policy_spec())):
            client.CustomObjectsApi(admin).create_cluster_custom_object(
                GROUP,
                VERSION,
                "gpuhealthpolicies",
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "GPUHealthPolicy",
                    "metadata": {"name": name},
                    "spec": spec,
                },
            )

        phase("operator start-up")
        operator = OperatorProcess(
            cluster, out / "operator.log", extra_args=[f"--kubeconfig={kc[OPERATOR_USER]}", f"--tick={args.tick}"]
        )
        op_t0 = time.time()
        operator.start()
        assert operator.popen is not None
        op_sampler = ProcSampler(operator.popen.pid, period=0.25).start()
        samplers.append(op_sampler)
        found = find_log_line(out / "operator.log", r"watching \d+ GPU nodes", timeout=600)
        watching_s = round(found[0] - op_t0, 2) if found else None
        healthy_at = report_watch.wait_states(governed, "Healthy", timeout=900)
        healthy_s = round(healthy_at - op_t0, 2) if healthy_at else None
        log(f"  'watching ... GPU nodes' after {watching_s}s; all {args.nodes} nodes Healthy after {healthy_s}s")
        res["operator"] = {"startup_watching_s": watching_s, "startup_s": healthy_s}
        time.sleep(2 * args.tick)  # let the first sweeps pass
        hb_stats.reset_gap()
        hb_from = hb_stats.mark()

        if "core" in args.phases:
            phase(f"detection to taint: {args.faults} single faults, floor: {args.floor_samples} samples")
            detect_nodes = governed[: args.faults]
            storm_nodes = governed[args.faults : args.faults + args.storm]
            rest = governed[args.faults + args.storm :]
            breaker_nodes = (rest + governed)[: args.storm]
            used |= {*detect_nodes, *storm_nodes, *breaker_nodes}
            detect: list[float] = []
            publish_ms: list[float] = []
            floor: list[float] = []
            misses = {"detect": 0, "floor": 0}
            floor_every = max(1, args.faults // max(1, args.floor_samples))
            floor_i = 0

            def floor_once() -> float | None:
                """One no-logic floor sample (ms), None if its taint never came."""
                nonlocal floor_i
                name = floor_names[floor_i % len(floor_names)]
                floor_i += 1
                node_watch.wait_all([name], FLOOR_TAINT, timeout=10, present=False)
                report_watch.armed.add(name)
                t0 = time.time()
                sims[name].fault()
                t1 = node_watch.wait_taint(name, FLOOR_TAINT, timeout=FAULT_TIMEOUT_S)
                report_watch.armed.discard(name)
                # Back to clean for the next round: untaint, and the node "reboots" (clean report).
                core.patch_node(name, {"spec": {"taints": None}}, _content_type="application/merge-patch+json")
                sims[name].reboot()
                return None if t1 is None else (t1 - t0) * 1000

            def measure_floor() -> None:
                ms = floor_once()
                if ms is None:
                    misses["floor"] += 1
                else:
                    floor.append(ms)

            for i, name in enumerate(detect_nodes):
                t0 = time.time()
                sims[name].fault()
                publish_ms.append((time.time() - t0) * 1000)
                t1 = node_watch.wait_taint(name, TAINT, timeout=FAULT_TIMEOUT_S)
                if t1 is None:
                    misses["detect"] += 1
                else:
                    detect.append((t1 - t0) * 1000)
                time.sleep(0.2)
                if i % floor_every == floor_every - 1 and floor_i < args.floor_samples:
                    measure_floor()
                    time.sleep(0.2)
                if (i + 1) % 50 == 0:
                    log(f"  {i + 1}/{len(detect_nodes)}: p50 so far {percentile(detect, 50):.0f} ms")
            while floor_i < args.floor_samples:
                measure_floor()
                time.sleep(0.2)
            # A fault whose taint did not come within the timeout counts as the timeout (a lower bound) in percentiles.
            detect_all = detect + [FAULT_TIMEOUT_S * 1000] * misses["detect"]
            floor_all = floor + [FAULT_TIMEOUT_S * 1000] * misses["floor"]
            p50 = percentile(detect_all, 50)
            floor_p50 = percentile(floor_all, 50)
            res["detect_to_taint_ms"] = {
                "p50": round(p50, 1),
                "p90": round(percentile(detect_all, 90), 1),
                "p99": round(percentile(detect_all, 99), 1),
                "max": round(max(detect_all, default=float("nan")), 1),
                "samples": len(detect_all),
                "timeouts": misses["detect"],
                "publish_p50": round(percentile(publish_ms, 50), 1),
            }
            res["floor_ms"] = {
                "p50": round(floor_p50, 1),
                "p90": round(percentile(floor_all, 90), 1),
                "p99": round(percentile(floor_all, 99), 1),
                "samples": len(floor_all),
                "timeouts": misses["floor"],
            }
            res["ratio_to_floor"] = round(p50 / floor_p50, 2) if floor else None
            series["detect_ms"], series["floor_ms"] = detect, floor
            log(
                f"  detect p50 {p50:.0f} ms p99 {res['detect_to_taint_ms']['p99']:.0f} ms; floor p50 {floor_p50:.0f} ms"
            )

            if args.e2e_faults:
                phase(f"end to end: {args.e2e_faults} XIDs from fake NVML through {len(e2e_fleet.agents)} real agents")
                res["e2e"] = measure_e2e(
                    list(e2e_fleet.agents.values()), args.e2e_faults, node_watch, report_watch, core, series
                )
                p = res["e2e"]["emit_to_taint_ms"]
                log(f"  end to end p50 {p['p50']:.0f} ms p99 {p['p99']:.0f} ms ({p['timeouts']} timed out)")

            phase(f"storm: {args.storm} nodes fault at once, breaker at 100%")
            published_at: dict[str, float] = {}

            def storm_fault(sim: SimNode) -> None:
                sim.fault()
                published_at[sim.name] = time.time()

            t0 = time.time()
            failed = publish_all(pool, storm_fault, [sims[n] for n in storm_nodes])
            published = time.time() - t0
            done = node_watch.wait_all(storm_nodes, TAINT, timeout=180)
            taint_at = {n: node_watch.seen_at[(n, TAINT)] for n in storm_nodes if (n, TAINT) in node_watch.seen_at}
            seen = sorted(t - t0 for t in taint_at.values())
            storm_s = seen[-1] if seen and done else None
            # The operator's share: from each node's report write (done) to its taint, and its own throughput.
            per_node = [(taint_at[n] - published_at[n]) * 1000 for n in taint_at if n in published_at]
            op_span = max(taint_at.values(), default=0.0) - min(published_at.values(), default=0.0)
            res["storm"] = {
                "nodes": args.storm,
                "quarantined": len(seen),
                "seconds": round(storm_s, 2) if storm_s else None,
                "nodes_per_s": round(args.storm / storm_s, 1) if storm_s else None,
                "publish_s": round(published, 2),
                "first_taint_s": round(seen[0], 3) if seen else None,
                "publish_failures": failed,
                "report_to_taint_ms_p50": round(percentile(per_node, 50), 1),
                "report_to_taint_ms_max": round(max(per_node, default=float("nan")), 1),
                "operator_nodes_per_s": round(len(taint_at) / op_span, 1) if op_span > 0 else None,
            }
            series["storm"] = [(0.0, 0), *[(s, i + 1) for i, s in enumerate(seen)]]
            series["storm_published"] = sorted(t - t0 for t in published_at.values())
            log(f"  {len(seen)}/{args.storm} quarantined in {storm_s}s (reports published in {published:.2f}s)")

            phase("recovery: every fault cleared (clean reports after a reboot), probation 2s")
            faulted = [*detect_nodes, *storm_nodes]
            t0 = time.time()
            publish_all(pool, SimNode.reboot, [sims[n] for n in faulted])
            back = report_watch.wait_states(governed, "Healthy", timeout=300)
            untainted = node_watch.wait_all(governed, TAINT, timeout=60, present=False)
            res["recovery"] = {
                "nodes": len(faulted),
                "seconds_to_all_healthy": round(back - t0, 1) if back else None,
                "untainted": untainted,
            }
            log(f"  {len(faulted)} nodes back to Healthy in {res['recovery']['seconds_to_all_healthy']}s")

            if args.traffic:
                # Nodes not faulted yet first (the storm's had one quarantine): the operator holds a node that
                # was quarantined three times within its flapping window for repair, and the detection nodes
                # were faulted once already; each rate takes its own nodes.
                fresh = governed[args.faults : len(governed) - len(dra_nodes)]
                fresh = fresh[args.storm :] + fresh[: args.storm]
                per_rate = [
                    fresh[i * args.traffic_faults : (i + 1) * args.traffic_faults] for i in range(len(args.traffic))
                ]
                quiet = {n for nodes in per_rate for n in nodes} | set(dra_nodes)
                used |= quiet
                phase(
                    f"fact traffic: {', '.join(f'{r:g}' for r in args.traffic)} changes/s, "
                    f"{args.traffic_faults} single faults under each"
                )
                ctx = TrafficContext(
                    nodes=[sims[n] for n in governed if n not in quiet],
                    kubeconfig=kc[SIM_USER],
                    sims=sims,
                    node_watch=node_watch,
                    report_watch=report_watch,
                    operator=op_sampler,
                    audit_log=cluster.audit_log,
                    operator_user=OPERATOR_USER,
                    pool=pool,
                    floor=floor_once,
                    settle_s=2 * args.tick,
                )
                res["traffic"] = measure_traffic(ctx, args.traffic, per_rate)

            if dra_nodes:
                res["device_to_rule_ms"], res["device_storm"], res["device_recovery"] = measure_devices(
                    args, sims, dra_nodes, rule_watch, node_watch, pool, series, phase
                )

            max_unhealthy, limit = breaker_setting(args.nodes, args.storm)
            phase(f"breaker at maxUnhealthy {max_unhealthy} (limit {limit}): {args.storm} nodes fault at once")
            custom.patch_cluster_custom_object(
                GROUP, VERSION, "gpuhealthpolicies", POLICY, {"spec": {"safety": {"maxUnhealthy": max_unhealthy}}}
            )
            wait_for(
                lambda: (
                    (
                        custom.get_cluster_custom_object(GROUP, VERSION, "gpuhealthpolicies", POLICY).get("status")
                        or {}
                    ).get("breakerLimit")
                    == limit
                ),
                timeout=60,
                what=f"operator applied maxUnhealthy {max_unhealthy} (breakerLimit {limit})",
            )
            samples: list[tuple[float, int]] = []
            stop_sampling = threading.Event()

            def sample() -> None:
                while not stop_sampling.is_set():
                    samples.append((time.time(), node_watch.tainted(TAINT)))
                    stop_sampling.wait(0.05)

            sampler = threading.Thread(target=sample, daemon=True)
            t0 = time.time()
            sampler.start()
            publish_all(pool, SimNode.fault, [sims[n] for n in breaker_nodes])
            time.sleep(max(0.0, args.breaker_window - (time.time() - t0)))
            stop_sampling.set()
            sampler.join()
            max_seen = max((c for _, c in samples), default=0)
            actual = sum(
                1
                for n in json.loads(
                    core.list_node(label_selector="nvidia.com/gpu.present=true", _preload_content=False).data
                )["items"]
                if any(t.get("key") == TAINT for t in (n.get("spec") or {}).get("taints") or [])
            )
            pstatus = custom.get_cluster_custom_object(GROUP, VERSION, "gpuhealthpolicies", POLICY).get("status") or {}
            res["breaker"] = {
                "max_unhealthy": max_unhealthy,
                "limit": limit,
                "max_quarantined_seen": max_seen,
                "quarantined_at_end": actual,
                "held_back": pstatus.get("heldBack"),
                "breaker": pstatus.get("breaker"),
                "samples": len(samples),
                "faulted": len(breaker_nodes),
            }
            series["breaker"] = [(t - t0, c) for t, c in samples]
            log(f"  max quarantined seen {max_seen} (limit {limit}); breaker {pstatus.get('breaker')}")

            phase(f"idle: {args.idle:.0f}s with nothing changing")
            time.sleep(max(2 * args.tick, 5.0))
            idle_from, idle_cpu_from = time.time(), op_sampler.cpu_s()
            time.sleep(args.idle)
            idle_to, idle_cpu_to = time.time(), op_sampler.cpu_s()
            time.sleep(1.0)  # the audit log is written when each request completes

            ops = list(read_audit(cluster.audit_log, OPERATOR_USER))
            idle = [e for e in ops if idle_from <= e.at < idle_to]
            minutes = (idle_to - idle_from) / 60
            res["operator"].update(
                {
                    "peak_rss_mb": round(op_sampler.peak_rss / 2**20, 1),
                    "cpu_s": round(op_sampler.cpu_s(), 1),
                    "idle_requests_per_min": round(len(idle) / minutes, 1),
                    "idle_writes_per_min": round(sum(e.write for e in idle) / minutes, 1),
                    "idle_requests": describe(idle),
                    # The sweep every --tick re-evaluates every node: what that costs while nothing changes.
                    "idle_cpu_percent": round((idle_cpu_to - idle_cpu_from) / (idle_to - idle_from) * 100, 1),
                    "requests_total": len(ops),
                    "writes_total": sum(e.write for e in ops),
                    "writes_by_kind": describe(e for e in ops if e.write),
                    "wall_s": round(time.time() - op_t0, 1),
                }
            )
            series["operator_rss"] = [(t - op_t0, r / 2**20) for t, r in op_sampler.samples]

            agent_writes = sorted(e.at for e in read_audit(cluster.audit_log, AGENT_USER) if e.write)
            now = time.time()
            a_samples = [(t, r) for t, r in agent_sampler.samples if agent_writes and t >= agent_writes[0]]
            res["agent"] = {
                "rss_mb": round(max((r for _, r in a_samples), default=0) / 2**20, 1),
                "cpu_percent": None,
                "writes_per_hour": None,
                "writes": len(agent_writes),
                "window_s": round(now - agent_writes[0], 1) if agent_writes else 0.0,
            }
            if agent_writes and agent.alive():
                cpu_total = agent_sampler.cpu_s()
                # CPU from its first write on: what it uses running, not its start-up imports.
                cpu_first = agent_cpu_at_first_write(agent_sampler, agent_writes[0])
                res["agent"]["cpu_percent"] = round((cpu_total - cpu_first) / (now - agent_writes[0]) * 100, 2)
                per_hour, res["agent"]["startup_writes"] = steady_writes_per_hour(agent_writes)
                res["agent"]["writes_per_hour"] = round(per_hour, 1) if per_hour is not None else None
            hb_to = hb_stats.mark()
            achieved = rate(hb_from, hb_to)
            res["heartbeats"] = {
                "interval_s": args.heartbeat,
                "agents": len(sims),
                "asked_per_s": round(len(sims) / args.heartbeat, 2),
                "achieved_per_s": round(achieved, 2) if achieved is not None else None,
                "renewals": hb_to[1] - hb_from[1],
                "window_s": round(hb_to[0] - hb_from[0], 1),
                "failures": hb_stats.failures,
                "max_gap_s": round(hb_stats.max_gap_s, 1),
                "agent_silence": agent_silence(args.heartbeat),
            }
            res["memory_mb"] = {
                **{n: round(m.peak_rss / 2**20) for n, m in mem_samplers.items()},
                "operator": round(op_sampler.peak_rss / 2**20),
                "machine_available_at_end": round(psutil.virtual_memory().available / 2**20),
            }
            res["api"] = api_footprint(
                res, ops, list(read_audit(cluster.audit_log, AGENT_USER)), op_sampler, agent_sampler
            )
            log(f"  heartbeats: {res['heartbeats']}")
            log(f"  operator: {res['operator']}")
            log(f"  agent: {res['agent']}")
            log(f"  API traffic gpuhealth adds: {res['api']}")
        if set(args.phases) - {"core"}:
            if "core" in args.phases:
                # The breaker phase left maxUnhealthy at 5% with its limit spent: the new phases' faults
                # would be held back. They measure with the breaker open, as the storm does.
                custom.patch_cluster_custom_object(
                    GROUP, VERSION, "gpuhealthpolicies", POLICY, {"spec": {"safety": {"maxUnhealthy": "100%"}}}
                )
                wait_for(
                    lambda: policy_status(custom).get("breakerLimit") == args.nodes,
                    timeout=60,
                    what="operator applied maxUnhealthy 100% again",
                )
            if "mig" in args.phases:
                mig_nodes = [n for n in governed if n not in used][: args.mig_faults + args.mig_storm]
                used |= set(mig_nodes)
                res["mig"] = measure_mig(
                    args,
                    sims,
                    len(mig_fleet),
                    mig_nodes,
                    custom,
                    rule_watch,
                    node_watch,
                    op_sampler,
                    pool,
                    series,
                    phase,
                )
            # Nodes no phase has faulted yet, taken in turn by the restart, failover and drain phases.
            spare = [n for n in governed if n not in used and (n, TAINT) not in node_watch.seen_at]
            rctx = ResilienceContext(
                cluster=cluster,
                out=out,
                admin=admin,
                operator_kubeconfig=kc[OPERATOR_USER],
                operator_user=OPERATOR_USER,
                sims=sims,
                node_watch=node_watch,
                report_watch=report_watch,
                pool=pool,
                tick=args.tick,
                policy=POLICY,
                phase=phase,
                operators=operators,
                spare=spare,
            )
            current = operator
            if "restart" in args.phases:
                first = float(res["operator"].get("startup_s") or 0.0)
                res["warm_restart"], current = measure_restart(rctx, current, governed, first)
            if "failover" in args.phases:
                res["failover"], _ = measure_failover(rctx, current, args.failover_samples)
            if "drain" in args.phases:
                res["drain_storm"] = measure_drain(
                    rctx, args.drain_nodes, args.drain_pods, api_client(kc[SIM_USER], pool=32)
                )
        end = round(time.time() - bench_t0, 2)
        last = phases[-1][0].split(":")[0]
        log(f"   ({last} took {phase_elapsed(phases[-1][1], end)}; whole run {phase_elapsed(0, end)})")
        res["phases"] = phases
        res["wall_s"] = end
        write_outputs(out, res, series)
        rc = 0
    finally:
        if heartbeats is not None:
            heartbeats.close()
        for w in watches:
            w.stop.set()
        for s in samplers:
            s.stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        for f in fleets:
            f.stop()
        if operator is not None:
            operator.stop()
        for op in operators:
            op.kill()
        cluster.stop()
    return rc


def api_footprint(
    res: dict[str, Any],
    op_entries: list[AuditEntry],
    agent_entries: list[AuditEntry],
    op_sampler: ProcSampler,
    agent_sampler: ProcSampler,
) -> dict[str, Any]:
    """The API traffic gpuhealth adds, operator and agents apart.

    Requests per second from the audit log (the operator over the measured run, from every node evaluated to
    the end, and over the idle window; the footprint agent from its first request on, and that times the
    fleet's agents, one per node, since the simulated agents' identity is not audited). Bytes per second are
    what each process read and wrote through system calls over the same windows (/proc/PID/io: its API
    traffic, TLS included, plus its log writes); the audit log records no sizes.
    """
    now = time.time()
    op_from = op_sampler.samples[0][0] + float(res["operator"].get("startup_s") or 0.0)
    first = min((e.at for e in agent_entries), default=now)
    agent = {**api_rates(agent_entries, first, now), "bytes_per_s": _round(agent_sampler.io_rate(first, now))}
    fleet = res["nodes"]
    return {
        "operator": {
            **api_rates(op_entries, op_from, now),
            "bytes_per_s": _round(op_sampler.io_rate(op_from, now)),
            "idle_requests_per_s": round(res["operator"]["idle_requests_per_min"] / 60, 3),
        },
        "agent": agent,
        "fleet_agents": fleet,
        "agents_requests_per_s": _round(None if agent["requests_per_s"] is None else agent["requests_per_s"] * fleet),
        "agents_bytes_per_s": _round(None if agent["bytes_per_s"] is None else agent["bytes_per_s"] * fleet),
    }


def _round(v: float | None, digits: int = 1) -> float | None:
    return None if v is None else round(v, digits)


def agent_cpu_at_first_write(sampler: ProcSampler, first_write: float) -> float:
    """The agent's CPU seconds at its first write, from the sampler's record (closest sample after it)."""
    for t, cpu in sampler.cpu_samples:
        if t >= first_write:
            return cpu
    return sampler.cpu_s()
