"""`gpuhealth-operator`: run the operator in-cluster or locally against a kubeconfig."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
from pathlib import Path

import kopf
from prometheus_client import start_http_server

from gpuhealth.api.names import COMPONENT, GPU_RESOURCE
from gpuhealth.controller import metrics
from gpuhealth.controller.act.drainer import DRAIN_CONCURRENCY
from gpuhealth.controller.process.handlers import register
from gpuhealth.controller.process.heapprofile import HeapProfiler
from gpuhealth.controller.process.runtime import Runtime, connections
from gpuhealth.controller.process.stackprofile import StackProfiler
from gpuhealth.kube.client import Kube
from gpuhealth.kube.credentials import api_client

# Kopf's default keep-alive lifetime (60 s) left the fleet without an acting replica for up to a minute
# after the leader died (keep-alives every 50-55 s): 15 s keeps a failover within ~15 s, at one small
# patch of the peering object every 5-10 s per replica (docs/bench.md, failover).
PEERING_LIFETIME_S = 15


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpuhealth-operator", description=__doc__)
    ap.add_argument(
        "--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: in-cluster, then ~/.kube/config"
    )
    ap.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("GPUHEALTH_METRICS_PORT", "8080")),
        help="Prometheus /metrics port (0 disables)",
    )
    ap.add_argument(
        "--liveness",
        default=os.environ.get("GPUHEALTH_LIVENESS", ""),
        help="Kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz",
    )
    ap.add_argument(
        "--tick",
        type=float,
        default=float(os.environ.get("GPUHEALTH_TICK", "5")),
        help="seconds between sweeps for time-driven transitions (silence, probation, heat)",
    )
    ap.add_argument("--workers", type=int, default=16, help="concurrent reconciles (one per node at a time)")
    ap.add_argument(
        "--drain-concurrency",
        type=int,
        default=int(os.environ.get("GPUHEALTH_DRAIN_CONCURRENCY", str(DRAIN_CONCURRENCY))),
        help="checkpoint requests and evictions in flight at once, over every drain, on a thread pool of their "
        f"own (default {DRAIN_CONCURRENCY}); gpuhealth has no other client-side limit on them",
    )
    ap.add_argument(
        "--peering",
        default=os.environ.get("GPUHEALTH_PEERING", ""),
        help="Kopf peering name for several replicas (one acts); empty runs standalone",
    )
    ap.add_argument(
        "--priority",
        type=int,
        default=int(os.environ.get("GPUHEALTH_PRIORITY", "0")) or random.randint(1, 1_000_000),
        help="Kopf peering priority; the highest live replica acts. Default: random, so replicas differ "
        "(equal priorities make Kopf pause them all)",
    )
    ap.add_argument(
        "--peering-lifetime",
        type=int,
        default=int(os.environ.get("GPUHEALTH_PEERING_LIFETIME", str(PEERING_LIFETIME_S))),
        help="seconds a replica's peering keep-alive stays valid; a standby takes over within about this long "
        f"of the acting replica's death (keep-alives every lifetime minus 5-10 s). Default {PEERING_LIFETIME_S}; "
        "Kopf's own is 60",
    )
    ap.add_argument(
        "--event-namespace",
        default=os.environ.get("GPUHEALTH_EVENT_NAMESPACE", "default"),
        help="namespace for Events about cluster-scoped objects (Nodes, policies)",
    )
    ap.add_argument(
        "--lease-namespace",
        default=os.environ.get("GPUHEALTH_LEASE_NAMESPACE", ""),
        help="namespace of the agents' node Leases (their heartbeats) to watch; empty: reports carry heartbeats",
    )
    ap.add_argument(
        "--heap-profile",
        default=os.environ.get("GPUHEALTH_HEAP_PROFILE", ""),
        help="diagnostics: trace Python allocations and append growth by line to this JSON-lines file",
    )
    ap.add_argument(
        "--heap-profile-interval",
        type=float,
        default=float(os.environ.get("GPUHEALTH_HEAP_PROFILE_INTERVAL", "60")),
        help="seconds between heap profile samples (the first after a minute is the baseline)",
    )
    ap.add_argument(
        "--stack-profile",
        default=os.environ.get("GPUHEALTH_STACK_PROFILE", ""),
        help="diagnostics: sample every thread's stack and append busy stacks per 10 s to this JSON-lines "
        "file ({pid} in the path becomes the process id)",
    )
    ap.add_argument(
        "--stack-profile-hz",
        type=float,
        default=float(os.environ.get("GPUHEALTH_STACK_PROFILE_HZ", "50")),
        help="stack samples per second (1 to 200)",
    )
    ap.add_argument(
        "--kueue",
        choices=("auto", "on", "off"),
        default=os.environ.get("GPUHEALTH_KUEUE", "auto"),
        help="gpuhealth as a Kueue AdmissionCheck controller: auto (when Kueue's API is served), on, off",
    )
    ap.add_argument(
        "--gpu-resources",
        default=os.environ.get("GPUHEALTH_GPU_RESOURCES", GPU_RESOURCE),
        help="comma-separated Kueue quota resource names that count GPUs: the device plugin's "
        f"{GPU_RESOURCE}, and the names Kueue's deviceClassMappings give GPU DeviceClasses (DRA)",
    )
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.drain_concurrency < 1:
        ap.error("--drain-concurrency must be at least 1")
    if args.peering_lifetime < 11:
        # Kopf renews 5-10 s before the lifetime ends (at least every second): below 11 s a renewal
        # may come after the keep-alive expired, and the standby would take over from a live leader.
        ap.error("--peering-lifetime must be at least 11 seconds")
    args.gpu_resources = tuple(dict.fromkeys(r.strip() for r in args.gpu_resources.split(",") if r.strip()))
    if not args.gpu_resources:
        ap.error("--gpu-resources must name at least one resource")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if args.heap_profile:
        HeapProfiler(Path(args.heap_profile), args.heap_profile_interval).start()
    if args.stack_profile:
        StackProfiler(Path(args.stack_profile.replace("{pid}", str(os.getpid()))), args.stack_profile_hz).start()
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=metrics.REGISTRY)
    pool = connections(args.workers, args.drain_concurrency)
    kube = Kube(api_client(args.kubeconfig, pool_size=pool, user_agent=COMPONENT), event_namespace=args.event_namespace)
    runtime = Runtime(
        kube,
        workers=args.workers,
        tick=args.tick,
        lease_namespace=args.lease_namespace,
        kueue=args.kueue,
        gpu_resources=args.gpu_resources,
        drain_concurrency=args.drain_concurrency,
    )
    registry = kopf.OperatorRegistry()
    register(registry, runtime, args.kubeconfig, peering_lifetime_s=args.peering_lifetime)
    asyncio.run(
        kopf.operator(
            registry=registry,
            clusterwide=True,
            standalone=not args.peering,
            peering_name=args.peering or None,
            priority=args.priority,
            liveness_endpoint=args.liveness or None,
        )
    )


if __name__ == "__main__":
    main()
