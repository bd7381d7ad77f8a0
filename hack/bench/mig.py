"""The MIG fleet of `make bench` (``--phases mig``): every governed node's 8 GPUs in static MIG mode
(or the first ``--mig-nodes`` ones'; the 10k profile takes 1,000, as a whole MIG fleet of 10,000 does
not fit the bench machine), 7 x 1g.10gb each (the H100 80GB profile with seven placements), 56 DRA
devices a node.

A bad GPU is all of its MIG devices, so a GPU-scoped fault (an uncorrected ECC error) is done only
when the last of its seven DeviceTaintRules is in; that is what the phase times. The slices are
published exactly as NVIDIA's DRA driver shapes static MIG (devkit/dra_shapes.py: devices
``gpu-<minor>-mig-1g10gb-19-<start>``, ``type=mig``, ``uuid``, ``parentUUID``, ``profile``; no
full ``gpu-<minor>`` device), and each simulated agent reports the same GPUs with ``migMode:
Enabled`` and their ``migDevices`` (the MIG UUIDs the slices carry), as the real agent does.

Measured: faults one at a time on distinct nodes (report write to the GPU's last rule, and its
first), a storm of GPUs on distinct nodes at once, every rule's selector checked, and the GPUs'
rules removed after a reset (probation). The pure parts (layout, shapes, the rule check, the
last-rule times) are unit-tested.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from kubernetes import client

from devkit import dra, dra_shapes
from gpuhealth.api.report import MigDevice
from hack.bench.cpu import CpuWindow
from hack.bench.fleet import SimNode, gpu_uuid
from hack.bench.support import (
    DEVICE_TAINT_RULES,
    DRA_GROUP,
    DRA_VERSION,
    FAULT_TIMEOUT_S,
    TAINT,
    ProcSampler,
    latency_summary,
    log,
    percentile,
    publish_all,
)
from hack.bench.watch import Device, NodeWatch, RuleWatch, last_rule

if TYPE_CHECKING:
    from hack.bench.floors import GpuFloor

GPUS = 8
PROFILE = "1g.10gb"  # H100 80GB: seven placements, starts 0..6, GPU instance profile 19
STARTS: tuple[int, ...] = next(p[5] for p in dra_shapes.H100_PROFILES if p[0] == PROFILE)
FIRST_GI = 7  # NVML numbers the seven 1g GPU instances of a full H100 7..13
MIG_GPU = 3  # the GPU that takes the uncorrected ECC error
STORM_TIMEOUT_S = 180.0


def mig_layout(node_index: int) -> dict[int, tuple[MigDevice, ...]]:
    """What the node's agent reports: every GPU MIG-enabled, its seven MIG devices with the slices' UUIDs."""
    out = {}
    for g in range(GPUS):
        parent = gpu_uuid(node_index, g)
        out[g] = tuple(
            MigDevice(
                index=k,
                uuid=dra_shapes.mig_uuid(parent, PROFILE, start),
                gpu_instance=FIRST_GI + k,
                compute_instance=0,
                profile=PROFILE,
            )
            for k, start in enumerate(STARTS)
        )
    return out


def mig_slices(node: str, node_index: int) -> dra_shapes.Published:
    """The node's ResourceSlice as the driver publishes static MIG: 8 GPUs x 7 MIG devices, one pool."""
    gpus = [dra_shapes.Gpu(g, gpu_uuid(node_index, g), tuple((PROFILE, s) for s in STARTS)) for g in range(GPUS)]
    return dra_shapes.static_slices(node, gpus)


def gpu_devices(node: str, node_index: int, gpu: int) -> list[Device]:
    """The DRA devices of one GPU: what its fault must hold out, every one of them."""
    names = mig_slices(node, node_index).devices[gpu_uuid(node_index, gpu)]
    return [(node, d) for d in sorted(names)]


def publish_mig(custom: client.CustomObjectsApi, sims: Sequence[SimNode], pool: ThreadPoolExecutor) -> int:
    """The DeviceClass and each node's slices, written as the driver's kubelet plugin would; failures."""
    custom.create_cluster_custom_object(DRA_GROUP, DRA_VERSION, "deviceclasses", dra.device_class())

    def one(sim: SimNode) -> None:
        for body in mig_slices(sim.name, sim.index).slices:
            custom.create_cluster_custom_object(DRA_GROUP, DRA_VERSION, "resourceslices", body)

    return publish_all(pool, one, list(sims))


def rule_problems(rules: Iterable[Mapping[str, Any]], expected: Mapping[str, set[str]]) -> list[str]:
    """What is wrong with gpuhealth's DeviceTaintRules while the GPUs of ``expected`` (node -> the
    device names of its faulted GPU) are held out: an empty selector, one not naming driver, pool and
    device, a device of another GPU or node, and a device of a faulted GPU without a rule."""
    problems: list[str] = []
    ruled: dict[str, set[str]] = {}
    for r in rules:
        name = (r.get("metadata") or {}).get("name", "?")
        sel = (r.get("spec") or {}).get("deviceSelector") or {}
        missing = [k for k in ("driver", "pool", "device") if not sel.get(k)]
        if missing:
            problems.append(f"{name}: selector without {', '.join(missing)}")
            continue
        pool, device = str(sel["pool"]), str(sel["device"])
        if sel["driver"] != dra.DRIVER or device not in expected.get(pool, set()):
            problems.append(f"{name}: selects {sel['driver']}/{pool}/{device}, not a device of a faulted GPU")
        ruled.setdefault(pool, set()).add(device)
    for node, devices in sorted(expected.items()):
        if devices - ruled.get(node, set()):
            problems.append(f"{node}: {len(devices - ruled.get(node, set()))} of its GPU's devices have no rule")
    return problems


def ours(custom: client.CustomObjectsApi) -> list[dict[str, Any]]:
    items = custom.list_cluster_custom_object(DRA_GROUP, DRA_VERSION, DEVICE_TAINT_RULES)["items"]
    return [r for r in items if (r["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "gpuhealth"]


def peak_rss_mb(sampler: ProcSampler, start: float, end: float) -> float | None:
    inside = [r for t, r in sampler.samples if start <= t <= end]
    return round(max(inside) / 2**20, 1) if inside else None


def measure_mig(
    args: argparse.Namespace,
    sims: Mapping[str, SimNode],
    fleet: int,
    nodes: Sequence[str],
    custom: client.CustomObjectsApi,
    rule_watch: RuleWatch,
    node_watch: NodeWatch,
    operator: ProcSampler,
    pool: ThreadPoolExecutor,
    series: dict[str, Any],
    phase: Callable[[str], None],
    cpu_pids: Mapping[str, int] | None = None,
    floor: GpuFloor | None = None,
) -> dict[str, Any]:
    """MIG GPU faults one at a time, then a storm, the rules checked, then every GPU reset: the ``mig`` block.

    ``fleet``: how many nodes are in MIG mode (--mig-nodes); ``nodes``: those to fault, single faults
    first, then the storm's; ``floor``: the path's no-logic floor, whose samples are taken among the
    single faults."""
    t_phase = time.time()
    single, storm_nodes = nodes[: args.mig_faults], nodes[args.mig_faults : args.mig_faults + args.mig_storm]
    devices = {n: gpu_devices(n, sims[n].index, MIG_GPU) for n in [*single, *storm_nodes]}
    among = f", floor: {floor.samples} samples among them" if floor is not None else ""
    what = f"uncorrected ECC on GPU {MIG_GPU} ({len(STARTS)} MIG devices) of {len(single)} nodes"
    phase(f"MIG faults: {what}, singly{among}")
    lat: list[float] = []
    first: list[float] = []
    timeouts = 0
    for i, name in enumerate(single):
        t0 = time.time()
        sims[name].device_fault(MIG_GPU)
        if rule_watch.wait_all(devices[name], timeout=FAULT_TIMEOUT_S):
            seen = last_rule(rule_watch.seen_at, devices[name])
            assert seen is not None
            first.append((seen[0] - t0) * 1000)
            lat.append((seen[1] - t0) * 1000)
        else:
            timeouts += 1
        time.sleep(0.2)
        if floor is not None:
            floor.spread(i, len(single))
        if (i + 1) % 50 == 0:
            log(f"  {i + 1}/{len(single)}: p50 so far {percentile(lat, 50):.0f} ms")
    latency = latency_summary(lat, timeouts, FAULT_TIMEOUT_S * 1000)
    latency["first_rule_p50"] = round(percentile(first, 50), 1)
    latency["nodes_tainted"] = sum(1 for n in single if (n, TAINT) in node_watch.seen_at)
    series["mig_ms"] = lat
    log(f"  MIG fault to the GPU's last rule p50 {latency['p50']} ms p99 {latency['p99']} ms ({timeouts} timed out)")

    phase(f"MIG storm: GPU {MIG_GPU} of {len(storm_nodes)} nodes at once ({len(storm_nodes) * len(STARTS)} rules)")
    published_at: dict[str, float] = {}

    def fault(sim: SimNode) -> None:
        sim.device_fault(MIG_GPU)
        published_at[sim.name] = time.time()

    # CPU seconds per process over the storm (hack/bench/cpu.py): on a shared machine, is the rate the
    # operator's, or what the API server and the simulated fleet leave it?
    cpu = CpuWindow(cpu_pids).start() if cpu_pids else None
    t0 = time.time()
    failed = publish_all(pool, fault, [sims[n] for n in storm_nodes])
    published = time.time() - t0
    wanted = [d for n in storm_nodes for d in devices[n]]
    done = rule_watch.wait_all(wanted, timeout=STORM_TIMEOUT_S)
    cpu_used = cpu.stop() if cpu else None
    node_writes = node_watch.writers_between(t0, time.time())
    rules_seen = sorted(rule_watch.seen_at[d] - t0 for d in wanted if d in rule_watch.seen_at)
    per_gpu = [
        (seen[1] - published_at[n]) * 1000
        for n in storm_nodes
        if n in published_at and (seen := last_rule(rule_watch.seen_at, devices[n])) is not None
    ]
    seconds = rules_seen[-1] if rules_seen and done else None
    storm = {
        "gpus": len(storm_nodes),
        "rules_expected": len(wanted),
        "rules": len(rules_seen),
        "gpus_complete": len(per_gpu),
        "seconds": round(seconds, 2) if seconds else None,
        "gpus_per_s": round(len(storm_nodes) / seconds, 1) if seconds else None,
        "rules_per_s": round(len(wanted) / seconds, 1) if seconds else None,
        "publish_s": round(published, 2),
        "first_rule_s": round(rules_seen[0], 3) if rules_seen else None,
        "publish_failures": failed,
        "report_to_last_rule_ms_p50": round(percentile(per_gpu, 50), 1),
        "report_to_last_rule_ms_max": round(max(per_gpu, default=float("nan")), 1),
        "nodes_tainted": sum(1 for n in storm_nodes if (n, TAINT) in node_watch.seen_at),
        "cpu": cpu_used,
        "node_writes": node_writes,
    }
    series["mig_storm"] = [(0.0, 0), *[(s, i + 1) for i, s in enumerate(rules_seen)]]
    log(f"  {len(rules_seen)}/{len(wanted)} rules in {seconds}s (reports published in {published:.2f}s)")

    rules = ours(custom)
    problems = rule_problems(rules, {n: {d for _, d in devices[n]} for n in [*single, *storm_nodes]})
    check = {"rules": len(rules), "problems": len(problems), "examples": problems[:5]}
    log(f"  {len(rules)} gpuhealth DeviceTaintRules, {len(problems)} problems {problems[:3]}")

    faulted = [*single, *storm_nodes]
    phase(f"MIG recovery: {len(faulted)} GPUs reset (clean samples), probation 2s")
    t0 = time.time()
    publish_all(pool, SimNode.device_clear, [sims[n] for n in faulted])
    gone = rule_watch.wait_all([d for n in faulted for d in devices[n]], timeout=STORM_TIMEOUT_S, present=False)
    recovery = {
        "gpus": len(faulted),
        "seconds_to_all_rules_deleted": round(time.time() - t0, 1) if gone else None,
        "rules_left": rule_watch.count(),
    }
    log(f"  {len(faulted)} MIG GPUs back in service in {recovery['seconds_to_all_rules_deleted']}s")
    return {
        "shape": {
            "gpus_per_node": GPUS,
            "profile": PROFILE,
            "mig_devices_per_gpu": len(STARTS),
            "devices_per_node": GPUS * len(STARTS),
            "nodes": fleet,
            "devices": fleet * GPUS * len(STARTS),
        },
        "fault_to_last_rule_ms": latency,
        "storm": storm,
        "rule_check": check,
        "recovery": recovery,
        # The whole run's peak so far (its start-up listed the 56-device slices) and the phase's own.
        "operator_peak_rss_mb": round(operator.peak_rss / 2**20, 1),
        "operator_peak_rss_mb_in_phase": peak_rss_mb(operator, t_phase, time.time()),
    }
