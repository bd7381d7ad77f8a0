"""The device figures of `make bench`: GPUs published through DRA, one uncorrected ECC error at a time
until an independent watch sees its DeviceTaintRule, a device storm, and every GPU reset.

The DRA nodes' GPUs are published as NVIDIA's DRA driver would (devkit/dra.py): a DeviceClass
and one ResourceSlice per node, pool = node name, devices ``gpu-0..7`` with the UUIDs their reports
carry, so the operator can place each GPU's fault on its device.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client

from devkit import dra
from hack.bench.fleet import SimNode, gpu_uuid
from hack.bench.floors import GpuFloor
from hack.bench.support import (
    DRA_GROUP,
    DRA_VERSION,
    FAULT_TIMEOUT_S,
    TAINT,
    latency_summary,
    log,
    percentile,
    publish_all,
)
from hack.bench.watch import NodeWatch, RuleWatch

DEVICE_GPU = 3  # the GPU that takes the uncorrected ECC error on a DRA node


def publish_dra(custom: client.CustomObjectsApi, sims: list[SimNode], gpus: int = 8) -> None:
    """The DeviceClass and each node's ResourceSlice, written as the driver's kubelet plugin would."""
    custom.create_cluster_custom_object(DRA_GROUP, DRA_VERSION, "deviceclasses", dra.device_class())
    for sim in sims:
        body = dra.resource_slice(sim.name, gpus, uuid=functools.partial(gpu_uuid, sim.index))
        custom.create_cluster_custom_object(DRA_GROUP, DRA_VERSION, "resourceslices", body)


def measure_devices(
    args: argparse.Namespace,
    sims: dict[str, SimNode],
    dra_nodes: list[str],
    rule_watch: RuleWatch,
    node_watch: NodeWatch,
    pool: ThreadPoolExecutor,
    series: dict[str, Any],
    phase: Callable[[str], None],
    floor: GpuFloor | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Device faults one at a time, then a device storm, then every GPU reset; the three result blocks.
    ``floor``: the path's no-logic floor, whose samples are taken among the single faults."""
    gpu = f"gpu-{DEVICE_GPU}"
    single, storm_nodes = dra_nodes[: args.device_faults], dra_nodes[args.device_faults :]
    among = f", floor: {floor.samples} samples among them" if floor is not None else ""
    phase(f"device faults: uncorrected ECC on GPU {DEVICE_GPU} of {len(single)} DRA nodes, one at a time{among}")
    lat: list[float] = []
    timeouts = 0
    for i, name in enumerate(single):
        t0 = time.time()
        sims[name].device_fault(DEVICE_GPU)
        t1 = rule_watch.wait_rule(name, gpu, timeout=FAULT_TIMEOUT_S)
        if t1 is None:
            timeouts += 1
        else:
            lat.append((t1 - t0) * 1000)
        time.sleep(0.2)
        if floor is not None:
            floor.spread(i, len(single))
        if (i + 1) % 50 == 0:
            log(f"  {i + 1}/{len(single)}: p50 so far {percentile(lat, 50):.0f} ms")
    latency = latency_summary(lat, timeouts, FAULT_TIMEOUT_S * 1000)
    # A device fault must not take out its node: count node taints on the DRA nodes.
    latency["nodes_tainted"] = sum(1 for n in single if (n, TAINT) in node_watch.seen_at)
    series["device_ms"] = lat
    log(f"  device fault to DeviceTaintRule p50 {latency['p50']} ms p99 {latency['p99']} ms ({timeouts} timed out)")

    phase(f"device storm: GPU {DEVICE_GPU} of {len(storm_nodes)} DRA nodes at once")
    published_at: dict[str, float] = {}

    def fault(sim: SimNode) -> None:
        sim.device_fault(DEVICE_GPU)
        published_at[sim.name] = time.time()

    t0 = time.time()
    failed = publish_all(pool, fault, [sims[n] for n in storm_nodes])
    published = time.time() - t0
    done = rule_watch.wait_all([(n, gpu) for n in storm_nodes], timeout=180)
    node_writes = node_watch.writers_between(t0, time.time())
    seen_at = {n: rule_watch.seen_at[(n, gpu)] for n in storm_nodes if (n, gpu) in rule_watch.seen_at}
    seen = sorted(t - t0 for t in seen_at.values())
    seconds = seen[-1] if seen and done else None
    per_gpu = [(seen_at[n] - published_at[n]) * 1000 for n in seen_at if n in published_at]
    storm = {
        "gpus": len(storm_nodes),
        "rules": len(seen),
        "seconds": round(seconds, 2) if seconds else None,
        "rules_per_s": round(len(storm_nodes) / seconds, 1) if seconds else None,
        "publish_s": round(published, 2),
        "first_rule_s": round(seen[0], 3) if seen else None,
        "publish_failures": failed,
        "report_to_rule_ms_p50": round(percentile(per_gpu, 50), 1),
        "report_to_rule_ms_max": round(max(per_gpu, default=float("nan")), 1),
        "nodes_tainted": sum(1 for n in storm_nodes if (n, TAINT) in node_watch.seen_at),
        "node_writes": node_writes,
    }
    series["device_storm"] = [(0.0, 0), *[(s, i + 1) for i, s in enumerate(seen)]]
    log(f"  {len(seen)}/{len(storm_nodes)} DeviceTaintRules in {seconds}s (reports published in {published:.2f}s)")

    phase("device recovery: every GPU reset (clean samples), probation 2s")
    t0 = time.time()
    publish_all(pool, SimNode.device_clear, [sims[n] for n in dra_nodes])
    gone = rule_watch.wait_all([(n, gpu) for n in dra_nodes], timeout=180, present=False)
    recovery = {
        "gpus": len(dra_nodes),
        "seconds_to_all_rules_deleted": round(time.time() - t0, 1) if gone else None,
        "rules_left": rule_watch.count(),
    }
    log(f"  {len(dra_nodes)} GPUs back in service in {recovery['seconds_to_all_rules_deleted']}s")
    return latency, storm, recovery
