"""The first phases of `make bench`, up to the first figure: the control plane and its fake GPU nodes,
the real agents, the running pods, the simulated fleet's first reports and heartbeats, the DRA and MIG
slices, the independent watches and the policies, then the operator's start-up (process start to
"watching N GPU nodes" and to every node Healthy).

``start`` runs them in that order and returns the ``Bench`` the measuring phases share; whatever it
started is in ``Started`` as soon as it runs, so a failed start-up is torn down too.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from devkit.agents import Agent, AgentFleet
from devkit.audit import read_audit
from devkit.k8s import OperatorProcess
from hack.bench.cluster import agent_policy_spec, policy_spec, run_pods
from hack.bench.context import (
    AGENT_NODE,
    AGENT_POLICY,
    AGENT_USER,
    E2E_USER,
    OPERATOR_USER,
    OPERATOR_WORKERS,
    POLICY,
    SIM_USER,
    TOKENS,
    Bench,
    Started,
)
from hack.bench.devices import publish_dra
from hack.bench.e2e import real_agents
from hack.bench.fleet import LEASE_NAMESPACE, HeartbeatDriver, HeartbeatStats, SimNode, heartbeat_workers
from hack.bench.floors import guarded, startup_floor
from hack.bench.mig import mig_layout, publish_mig
from hack.bench.startup_writes import first_pass_write, startup_profile
from hack.bench.support import GROUP, VERSION, PhaseClock, ProcSampler, api_client, find_log_line, log, publish_all
from hack.bench.watch import NodeWatch, ReportWatch, RuleWatch

STARTUP_TIMEOUT_S = 900.0  # process start to every governed node Healthy, or the run moves on without it
STARTUP_SHARE = 0.99  # also timed: this share of the fleet Healthy


def start(
    args: argparse.Namespace,
    out: Path,
    res: dict[str, Any],
    series: dict[str, Any],
    phase: PhaseClock,
    started: Started,
) -> Bench:
    """Every start-up phase in order; the run as the measuring phases find it."""
    cluster = started.cluster
    floor_names, agent_nodes, mem_samplers = control_plane(args, res, phase, started)
    kc = {u: cluster.kubeconfig_with_token(tok, out / f"{u}.kubeconfig", u) for tok, (u, _) in TOKENS.items()}
    admin = api_client(cluster.kubeconfig, pool=32)
    core, apps, custom = client.CoreV1Api(admin), client.AppsV1Api(admin), client.CustomObjectsApi(admin)
    # The agents' heartbeat Leases live where a gpuhealth install puts them (and the operator watches).
    cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NAMESPACE}}])
    governed = sorted(
        n["metadata"]["name"]
        for n in json.loads(core.list_node(label_selector="nvidia.com/gpu.present=true", _preload_content=False).data)[
            "items"
        ]
        if not {"bench-floor", "bench-agent"} & set(n["metadata"].get("labels") or {})
    )
    assert len(governed) == args.nodes, f"expected {args.nodes} governed nodes, found {len(governed)}"

    agent, agent_sampler, e2e_fleet = start_agents(args, out, kc, agent_nodes, phase, started)

    phase(f"{args.pods} running 1-GPU pods (one ReplicaSet per node, pods bound to it)")
    t = time.monotonic()
    res["pods"] = run_pods(cluster, apps, core, args.pods, governed, started.pool)
    res["pods_start_s"] = round(time.monotonic() - t, 1)
    res["pods_per_s"] = round(res["pods"] / res["pods_start_s"], 1) if res["pods_start_s"] > 0 else None
    log(f"  {res['pods']} pods Running in {res['pods_start_s']}s ({res['pods_per_s']} pods/s)")

    sims, hb_stats, mig_fleet = initial_reports(args, res, kc, governed, floor_names, phase, started)

    # The DRA nodes: the last governed ones, their GPUs published as NVIDIA's DRA driver would (one
    # ResourceSlice per node, pool = node name, devices gpu-0..7 with the UUIDs their reports carry).
    # The floor nodes publish theirs too, so that the device and MIG floors' rules select published
    # devices, as gpuhealth's do (kube-controller-manager's device-taint controller then evaluates both).
    dra_nodes = governed[len(governed) - args.device_faults - args.device_storm :] if "core" in args.phases else []
    used = set(dra_nodes)  # nodes the core phases fault (the others' pick among the rest)
    if dra_nodes:
        phase(f"DRA: a DeviceClass and {len(dra_nodes)} ResourceSlices (and {len(floor_names)} floor nodes')")
        publish_dra(custom, [sims[n] for n in [*dra_nodes, *floor_names]])
    if mig_fleet:
        phase(
            f"MIG: a DeviceClass and {len(mig_fleet)} ResourceSlices of 8 GPUs x 7 MIG devices"
            f" (and {len(floor_names)} floor nodes')"
        )
        t = time.monotonic()
        mig_sims = [s for s in sims.values() if s.mig is not None]  # the MIG fleet's agents and the floor's
        failed = publish_mig(custom, mig_sims, started.pool)
        log(f"  {len(mig_sims) - failed} slices in {time.monotonic() - t:.1f}s ({failed} failed)")
    rule_watch, node_watch, report_watch = start_watches(kc, started)

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

    # The first start-up's floor (hack/bench/floors.py): its lists and first writes, on this fleet, at the
    # operator's concurrency, before the operator starts (into fields it never reads).
    phase(f"first start-up floor: the lists, then {len(governed)} nodes' first writes, no logic")
    res.setdefault("floors", {})["startup"] = guarded(
        "first start-up", lambda: startup_floor(governed, core, custom, LEASE_NAMESPACE, OPERATOR_WORKERS)
    )
    operator, op_sampler, op_t0 = start_operator(
        args, out, res, kc, governed, report_watch, phase, started, mem_samplers
    )
    time.sleep(2 * args.tick)  # let the first sweeps pass
    hb_stats.reset_gap()
    hb_from = hb_stats.mark()
    return Bench(
        args=args,
        out=out,
        res=res,
        series=series,
        phase=phase,
        started=started,
        kc=kc,
        admin=admin,
        core=core,
        custom=custom,
        governed=governed,
        floor_names=floor_names,
        agent=agent,
        agent_sampler=agent_sampler,
        e2e_fleet=e2e_fleet,
        mem_samplers=mem_samplers,
        sims=sims,
        hb_stats=hb_stats,
        hb_from=hb_from,
        mig_fleet=mig_fleet,
        dra_nodes=dra_nodes,
        used=used,
        rule_watch=rule_watch,
        node_watch=node_watch,
        report_watch=report_watch,
        operator=operator,
        op_sampler=op_sampler,
        op_t0=op_t0,
    )


def control_plane(
    args: argparse.Namespace, res: dict[str, Any], phase: PhaseClock, started: Started
) -> tuple[list[str], list[str], dict[str, ProcSampler]]:
    """The control plane with the governed, floor and agent nodes, and a memory sampler on each of its
    processes; (floor nodes, agent nodes, samplers by process)."""
    cluster = started.cluster
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
    started.samplers.extend(mem_samplers.values())
    total = args.nodes + args.floor_nodes + args.real_agents
    log(f"  control plane and {total} nodes ready in {res['cluster_start_s']}s")
    return floor_names, agent_nodes, mem_samplers


def start_agents(
    args: argparse.Namespace,
    out: Path,
    kc: dict[str, Path],
    agent_nodes: list[str],
    phase: PhaseClock,
    started: Started,
) -> tuple[Agent, ProcSampler, AgentFleet]:
    """The real agents, each on its own node: the footprint agent (sampled every second) and those the
    end-to-end phase faults; (footprint agent, its sampler, the end-to-end fleet)."""
    # The real agents run for the whole bench, so the footprint agent's steady state is measured over minutes.
    phase(f"{args.real_agents} real agents (fake NVML, interval 10s, Lease heartbeat 30s), each on its own node")
    fleet = real_agents(kc[AGENT_USER], out / "agent", LEASE_NAMESPACE)
    started.fleets.append(fleet)
    fleet.start([AGENT_NODE])
    agent = fleet[AGENT_NODE]
    e2e_fleet = real_agents(kc[E2E_USER], out / "agents-e2e", LEASE_NAMESPACE, library=fleet.library)
    started.fleets.append(e2e_fleet)
    e2e_fleet.start([n for n in agent_nodes if n != AGENT_NODE])
    agent_proc = agent.popen
    assert agent_proc is not None
    agent_sampler = ProcSampler(agent_proc.pid, period=1.0).start()
    started.samplers.append(agent_sampler)
    return agent, agent_sampler, e2e_fleet


def initial_reports(
    args: argparse.Namespace,
    res: dict[str, Any],
    kc: dict[str, Path],
    governed: list[str],
    floor_names: list[str],
    phase: PhaseClock,
    started: Started,
) -> tuple[dict[str, SimNode], HeartbeatStats, set[str]]:
    """Every governed and floor node's first report through the agent's publisher, then the fleet's
    heartbeats, spread over one interval; (simulated agents by node, their heartbeat counts, MIG nodes)."""
    phase(f"initial reports for {args.nodes + args.floor_nodes} nodes through the agent's publisher")
    sim_api = api_client(kc[SIM_USER], pool=48)
    hb_stats = HeartbeatStats()
    # The MIG fleet (--phases mig): the first --mig-nodes governed nodes' agents report their GPUs in MIG mode,
    # and the floor nodes' too (the MIG floors publish the same reports and slices).
    mig_fleet = set(governed[: args.mig_nodes]) if "mig" in args.phases else set()
    mig_reports = mig_fleet | (set(floor_names) if "mig" in args.phases else set())
    sims = {
        n: SimNode(
            n, i, sim_api, heartbeat_s=args.heartbeat, stats=hb_stats, mig=mig_layout(i) if n in mig_reports else None
        )
        for i, n in enumerate([*governed, *floor_names])
    }
    t = time.monotonic()
    failed = publish_all(started.pool, SimNode.start, list(sims.values()))
    res["initial_reports_s"] = round(time.monotonic() - t, 1)
    log(f"  {len(sims) - failed} reports created in {res['initial_reports_s']}s ({failed} failed)")
    workers = heartbeat_workers(len(sims), args.heartbeat)
    started.heartbeats = HeartbeatDriver(list(sims.values()), args.heartbeat, workers=workers).start()
    log(
        f"  {len(sims)} simulated agents renew their Leases every {args.heartbeat:g}s, spread evenly"
        f" ({workers} in flight at most)"
    )
    return sims, hb_stats, mig_fleet


def start_watches(kc: dict[str, Path], started: Started) -> tuple[RuleWatch, NodeWatch, ReportWatch]:
    """The independent watches the figures are read from, each on its own client."""
    cluster = started.cluster
    rule_watch = RuleWatch(api_client(cluster.kubeconfig, pool=2)).start()
    started.watches.append(rule_watch)

    node_watch = NodeWatch(api_client(cluster.kubeconfig, pool=2)).start()
    started.watches.append(node_watch)
    report_watch = ReportWatch(api_client(cluster.kubeconfig, pool=2)).start()
    started.watches.append(report_watch)
    return rule_watch, node_watch, report_watch


def start_operator(
    args: argparse.Namespace,
    out: Path,
    res: dict[str, Any],
    kc: dict[str, Path],
    governed: list[str],
    report_watch: ReportWatch,
    phase: PhaseClock,
    started: Started,
    mem_samplers: dict[str, ProcSampler],
) -> tuple[OperatorProcess, ProcSampler, float]:
    """The operator's start-up, the first figure (``res["operator"]``); (operator, its sampler, when it
    started)."""
    phase("operator start-up")
    operator = OperatorProcess(
        started.cluster,
        out / "operator.log",
        extra_args=[f"--kubeconfig={kc[OPERATOR_USER]}", f"--tick={args.tick}", f"--workers={OPERATOR_WORKERS}"],
    )
    started.operator = operator
    op_t0 = time.time()
    operator.start()
    assert operator.popen is not None
    op_sampler = ProcSampler(operator.popen.pid, period=0.25).start()
    started.samplers.append(op_sampler)
    found = find_log_line(out / "operator.log", r"watching \d+ GPU nodes", timeout=600)
    watching_s = round(found[0] - op_t0, 2) if found else None
    # Most of a fleet evaluated, then all of it: where "all" misses, the first says whether start-up was
    # slow or a few nodes were not Healthy at the end (and the tally says what they were instead).
    most_at = report_watch.wait_share(governed, "Healthy", STARTUP_SHARE, timeout=STARTUP_TIMEOUT_S)
    left = STARTUP_TIMEOUT_S - (time.time() - op_t0)
    healthy_at = report_watch.wait_states(governed, "Healthy", timeout=max(0.0, left)) if most_at else None
    healthy_s = round(healthy_at - op_t0, 2) if healthy_at else None
    most_s = round(most_at - op_t0, 2) if most_at else None
    log(
        f"  'watching ... GPU nodes' after {watching_s}s; {STARTUP_SHARE:.0%} of {args.nodes} nodes Healthy after "
        f"{most_s}s, all after {healthy_s}s"
    )
    res["operator"] = {
        "startup_watching_s": watching_s,
        "startup_s": healthy_s,
        "startup_most_s": most_s,
        "startup_most_share": STARTUP_SHARE,
    }
    res["operator"]["startup_profile"] = profile_startup(
        started, operator, op_t0, healthy_at or time.time(), {"gpuhealth-operator": op_sampler, **mem_samplers}
    )
    if healthy_at is None:
        states = report_watch.tally(governed)
        log(f"  not every node Healthy within {STARTUP_TIMEOUT_S:.0f} s of the start: {states}")
        res["operator"]["startup_states"] = states
    return operator, op_sampler, op_t0


def profile_startup(
    started: Started, operator: OperatorProcess, op_t0: float, end: float, samplers: dict[str, ProcSampler]
) -> dict[str, Any] | None:
    """What start-up waited on (``hack/bench/startup_writes.py``): the audit log and the processes' CPU
    from the operator's first write to ``end`` (every node evaluated, or the start-up timeout), and the
    passes it took by then (its own counters: a pass that cannot write yet is CPU spent for nothing)."""
    time.sleep(1.0)  # the audit log is written as each request completes
    entries = list(read_audit(started.cluster.audit_log, OPERATOR_USER))
    first = first_pass_write(entries, op_t0)
    if first is None or first >= end:
        return None
    profile = startup_profile(
        entries, first, end, OPERATOR_WORKERS, cpu={n: s.cpu_samples for n, s in samplers.items()}
    )
    profile["passes"] = {
        "total": operator.metric("gpuhealth_reconciles_total"),
        "lease_requeues": operator.metric("gpuhealth_lease_reconciles_total"),
    }
    log(f"  start-up writes: {profile}")
    return profile
