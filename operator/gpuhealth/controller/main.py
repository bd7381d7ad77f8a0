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

from gpuhealth.controller import metrics
from gpuhealth.controller.handlers import register
from gpuhealth.controller.heapprofile import HeapProfiler
from gpuhealth.controller.runtime import Runtime
from gpuhealth.kube.client import Kube
from gpuhealth.kube.credentials import api_client


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
        "--kueue",
        choices=("auto", "on", "off"),
        default=os.environ.get("GPUHEALTH_KUEUE", "auto"),
        help="gpuhealth as a Kueue AdmissionCheck controller: auto (when Kueue's API is served), on, off",
    )
    ap.add_argument("-v", "--verbose", action="store_true")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if args.heap_profile:
        HeapProfiler(Path(args.heap_profile), args.heap_profile_interval).start()
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=metrics.REGISTRY)
    kube = Kube(api_client(args.kubeconfig), event_namespace=args.event_namespace)
    reconciler = Runtime(
        kube, workers=args.workers, tick=args.tick, lease_namespace=args.lease_namespace, kueue=args.kueue
    )
    registry = kopf.OperatorRegistry()
    register(registry, reconciler, args.kubeconfig)
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
