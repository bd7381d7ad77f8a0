"""The domain storm of `make bench` (``--phases domain``, issue #35): the fleet in NVLink domains of 18
nodes (an NVL72 rack's IMEX domain: GPU Feature Discovery's ``nvidia.com/gpu.clique`` label,
``<clusterUuid>.<cliqueId>``), and a clique fault on one GPU of one member, which takes every member
out as one decision (``evaluation/domains.py``).

The nodes no earlier phase faulted are labelled into domains, as GFD labels a rack's nodes (Node
patches, before anything is measured). Each faulted domain's bench pods are removed first: they are
bound to their node by name (``hack/bench/cluster.py``), so a drain would see them come back; the
figure is the taint, and the drain storm is its own phase.

Measured, one domain at a time, each fault from a quiet operator (as the floor's samples start; the
waits are recorded): from the member's report write (its simulated agent publishing a
fabric health mask with ``ROUTE_UNHEALTHY`` = 1 on one GPU, through the agent's own publisher) to the
LAST member's taint seen by the independent Node watch, and to the first; then every domain's fault
heals and the seconds to every member untainted. A domain is whole when every member was tainted
(by the time its members settled, a timed-out one too) and no node outside the faulted domains was.
The pure parts (domains, the snapshot, the times) are unit-tested (tests/unit/bench/test_domain.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client

from gpuhealth.agent.model import Snapshot
from gpuhealth.api.report_fabric import Fabric
from hack.bench.context import POLICY
from hack.bench.fleet import MigLayout, SimNode, healthy_snapshot
from hack.bench.floors import SampledFloor
from hack.bench.support import (
    FAULT_TIMEOUT_S,
    GROUP,
    TAINT,
    VERSION,
    PhaseClock,
    ProcSampler,
    latency_summary,
    log,
    percentile,
    publish_all,
    wait_quiet,
)
from hack.bench.watch import NodeWatch, ReportWatch

CLIQUE_LABEL = "nvidia.com/gpu.clique"
CLUSTER_UUID = "0b5e7c1a-35f4-4e0c-9a8e-6d2f1c3b4a59"
DOMAIN_SIZE = 18  # an NVL72 rack: 18 compute trays of 4 GPUs; the bench's nodes have 8, the count is the rack's
SICK_GPU = 5
# The health mask (api/fabric.py): every 2-bit boolean sub-field 2 ("false"), INCORRECT_CONFIGURATION 1
# (none); ROUTE_UNHEALTHY (bits 4-5) = 1 is the domain's fault.
HEALTHY_MASK = 0xAA | (1 << 8)
ROUTE_UNHEALTHY_MASK = (HEALTHY_MASK & ~(0x3 << 4)) | (1 << 4)
STATE_COMPLETED, SUMMARY_HEALTHY, SUMMARY_UNHEALTHY = 3, 1, 2
SETTLE_TIMEOUT_S = 120.0


def domains_of(nodes: Sequence[str], size: int = DOMAIN_SIZE) -> list[list[str]]:
    """``nodes`` in order, in whole domains of ``size`` (the remainder is in none)."""
    return [list(nodes[i : i + size]) for i in range(0, len(nodes) - size + 1, size)]


def clique(domain: int) -> str:
    """The clique label's value of the ``domain``-th domain."""
    return f"{CLUSTER_UUID}.{domain}"


def fabric_snapshot(
    node_index: int, clique_id: int, sick_gpu: int | None = None, mig: MigLayout | None = None
) -> Snapshot:
    """The healthy node with its GPUs' fabric probe completed in ``clique_id``; ``sick_gpu``'s routes
    unhealthy (the domain's fault), or none. ``mig``: a MIG node's layout, kept in the sample (its
    report must not turn whole-GPU with the fault)."""
    snap = healthy_snapshot(node_index, mig=mig)

    def facts(gpu: int) -> Fabric:
        sick = gpu == sick_gpu
        return Fabric.decoded(
            state=STATE_COMPLETED,
            status=0,
            cluster_uuid=CLUSTER_UUID,
            clique_id=clique_id,
            health_mask=ROUTE_UNHEALTHY_MASK if sick else HEALTHY_MASK,
            health_summary=SUMMARY_UNHEALTHY if sick else SUMMARY_HEALTHY,
        )

    return dataclasses.replace(snap, devices=tuple(dataclasses.replace(d, fabric=facts(d.index)) for d in snap.devices))


def taint_span(seen_at: Mapping[tuple[str, str], float], nodes: Sequence[str]) -> tuple[float, float] | None:
    """(first, last) taint of ``nodes`` as the Node watch saw them; None while any member has none."""
    times = [seen_at.get((n, TAINT)) for n in nodes]
    if not times or any(t is None for t in times):
        return None
    known = [t for t in times if t is not None]
    return min(known), max(known)


def label_domains(core: client.CoreV1Api, pool: ThreadPoolExecutor, domains: Sequence[Sequence[str]]) -> int:
    """Each node's clique label (Node patches, as GFD writes them); the number that failed."""
    value = {n: clique(i) for i, members in enumerate(domains) for n in members}

    def label(node: str) -> None:
        core.patch_node(node, {"metadata": {"labels": {CLIQUE_LABEL: value[node]}}})

    return publish_all(pool, label, list(value))


def remove_pods(core: client.CoreV1Api, apps: client.AppsV1Api, nodes: Sequence[str], timeout_s: float = 300.0) -> bool:
    """Delete the bench's ReplicaSets bound to ``nodes`` and their pods at once (no grace period: at
    10,000 nodes the garbage collector and the emulated kubelets left pods behind two minutes later,
    and the drains of the faulted domains then ran beside the figure); wait for the pods to be gone."""
    for n in nodes:
        try:
            apps.delete_namespaced_replica_set(f"train-{n}", "bench", propagation_policy="Background")
        except client.ApiException as e:
            if e.status != 404:
                raise
    selectors = [f"app in ({','.join(chunk)})" for chunk in batches([f"train-{n}" for n in nodes], 50)]
    for selector in selectors:
        core.delete_collection_namespaced_pod("bench", label_selector=selector, grace_period_seconds=0)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not sum(len(core.list_namespaced_pod("bench", label_selector=s).items) for s in selectors):
            return True
        time.sleep(1.0)
    return False


def batches(items: Sequence[str], size: int) -> list[list[str]]:
    """``items`` in order, in lists of at most ``size``."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def set_drains(custom: client.CustomObjectsApi, slots: int | None) -> int | None:
    """Set the fleet policy's ``maxConcurrentDrains`` (None: unset it); the value it had."""
    spec = custom.get_cluster_custom_object(GROUP, VERSION, "gpuhealthpolicies", POLICY).get("spec") or {}
    was = (spec.get("safety") or {}).get("maxConcurrentDrains")
    body = {"spec": {"safety": {"maxConcurrentDrains": slots}}}
    custom.patch_cluster_custom_object(GROUP, VERSION, "gpuhealthpolicies", POLICY, body)
    return was if isinstance(was, int) else None


def quiet_summary(waits: Sequence[float | None]) -> dict[str, Any]:
    """The waits for a quiet operator between one domain's fault and the next: p50 and max of those
    that ended quiet, and how many never did (``wait_quiet``'s timeout; the fault went on regardless)."""
    quiet = sorted(w for w in waits if w is not None)
    return {
        "waits": len(waits),
        "p50": round(percentile(quiet, 50), 1) if quiet else None,
        "max": max(quiet) if quiet else None,
        "never": len(waits) - len(quiet),
    }


def measure_domain(
    sims: Mapping[str, SimNode],
    spare: Sequence[str],
    faults: int,
    size: int,
    core: client.CoreV1Api,
    apps: client.AppsV1Api,
    custom: client.CustomObjectsApi,
    node_watch: NodeWatch,
    report_watch: ReportWatch,
    pool: ThreadPoolExecutor,
    series: dict[str, Any],
    phase: PhaseClock,
    settle_s: float,
    operator: ProcSampler | None = None,
    floor: SampledFloor | None = None,
) -> dict[str, Any]:
    """``faults`` domains faulted one at a time: the ``domain_storm`` block. ``spare``: the nodes no
    phase has faulted, labelled into domains of ``size`` in order; the first ``faults`` domains fault,
    once the ``operator`` (its CPU sampler) is quiet after the labels. ``floor``: the storm's no-logic
    floor, whose samples are taken among the domain faults, each after a domain is out."""
    domains = domains_of(spare, size)
    faulted = domains[:faults]
    if len(faulted) < faults:
        raise RuntimeError(f"{len(spare)} spare nodes make {len(domains)} domains of {size}, not {faults}")
    members = [n for d in faulted for n in d]
    among = f", floor: {floor.samples} samples among them" if floor is not None else ""
    phase(f"domain storm: {len(domains)} NVLink domains of {size} nodes; {faults} clique faults, one at a time{among}")
    t = time.monotonic()
    # A fleet of NVLink domains drains a whole domain at once (one drain slot a member, as an NVL
    # fleet's policy would set); restored after the phase.
    drains_were = set_drains(custom, size)
    pods_gone = remove_pods(core, apps, members)
    failed = label_domains(core, pool, domains)
    took = time.monotonic() - t
    log(f"  {len(domains) * size} nodes labelled in {took:.1f}s ({failed} failed; pods gone: {pods_gone})")
    labelled_at = time.time()
    time.sleep(settle_s)  # the operator's Node watch takes in the labels (no figure waits on it otherwise)
    # Every relabelled node is a pass: the faults wait until the operator has worked them off, as a
    # fleet labelled when its racks joined would have been long before.
    quiet = wait_quiet(operator) is not None if operator is not None else False
    settled = round(time.time() - labelled_at, 1) if quiet else None
    log(f"  the operator quiet again {settled} s after the labels (at least {settle_s:g} s)")
    before = {n for (n, key) in node_watch.seen_at if key == TAINT}
    last: list[float] = []
    first: list[float] = []
    spread: list[float] = []
    timeouts = 0
    whole = 0
    between: list[float | None] = []
    for i, domain in enumerate(faulted):
        sick = domain[i % size]
        if i and operator is not None:
            # One at a time from a quiet operator, as the floor's samples are: the last domain's members'
            # conditions, drain records and Events (about ten requests a member) follow its taints for a
            # second or two, and a fault written among them shared the API server with them.
            between.append(wait_quiet(operator))
        t0 = time.time()
        sims[sick].sample(fabric_snapshot(sims[sick].index, i, SICK_GPU, sims[sick].mig))
        span = taint_span(node_watch.seen_at, domain) if node_watch.wait_all(domain, TAINT, FAULT_TIMEOUT_S) else None
        if span is not None:
            first.append((span[0] - t0) * 1000)
            last.append((span[1] - t0) * 1000)
            spread.append((span[1] - span[0]) * 1000)
        else:
            timeouts += 1
        # The members' drains (no pods left) and status writes settle before the next domain's fault;
        # a domain that timed out is still whole if every member is tainted by then.
        report_watch.wait_states(domain, "Quarantined", timeout=FAULT_TIMEOUT_S)
        whole += taint_span(node_watch.seen_at, domain) is not None
        result = f"{last[-1]:.0f} ms" if span is not None else "timed out"
        log(f"  domain {i + 1}/{faults} ({sick}): fault to the last of {size} members' taints {result}")
        if floor is not None:
            floor.spread(i, faults)
    tainted_now = {n for (n, key) in node_watch.seen_at if key == TAINT}
    outside = sorted(tainted_now - before - set(members))
    latency = latency_summary(last, timeouts, FAULT_TIMEOUT_S * 1000)
    latency["first_taint_p50"] = round(percentile(first, 50), 1)
    latency["spread_p50"] = round(percentile(spread, 50), 1)
    series["domain_ms"] = last
    p50, p99 = latency["p50"], latency["p99"]
    log(f"  clique fault to the last member's taint p50 {p50} ms p99 {p99} ms ({timeouts} timed out)")

    phase(f"domain recovery: {faults} domains' fabric routes healthy again, probation 2s")
    t0 = time.time()
    healed = {d[i % size]: i for i, d in enumerate(faulted)}
    publish_all(
        pool, lambda s: s.sample(fabric_snapshot(s.index, healed[s.name], mig=s.mig)), [sims[n] for n in healed]
    )
    back = node_watch.wait_all(members, TAINT, timeout=SETTLE_TIMEOUT_S, present=False)
    set_drains(custom, drains_were)
    return {
        "shape": {"nodes": len(domains) * size, "domains": len(domains), "domain_size": size, "faulted": faults},
        "fault_to_last_taint_ms": latency,
        "domains_whole": whole,
        "tainted_outside": len(outside),
        "tainted_outside_examples": outside[:5],
        "label_failures": failed,
        "pods_removed": pods_gone,
        # Not watched (no sampler): no figure of either wait.
        **(
            {"operator_quiet_after_labels_s": settled, "operator_quiet_between_faults_s": quiet_summary(between)}
            if operator is not None
            else {}
        ),
        "recovery_s": round(time.time() - t0, 1) if back else None,
    }
