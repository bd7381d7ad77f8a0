"""``gpuhealth-agent``: the per-node GPU health reporter (command-line entry point)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from gpuhealth.agent.nic_source import ENV_NIC_EXCLUDE, ENV_SYSFS_ROOT, parse_exclude
from gpuhealth.agent.nvml_source import ENV_LIBRARY
from gpuhealth.agent.pod_resources import DEFAULT_SOCKET as POD_RESOURCES_SOCKET
from gpuhealth.agent.runner import MIN_HANG_AFTER_S, Agent, AgentConfig, agent_version, collect_once
from gpuhealth.kube.credentials import api_client

log = logging.getLogger("gpuhealth.agent")

EXIT_NVML_UNAVAILABLE = 3
ENV_POD_RESOURCES_SOCKET = "GPUHEALTH_POD_RESOURCES_SOCKET"
# Used when --state-dir is unset and this directory exists (the DaemonSet mounts an emptyDir here).
DEFAULT_STATE_DIR = "/var/lib/gpuhealth-agent"


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value else default


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {value}")
    return number


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuhealth-agent",
        description="Report this node's GPU health facts (NVML, optionally DCGM) as a GPUNodeHealth object.",
    )
    p.add_argument(
        "--node-name",
        default=_env("NODE_NAME"),
        help="node to report for; the object is named after it (env NODE_NAME, else the hostname)",
    )
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    p.add_argument(
        "--interval",
        type=_positive,
        default=float(_env("GPUHEALTH_INTERVAL", "10") or 10),
        help="seconds between samples (env GPUHEALTH_INTERVAL, default 10)",
    )
    p.add_argument(
        "--heartbeat-interval",
        type=_positive,
        default=float(_env("GPUHEALTH_HEARTBEAT_INTERVAL", "30") or 30),
        help="seconds between heartbeats when nothing changed (env GPUHEALTH_HEARTBEAT_INTERVAL, default 30)",
    )
    p.add_argument(
        "--lease-namespace",
        default=_env("GPUHEALTH_LEASE_NAMESPACE") or _env("POD_NAMESPACE"),
        help="namespace of the node Lease renewed as the heartbeat (env GPUHEALTH_LEASE_NAMESPACE, then "
        "POD_NAMESPACE); unset: heartbeat by patching the report",
    )
    p.add_argument(
        "--event-timeout",
        type=_positive,
        default=1.0,
        help="seconds one nvmlEventSetWait may block; bounds shutdown latency (default 1)",
    )
    p.add_argument(
        "--nvml-hang-after",
        type=_positive,
        default=None,
        help="seconds after which an NVML call that has not returned is reported as NVML unresponsive "
        f"(default: 3 sampling intervals, at least {MIN_HANG_AFTER_S:.0f})",
    )
    p.add_argument(
        "--nvml-library",
        default=_env(ENV_LIBRARY),
        help=f"path of the NVML library instead of libnvidia-ml.so.1 (env {ENV_LIBRARY})",
    )
    p.add_argument(
        "--dcgm-url",
        default=_env("GPUHEALTH_DCGM_URL"),
        help="DCGM exporter metrics URL, e.g. http://localhost:9400/metrics (env GPUHEALTH_DCGM_URL)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(_env("GPUHEALTH_METRICS_PORT", "9401") or 9401),
        help="port for /metrics and /healthz; 0 disables (env GPUHEALTH_METRICS_PORT, default 9401)",
    )
    p.add_argument("--metrics-bind", default="0.0.0.0", help="address for the metrics server (default 0.0.0.0)")
    p.add_argument(
        "--state-dir",
        default=_env("GPUHEALTH_STATE_DIR"),
        help="directory of the local XID journal, which keeps XIDs across agent crashes (env "
        f"GPUHEALTH_STATE_DIR; default {DEFAULT_STATE_DIR} if it exists, else no journal)",
    )
    p.add_argument(
        "--sysfs-root",
        default=os.environ.get(ENV_SYSFS_ROOT, "/sys"),
        help=f"where sysfs is mounted, for NIC health from class/infiniband and class/net (env {ENV_SYSFS_ROOT}, "
        "default /sys); empty: NICs are not watched",
    )
    p.add_argument(
        "--nic-exclude",
        default=_env(ENV_NIC_EXCLUDE, ""),
        help=f"comma-separated InfiniBand device names never reported, e.g. a management NIC (env {ENV_NIC_EXCLUDE}); "
        "NICs on a NUMA node without a GPU are excluded anyway",
    )
    p.add_argument(
        "--pod-resources-socket",
        default=_env(ENV_POD_RESOURCES_SOCKET, ""),
        help="the kubelet's pod-resources socket, read each sample for the pods holding each GPU, e.g. "
        f"{POD_RESOURCES_SOCKET} (env {ENV_POD_RESOURCES_SOCKET}); empty (the default): not read",
    )
    p.add_argument(
        "--pod-resources-timeout",
        type=_positive,
        default=float(_env("GPUHEALTH_POD_RESOURCES_TIMEOUT", "3") or 3),
        help="seconds one List call on the pod-resources socket may take (env GPUHEALTH_POD_RESOURCES_TIMEOUT, "
        "default 3)",
    )
    p.add_argument("--max-backoff", type=_positive, default=30.0, help="longest wait between API retries in seconds")
    p.add_argument("--max-xid-events", type=int, default=64, help="XID events kept in the report (default 64)")
    p.add_argument("--once", action="store_true", help="sample once, write (or print) the report once, exit")
    p.add_argument("--dry-run", action="store_true", help="no cluster: print the report instead of writing it")
    p.add_argument(
        "--log-level",
        default=_env("GPUHEALTH_LOG_LEVEL", "INFO"),
        help="logging level (env GPUHEALTH_LOG_LEVEL)",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {agent_version()}")
    return p


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    return AgentConfig(
        node_name=args.node_name or socket.gethostname(),
        interval_s=args.interval,
        heartbeat_interval_s=args.heartbeat_interval,
        event_timeout_s=args.event_timeout,
        nvml_library=args.nvml_library,
        dcgm_url=args.dcgm_url,
        metrics_port=args.metrics_port,
        metrics_bind=args.metrics_bind,
        max_xid_events=args.max_xid_events,
        max_backoff_s=args.max_backoff,
        lease_namespace=args.lease_namespace or None,
        nvml_hang_after_s=args.nvml_hang_after,
        state_dir=None if args.once and args.dry_run else resolve_state_dir(args.state_dir),
        sysfs_root=args.sysfs_root or None,
        nic_exclude=parse_exclude(args.nic_exclude),
        pod_resources_socket=args.pod_resources_socket or None,
        pod_resources_timeout_s=args.pod_resources_timeout,
    )


def resolve_state_dir(value: str | None, default: str = DEFAULT_STATE_DIR) -> str | None:
    """The journal directory: the one given, else the default where it exists, else none (warned)."""
    if value:
        return value
    if os.path.isdir(default):
        return default
    log.warning(
        "no --state-dir and no %s: running without the XID journal; an XID received just before a crash can be lost",
        default,
    )
    return None


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=str(args.log_level).upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.node_name:
        log.warning("NODE_NAME not set; using the hostname %s", socket.gethostname())
    config = config_from_args(args)

    if args.once and args.dry_run:
        spec = collect_once(config)
        sys.stdout.write(json.dumps(spec, indent=2, sort_keys=True) + "\n")
        sys.exit(0 if spec["nvml"]["available"] else EXIT_NVML_UNAVAILABLE)

    from gpuhealth.agent.lease import KubeLeaseTransport, LeaseTransport, PrintLeaseTransport
    from gpuhealth.agent.transport import FIELD_MANAGER, KubeTransport, PrintTransport, ReportTransport

    transport: ReportTransport
    leases: LeaseTransport
    if args.dry_run:
        transport, leases = PrintTransport(sys.stdout), PrintLeaseTransport(sys.stdout)
    else:
        api = api_client(args.kubeconfig, user_agent=FIELD_MANAGER)
        transport, leases = KubeTransport(api), KubeLeaseTransport(api)

    if args.once:
        agent = Agent(dataclasses.replace(config, metrics_port=0), transport)
        kind = agent.run_once()
        log.info("report %s written once (%s)", config.node_name, kind)
        snapshot = agent.latest.get()
        sys.exit(0 if snapshot is not None and snapshot.nvml.available else EXIT_NVML_UNAVAILABLE)

    stop = threading.Event()

    def _handle(signum: int, _frame: FrameType | None) -> None:
        log.info("received signal %d; stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _handle)
    signal.signal(signal.SIGINT, _handle)
    Agent(config, transport, lease_transport=leases).run(stop)


if __name__ == "__main__":
    main()
