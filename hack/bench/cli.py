"""The command line of `make bench` (``python -m hack.bench --help``): the sizes, the named profiles, the
phases a run selects, and the checks that the fleet is large enough for what they fault.

Nothing here touches a cluster: the checks are unit-tested on the arguments alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import hack.bench as package

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "build" / "bench"

# The phases a run may select; "core" is every phase the bench had before (detection, storm, devices, ...).
PHASES = ("core", "mig", "domain", "restart", "failover", "drain")
# "all": what it meant before the MIG fleet. The mig phase publishes every governed node as a MIG node,
# which the core phases' DRA nodes and fact traffic do not expect, so it runs without core, only when named;
# the domain storm (issue #35) labels the fleet into NVLink domains and runs only when named too.
ALL_PHASES = ("core", "restart", "failover", "drain")


# Named sizes. 10k: the 10,000 nodes with 80,000 pods; the counts that take the longest kept at the
# 1,000-node run's, and the emulated kubelets' and simulated agents' Lease writes slowed to what one 2-core
# machine carries beside the rest (docs/bench.md says why, and the time each phase takes).
PROFILES: dict[str, dict[str, Any]] = {
    "10k": {
        "nodes": 10000,
        "pods": 80000,
        "faults": 200,
        "storm": 100,
        "floor_samples": 40,
        "device_faults": 100,
        "device_storm": 100,
        "e2e_faults": 20,
        "traffic_faults": 40,
        "kubelet_lease": 600,
        "heartbeat": 60.0,
        # A whole MIG fleet of 10,000 nodes (560,000 DRA devices) ran this 24 GiB machine out of memory
        # while its slices were published (results/bench/mig-stopped-10000-2026-12-04-e4ec0d8.log):
        # the mig phase measures a tenth of the fleet in MIG mode, the rest whole GPUs.
        "mig_nodes": 1000,
    },
}


def rates(text: str) -> list[float]:
    """``--traffic``: comma-separated events per second; "0" or "" for no traffic phase."""
    out = [float(x) for x in text.split(",") if x.strip()]
    if any(r < 0 for r in out):
        raise argparse.ArgumentTypeError("traffic rates must be >= 0")
    return [r for r in out if r > 0]


def parse_phases(text: str) -> list[str]:
    """``--phases``: comma-separated names of PHASES ("all": every one), in the order they run."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    if names == ["all"]:
        return list(ALL_PHASES)
    unknown = [p for p in names if p not in PHASES]
    if unknown or not names:
        raise ValueError(f"unknown phases {unknown or names}: choose from {', '.join(PHASES)} or all")
    if "core" in names and "mig" in names:
        raise ValueError("the mig phase runs without core (it makes every governed node a MIG node)")
    return [p for p in PHASES if p in names]


def phases_arg(text: str) -> list[str]:
    try:
        return parse_phases(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m hack.bench", description=package.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=1000, help="fake GPU nodes governed by the policy")
    ap.add_argument("--pods", type=int, default=8000, help="running 1-GPU pods on them")
    ap.add_argument("--faults", type=int, default=200, help="single faults, one at a time, on distinct nodes")
    ap.add_argument("--storm", type=int, default=100, help="nodes faulting at the same instant")
    ap.add_argument(
        "--floor-nodes",
        type=int,
        default=None,
        help="extra nodes outside every policy for the no-logic floors (default: the most any floor takes at "
        "once: 20, --storm, --device-storm, --domain-size)",
    )
    ap.add_argument("--floor-samples", type=int, default=None, help="floor measurements (default faults/2, >= 20)")
    ap.add_argument("--idle", type=float, default=None, help="idle window in seconds (default 60; quick 20)")
    ap.add_argument(
        "--breaker-window", type=float, default=20.0, help="seconds of 50 ms sampling at the breaker's limit"
    )
    ap.add_argument("--tick", type=float, default=5.0, help="the operator's --tick")
    ap.add_argument(
        "--heartbeat", type=float, default=30.0, help="seconds between each agent's Lease renewals (30; 10k: 60)"
    )
    ap.add_argument(
        "--kubelet-lease",
        type=int,
        default=40,
        help="the emulated kubelets' (KWOK's) node Lease duration in seconds, renewed every quarter (40; 10k: 600)",
    )
    ap.add_argument("--device-faults", type=int, default=100, help="single GPU faults on distinct DRA nodes")
    ap.add_argument("--device-storm", type=int, default=100, help="GPUs on distinct DRA nodes faulting at once")
    ap.add_argument("--mig-faults", type=int, default=100, help="mig phase: single MIG GPU faults on distinct nodes")
    ap.add_argument("--mig-storm", type=int, default=100, help="mig phase: MIG GPUs on distinct nodes faulting at once")
    ap.add_argument(
        "--mig-nodes",
        type=int,
        default=None,
        help="mig phase: governed nodes in MIG mode, the first ones (default every one; 10k: 1000)",
    )
    ap.add_argument(
        "--domain-faults",
        type=int,
        default=None,
        help="domain phase: NVLink domains faulted one at a time (default 20; quick 4)",
    )
    ap.add_argument(
        "--domain-size", type=int, default=18, help="domain phase: nodes per NVLink domain (18: an NVL72 rack)"
    )
    ap.add_argument(
        "--real-agents", type=int, default=None, help="real agents, each on its own governed node (default 5; quick 2)"
    )
    ap.add_argument(
        "--e2e-faults",
        type=int,
        default=None,
        help="XIDs from the fake NVML library, one at a time (default 20; quick 6)",
    )
    ap.add_argument(
        "--traffic",
        type=rates,
        default=None,
        help="background fact-change rates, events/s, comma-separated (default 30,100,300; quick 10,30; 0: none)",
    )
    ap.add_argument(
        "--traffic-faults", type=int, default=None, help="single faults under each traffic rate (default 40; quick 8)"
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 100 nodes, 400 pods, 20 faults, 20 storm, 10+20 device, 2 real agents, 6 e2e faults",
    )
    ap.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        help="a named size: 10k = 10,000 nodes, 80,000 pods, counts as at 1,000 nodes (docs/bench.md)",
    )
    ap.add_argument(
        "--phases",
        type=phases_arg,
        default=["core"],
        help=f"what to measure, comma-separated, from {', '.join(PHASES)} or all (default core: every phase "
        "before issue #26; all: every phase but mig, which runs without core); restart, failover and drain run "
        "after the others, in that order",
    )
    ap.add_argument(
        "--drain-nodes", type=int, default=None, help="drain storm: nodes faulted at once (default nodes/4, <= 100)"
    )
    ap.add_argument("--drain-pods", type=int, default=15, help="drain storm: workload pods on each of them (15)")
    ap.add_argument(
        "--failover-samples", type=int, default=None, help="failover: SIGKILLs of the acting replica (5; quick 3)"
    )
    ap.add_argument(
        "--stack-profile",
        action="store_true",
        help="the operators sample their stacks (GPUHEALTH_STACK_PROFILE, into --out); the drain storm sums "
        "them over the storm (where the operator's time goes; costs it a few percent of a core)",
    )
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    if args.profile:
        if args.quick:
            ap.error("--profile and --quick exclude each other")
        # The profile's counts, except those given on the command line.
        given = {a.split("=", 1)[0] for a in (argv if argv is not None else sys.argv[1:]) if a.startswith("--")}
        for key, value in PROFILES[args.profile].items():
            if f"--{key.replace('_', '-')}" not in given:
                setattr(args, key, value)
    if args.quick:
        args.nodes, args.pods, args.faults, args.storm = 100, 400, 20, 20
        args.breaker_window = min(args.breaker_window, 10.0)
        args.device_faults, args.device_storm = 10, 20
        args.mig_faults, args.mig_storm = 10, 20
    if args.idle is None:
        args.idle = 20.0 if args.quick else 60.0
    if args.real_agents is None:
        args.real_agents = 2 if args.quick else 5
    if args.domain_faults is None:
        args.domain_faults = 4 if args.quick else 20
    if args.domain_faults < 1 or args.domain_size < 2:
        ap.error("--domain-faults must be >= 1 and --domain-size >= 2")
    if args.e2e_faults is None:
        args.e2e_faults = 6 if args.quick else 20
    if args.traffic is None:
        args.traffic = [10.0, 30.0] if args.quick else [30.0, 100.0, 300.0]
    if args.traffic_faults is None:
        args.traffic_faults = 8 if args.quick else 40
    if args.drain_nodes is None:
        args.drain_nodes = min(100, max(2, args.nodes // 4))
    if args.floor_nodes is None:
        # Each floor runs on the same count of nodes as the path it is the floor of (hack/bench/floors.py);
        # the drain storm's, with a spare for its PDB Deployment's replacements.
        args.floor_nodes = max(20, args.storm, args.device_storm, args.domain_size)
        if "mig" in args.phases:
            args.floor_nodes = max(args.floor_nodes, args.mig_storm)
        if "drain" in args.phases:
            args.floor_nodes = max(args.floor_nodes, args.drain_nodes + 1)
    if args.failover_samples is None:
        args.failover_samples = 3 if args.quick else 5
    if args.drain_pods < 1 or args.drain_nodes < 2:
        ap.error("--drain-pods must be >= 1 and --drain-nodes >= 2")
    if args.pods > 8 * args.nodes:
        ap.error("--pods must fit the nodes' GPUs (8 per node)")
    # Agent 0 keeps the footprint figures; the faults go to the others.
    if args.real_agents < 1 or (args.e2e_faults > 0 and args.real_agents < 2):
        ap.error("--real-agents must be >= 1, and >= 2 with --e2e-faults (agent 0 only measures the footprint)")
    if args.floor_samples is None:
        args.floor_samples = 10 if args.quick else max(20, args.faults // 2)
    # The restart, failover and drain phases take nodes no earlier phase faulted.
    core_nodes = 0
    if "core" in args.phases:
        core_nodes = args.faults + 2 * args.storm + args.device_faults + args.device_storm
        core_nodes += len(args.traffic) * args.traffic_faults
    core_nodes += ("mig" in args.phases) * (args.mig_faults + args.mig_storm)
    wanted = ("restart" in args.phases) + ("failover" in args.phases) * args.failover_samples
    wanted += ("drain" in args.phases) * (args.drain_nodes + 1)
    if wanted and core_nodes + wanted > args.nodes:
        ap.error(f"--nodes must leave {wanted} nodes for the restart, failover and drain phases beyond the others")
    domain_nodes = ("domain" in args.phases) * args.domain_faults * args.domain_size
    if domain_nodes and core_nodes + wanted + domain_nodes > args.nodes:
        ap.error(
            f"--nodes must leave {domain_nodes} nodes ({args.domain_faults} domains of {args.domain_size}) for the "
            "domain phase beyond the others"
        )
    if args.mig_nodes is None or args.mig_nodes > args.nodes:
        args.mig_nodes = args.nodes
    if "mig" in args.phases and args.mig_faults + args.mig_storm > args.mig_nodes:
        ap.error("--nodes and --mig-nodes must cover mig-faults + mig-storm distinct nodes")
    # The DRA nodes are the last governed ones; the node faults, storm and breaker take the first.
    if "core" in args.phases and args.faults + 2 * args.storm + args.device_faults + args.device_storm > args.nodes:
        ap.error("--nodes must cover faults + 2 x storm + device-faults + device-storm distinct nodes")
    # The traffic phase faults nodes other than the detection faults' and DRA nodes, its own for each rate,
    # and sends the traffic to the rest.
    if (
        "core" in args.phases
        and args.traffic
        and len(args.traffic) * args.traffic_faults + 1
        > (args.nodes - args.faults - args.device_faults - args.device_storm)
    ):
        ap.error("--nodes must leave --traffic-faults nodes for each rate and one for traffic, beyond the faults")
    if args.heartbeat <= 0:
        ap.error("--heartbeat must be positive")
    return args
