"""`make bench`'s driver: the results' header, the phases in the order they run, the outputs, and the
teardown of everything the run started, however far it got (what a run measures: hack/bench/__init__.py).

Each phase is a function of the ``Bench`` start-up returns (hack/bench/context.py) and adds its block to
the results; this module decides which run, in which order, and on which nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client

from devkit.k8s import wait_for
from hack.bench.cli import parse_args
from hack.bench.cluster import BenchCluster, agent_silence, machine
from hack.bench.context import AGENT_USER, OPERATOR_USER, OPERATOR_WORKERS, POLICY, SIM_USER, TOKENS, Bench, Started
from hack.bench.cpu import STACK_PROFILE_ENV, CpuWindow, run_processes
from hack.bench.detection import Floor, fault_nodes, measure_detection
from hack.bench.devices import DEVICE_GPU, measure_devices
from hack.bench.domain import measure_domain
from hack.bench.drain import measure_drain, measure_drain_floor
from hack.bench.e2e import measure_e2e
from hack.bench.failover import measure_failover
from hack.bench.fleet import LEASE_NAMESPACE
from hack.bench.floors import DomainFloor, GpuFloor, guarded, restart_floor, storm_floor
from hack.bench.footprint import measure_idle
from hack.bench.mig import MIG_GPU, gpu_devices, measure_mig
from hack.bench.report import write_outputs
from hack.bench.resilience import ResilienceContext
from hack.bench.restart import measure_restart
from hack.bench.startup import start
from hack.bench.storm import measure_breaker, measure_recovery, measure_storm
from hack.bench.support import FAULT_TIMEOUT_S, GROUP, TAINT, VERSION, PhaseClock, api_client, log
from hack.bench.traffic import TrafficContext, measure_traffic


def policy_status(custom: client.CustomObjectsApi) -> dict[str, Any]:
    """The fleet policy's status, as the operator last wrote it."""
    status: dict[str, Any] = (
        custom.get_cluster_custom_object(GROUP, VERSION, "gpuhealthpolicies", POLICY).get("status") or {}
    )
    return status


def header(args: argparse.Namespace) -> dict[str, Any]:
    """The results' first keys: the fleet, the machine and every setting the run was given."""
    return {
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
            "stack_profile": args.stack_profile,
            "drain_nodes": args.drain_nodes,
            "drain_pods_per_node": args.drain_pods,
            "failover_samples": args.failover_samples,
            "mig_faults": args.mig_faults,
            "mig_storm": args.mig_storm,
            "domain_faults": args.domain_faults,
            "domain_size": args.domain_size,
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if args.stack_profile:  # every operator process started from here on inherits it (devkit/k8s.py)
        os.environ[STACK_PROFILE_ENV] = str((out / "operator-stacks-{pid}.jsonl").resolve())
    res = header(args)
    series: dict[str, Any] = {}
    phase = PhaseClock()
    started = Started(
        cluster=BenchCluster(
            out / "cluster",
            nodes=args.nodes,
            extra_tokens=TOKENS,
            audit_users=[OPERATOR_USER, AGENT_USER],
            apiserver_args=["--max-requests-inflight=1000", "--max-mutating-requests-inflight=500"],
            kubelet_lease_s=args.kubelet_lease,
        ),
        pool=ThreadPoolExecutor(max_workers=32, thread_name_prefix="sim"),
    )
    rc = 1
    try:
        b = start(args, out, res, series, phase, started)
        if "core" in args.phases:
            core(b)
        if set(args.phases) - {"core"}:
            beyond_core(b)
        end = phase.end()
        res["phases"] = phase.phases
        res["wall_s"] = end
        write_outputs(out, res, series)
        rc = 0
    except BaseException as e:
        # A phase that fails late, or a run stopped by hand (SIGTERM exits through here), would otherwise
        # take every figure measured before it along (the 10,000-node run at 168fb85 failed in its last
        # phase after 112 minutes and kept nothing).
        res["stopped"] = {"phase": phase.phases[-1][0] if phase.phases else None, "error": f"{type(e).__name__}: {e}"}
        res["phases"] = phase.phases
        (out / "results-stopped.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
        log(f"stopped in {res['stopped']['phase']!r}; what was measured is in {out / 'results-stopped.json'}")
        raise
    finally:
        started.stop()
    return rc


def core(b: Bench) -> None:
    """The phases before issue #26 (``--phases core``), in their order, each on nodes of its own where
    a node faulted before would skew it."""
    args, res = b.args, b.res
    nodes = fault_nodes(b.governed, args.faults, args.storm)
    b.used |= {*nodes.detect, *nodes.storm, *nodes.breaker}
    floor = Floor(b.floor_names, b.sims, b.node_watch, b.report_watch, b.core, b.custom)
    measure_detection(b, nodes.detect, floor)

    if args.e2e_faults:
        b.phase(f"end to end: {args.e2e_faults} XIDs from fake NVML through {len(b.e2e_fleet.agents)} real agents")
        res["e2e"] = measure_e2e(
            list(b.e2e_fleet.agents.values()), args.e2e_faults, b.node_watch, b.report_watch, b.core, b.series
        )
        p = res["e2e"]["emit_to_taint_ms"]
        log(f"  end to end p50 {p['p50']:.0f} ms p99 {p['p99']:.0f} ms ({p['timeouts']} timed out)")

    measure_storm(b, nodes.storm)
    b.phase(f"node storm floor: {min(args.storm, len(b.floor_names))} floor nodes quarantined at once, no logic")
    floors(b)["storm"] = guarded(
        "node storm",
        lambda: storm_floor(
            b.floor_names[: args.storm],
            b.sims,
            b.core,
            b.custom,
            b.node_watch,
            b.report_watch,
            b.pool,
            OPERATOR_WORKERS,
        ),
    )
    measure_recovery(b, [*nodes.detect, *nodes.storm])
    if args.traffic:
        traffic(b, floor)
    if b.dra_nodes:
        device_floor = gpu_floor(b, DEVICE_GPU)
        res["device_to_rule_ms"], res["device_storm"], res["device_recovery"] = measure_devices(
            args, b.sims, b.dra_nodes, b.rule_watch, b.node_watch, b.pool, b.series, b.phase, floor=device_floor
        )
        b.phase(f"device storm floor: {args.device_storm} GPU faults at once, no logic")
        gpu_floors(b, ("device", "device_storm"), device_floor, args.device_storm)
    measure_breaker(b, nodes.breaker)
    measure_idle(b)


def gpu_floor(
    b: Bench, gpu: int, devices: Callable[[str], Sequence[str]] | None = None, what: str = "device"
) -> GpuFloor:
    """A GPU path's floors on the floor nodes (hack/bench/floors.py ``GpuFloor``; ``devices``: a MIG
    GPU's), whose one-at-a-time samples the phase takes among its own faults."""
    return GpuFloor(
        b.floor_names,
        b.args.floor_samples,
        gpu,
        b.sims,
        b.custom,
        b.rule_watch,
        b.report_watch,
        OPERATOR_WORKERS,
        FAULT_TIMEOUT_S,
        devices=devices,
        what=what,
    )


def gpu_floors(b: Bench, keys: tuple[str, str], floor: GpuFloor, storm: int) -> None:
    """A GPU path's floors filed under ``keys``: its samples (those the phase did not take among its
    faults taken now), then ``storm`` at once; one that failed is a floor that timed out."""
    try:
        single = guarded(f"{floor.what} path", floor.single)
        # Where the storm floor's time went, as gpuhealth's storm records it: a process busy over one
        # storm and not the other (kwok, at 10,000 nodes) is then in the files, not a guess.
        cpu = CpuWindow(run_processes(b.cluster, [b.operator])).start()
        t0 = time.time()
        many = guarded(f"{floor.what} storm", lambda: floor.storm(storm, b.pool))
        many["cpu"] = cpu.stop()
        many["node_writes"] = b.node_watch.writers_between(t0, time.time())
    finally:
        floor.close()
    floors(b).update(zip(keys, (single, many), strict=True))


def floors(b: Bench) -> dict[str, Any]:
    """The run's no-logic floors beside detection's (hack/bench/floors.py), by path."""
    out: dict[str, Any] = b.res.setdefault("floors", {})
    return out


def traffic(b: Bench, floor: Floor) -> None:
    """The fact traffic phase at each ``--traffic`` rate, its single faults on nodes of their own."""
    args, governed, dra_nodes, sims = b.args, b.governed, b.dra_nodes, b.sims
    # Nodes not faulted yet first (the storm's had one quarantine): the operator holds a node that
    # was quarantined three times within its flapping window for repair, and the detection nodes
    # were faulted once already; each rate takes its own nodes.
    fresh = governed[args.faults : len(governed) - len(dra_nodes)]
    fresh = fresh[args.storm :] + fresh[: args.storm]
    per_rate = [fresh[i * args.traffic_faults : (i + 1) * args.traffic_faults] for i in range(len(args.traffic))]
    quiet = {n for nodes in per_rate for n in nodes} | set(dra_nodes)
    b.used |= quiet
    b.phase(
        f"fact traffic: {', '.join(f'{r:g}' for r in args.traffic)} changes/s, "
        f"{args.traffic_faults} single faults under each"
    )
    ctx = TrafficContext(
        nodes=[sims[n] for n in governed if n not in quiet],
        kubeconfig=b.kc[SIM_USER],
        sims=sims,
        node_watch=b.node_watch,
        report_watch=b.report_watch,
        operator=b.op_sampler,
        audit_log=b.cluster.audit_log,
        operator_user=OPERATOR_USER,
        pool=b.pool,
        floor=floor.once,
        settle_s=2 * args.tick,
    )
    b.res["traffic"] = measure_traffic(ctx, args.traffic, per_rate)


def beyond_core(b: Bench) -> None:
    """The MIG fleet, the domain storm, then the restart, failover and drain phases, on nodes no phase has
    faulted yet."""
    args, res, custom = b.args, b.res, b.custom
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
        mig_nodes = [n for n in b.governed if n in b.mig_fleet and n not in b.used][: args.mig_faults + args.mig_storm]
        b.used |= set(mig_nodes)
        mig_floor = gpu_floor(
            b, MIG_GPU, devices=lambda n: [d for _, d in gpu_devices(n, b.sims[n].index, MIG_GPU)], what="MIG"
        )
        res["mig"] = measure_mig(
            args,
            b.sims,
            len(b.mig_fleet),
            mig_nodes,
            custom,
            b.rule_watch,
            b.node_watch,
            b.op_sampler,
            b.pool,
            b.series,
            b.phase,
            cpu_pids=run_processes(b.cluster, [b.operator]),
            floor=mig_floor,
        )
        b.phase(f"MIG storm floor: {args.mig_storm} MIG GPU faults at once, no logic")
        gpu_floors(b, ("mig", "mig_storm"), mig_floor, args.mig_storm)
    if "domain" in args.phases:
        fresh = [n for n in b.governed if n not in b.used and (n, TAINT) not in b.node_watch.seen_at]
        fresh.sort(key=lambda n: n in b.mig_fleet)  # whole-GPU nodes first, as the restart's spare below
        domain_floor = DomainFloor(
            b.floor_names[: args.domain_size],
            args.domain_faults,
            b.sims,
            b.core,
            b.custom,
            b.node_watch,
            b.report_watch,
            OPERATOR_WORKERS,
            FAULT_TIMEOUT_S,
        )
        res["domain_storm"] = measure_domain(
            b.sims,
            fresh,
            args.domain_faults,
            args.domain_size,
            b.core,
            client.AppsV1Api(b.admin),
            b.custom,
            b.node_watch,
            b.report_watch,
            b.pool,
            b.series,
            b.phase,
            settle_s=2 * args.tick,
            operator=b.op_sampler,
            floor=domain_floor,
        )
        b.used |= set(fresh[: args.domain_faults * args.domain_size])
        floors(b)["domain"] = guarded("domain storm", domain_floor.single)
    # Nodes no phase has faulted yet, taken in turn by the restart, failover and drain phases; whole-GPU
    # nodes first (a --mig-nodes sample leaves them), so their figures compare with runs without MIG.
    spare = [n for n in b.governed if n not in b.used and (n, TAINT) not in b.node_watch.seen_at]
    spare.sort(key=lambda n: n in b.mig_fleet)
    rctx = ResilienceContext(
        cluster=b.cluster,
        out=b.out,
        admin=b.admin,
        operator_kubeconfig=b.kc[OPERATOR_USER],
        operator_user=OPERATOR_USER,
        sims=b.sims,
        node_watch=b.node_watch,
        report_watch=b.report_watch,
        pool=b.pool,
        tick=args.tick,
        policy=POLICY,
        phase=b.phase,
        operators=b.started.operators,
        spare=spare,
    )
    current = b.operator
    if "restart" in args.phases:
        first = float(res["operator"].get("startup_s") or 0.0)
        res["warm_restart"], current = measure_restart(rctx, current, b.governed, first)
        b.phase("warm restart floor: the operator's start-up lists, all at once, no logic")
        floors(b)["restart"] = guarded("warm restart", lambda: restart_floor(b.core, b.custom, LEASE_NAMESPACE))
    if "failover" in args.phases:
        res["failover"], _ = measure_failover(rctx, current, args.failover_samples)
    if "drain" in args.phases:
        sim_api = api_client(b.kc[SIM_USER], pool=32)
        res["drain_storm"] = measure_drain(rctx, args.drain_nodes, args.drain_pods, sim_api)
        floors(b)["drain"] = guarded(
            "drain storm",
            lambda: measure_drain_floor(
                rctx, b.floor_names[: args.drain_nodes + 1], args.drain_pods, sim_api, OPERATOR_WORKERS
            ),
        )
