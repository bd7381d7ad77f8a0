"""The fabric story (issue #35): four nodes of one NVLink domain (an NVL rack's IMEX domain, the
``nvidia.com/gpu.clique`` label GPU Feature Discovery sets, ``<clusterUuid>.<cliqueId>``), each with
a real agent whose fake NVML reports the same fabric (probe completed, that cluster UUID and clique
ID, a health mask of "false" sub-fields), and a 4-rank gang spanning them, one rank per node.

- The fabric health mask of one GPU of one node turns ``ROUTE_UNHEALTHY`` = 1: the operator takes
  every node of the clique out as one decision (``evaluation/domains.py``), the gang is asked to
  checkpoint once (one request per rank, whichever member's drain sees it), drained; the mask clears
  and the domain returns together after probation.
- Then a hardware power brake (clock reason 0x80) on 3 of the 4 nodes, which are also one rack: one
  rack finding (``RackPowerBrake``, pointing at the facility) on each braked node, no node repair,
  no taint; it lifts node by node, the rack below ``minNodes`` while the last ones are still braked,
  and none of them is held on its own meanwhile (the rack's episode lasts until no node is braked);
  the nodes are Healthy again.

The nodes are governed by a policy of their own (``FABRIC_POLICY``): a rack-scale fleet whose breaker
admits a whole domain, so the other stories' budget is untouched.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from functools import partial
from typing import Any

from devkit.agents import Agent
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, ensure_namespace, wait_for
from devkit.workloads import indexed_training_job
from hack.demo.common import NS, Timeline, act_as_trainer, running

CLIQUE_LABEL = "nvidia.com/gpu.clique"
RACK_LABEL = "topology.kubernetes.io/rack"
CLUSTER_UUID = "5a4b3c2d-1e0f-4a1b-9c8d-7e6f5a4b3c2d"
CLIQUE_ID = 7
DOMAIN = f"{CLUSTER_UUID}.{CLIQUE_ID}"
RACK = "nvl-rack-1"
NODES = 4
PREFIX = "nvl-node-"
APP = "nvl-gang"
SICK_NODE = 2  # which member's GPU reports the unhealthy routes
SICK_GPU = 5
BRAKED = 3  # nodes of the rack under the power brake (the policy's rack.minNodes default)
BRAKED_GPU = 1

# The health mask (api/fabric.py, NVML_GPU_FABRIC_HEALTH_MASK_*): each 2-bit boolean sub-field 2
# ("false"), INCORRECT_CONFIGURATION 1 (none). ROUTE_UNHEALTHY is bits 4-5: 1 there is the fault.
HEALTHY_MASK = 0xAA | (1 << 8)
ROUTE_UNHEALTHY_MASK = (HEALTHY_MASK & ~(0x3 << 4)) | (1 << 4)
SUMMARY_HEALTHY, SUMMARY_UNHEALTHY = 1, 2  # NVML_GPU_FABRIC_HEALTH_SUMMARY_*
IDLE, POWER_BRAKE = 0x1, 0x80 | 0x8  # clock event reasons: idle; HW power brake (with HW slowdown)

FABRIC_POLICY: dict[str, Any] = {
    "nodeSelector": {
        "matchLabels": {"nvidia.com/gpu.present": "true"},
        "matchExpressions": [{"key": CLIQUE_LABEL, "operator": "Exists"}],
    },
    "mode": "Enforce",
    # The brake must hold 5s on a node before its own finding counts: long enough for the three agents
    # (one poll a second) to report theirs, so the rack is seen whole first.
    "rules": {"agentSilence": {"after": "30s"}, "powerBrake": {"sustainedFor": "5s"}},
    # Room for the whole domain (never a part of it) and its four drains at once; probation short so
    # that the domain is back within the demo.
    "safety": {"maxUnhealthy": NODES, "maxConcurrentDrains": NODES, "probation": "5s"},
}


def fault_lines(sick: bool) -> list[str]:
    """The fake NVML lines of the sick GPU: its routes unhealthy, or healthy again."""
    mask, summary = (ROUTE_UNHEALTHY_MASK, SUMMARY_UNHEALTHY) if sick else (HEALTHY_MASK, SUMMARY_HEALTHY)
    return [f"gpu {SICK_GPU} fabric_mask {mask:#x}", f"gpu {SICK_GPU} fabric_summary {summary}"]


def scenario() -> list[str]:
    """Every GPU of a member: the fabric probe completed (state 3, status 0) in the domain's cluster
    and clique, healthy."""
    return [
        "gpu * fabric_state 3",
        "gpu * fabric_status 0",
        f"gpu * fabric_cluster {CLUSTER_UUID}",
        f"gpu * fabric_clique {CLIQUE_ID}",
        f"gpu * fabric_mask {HEALTHY_MASK:#x}",
        f"gpu * fabric_summary {SUMMARY_HEALTHY}",
    ]


def add_nodes(cluster: LocalCluster) -> list[str]:
    """The domain's nodes, labelled as GPU Feature Discovery and the rack's topology would."""
    names = cluster.add_gpu_nodes(NODES, prefix=PREFIX, labels={CLIQUE_LABEL: DOMAIN, RACK_LABEL: RACK})
    cluster.wait_nodes_ready(NODES, selector=CLIQUE_LABEL)
    return names


def configure_agent(agent: Agent) -> None:
    agent.lines += scenario()
    agent.write()


def _status(kube: Kube, node: str) -> dict[str, Any]:
    return kube.report(node).get("status") or {}


def setup(kube: Kube, agents: dict[str, Agent], timeline: Timeline) -> None:
    """Every member's agent reporting the domain's fabric, and the gang running, one rank per member."""
    members = sorted(agents)

    def fabric_reported(node: str) -> bool:
        devs = (kube.report(node).get("spec") or {}).get("devices") or []
        return len(devs) == 8 and all((d.get("fabric") or {}).get("cliqueId") == CLIQUE_ID for d in devs)

    wait_for(lambda: all(fabric_reported(n) for n in members), timeout=60, what="the domain's fabric reported")
    ensure_namespace(kube, NS)
    job = indexed_training_job(
        APP, members[0], gpus=8, image="llm-trainer:1.4", namespace=NS, node_selector={CLIQUE_LABEL: DOMAIN}
    )
    kube.batch.create_namespaced_job(NS, job)
    ranks = wait_for(lambda: (r := running(kube, APP)) and len(r) == NODES and r, timeout=90, what="gang running")
    on = sorted(p.spec.node_name for p in ranks)
    assert on == members, f"the gang's ranks run on {on}, not one on each member {members}"
    timeline.add(
        f"NVLink domain {CLIQUE_LABEL}={DOMAIN}: {', '.join(members)} (rack {RACK}), fabric probe completed, "
        f"healthy; gang {APP}: {NODES} ranks (8 GPUs each), one per member, checkpoint mode: annotation"
    )


def inject(agent: Agent, timeline: Timeline) -> float:
    at = time.time()
    agent.lines += fault_lines(sick=True)
    agent.write()
    timeline.add(
        f"{agent.node}: fault injected: fabric health mask {ROUTE_UNHEALTHY_MASK:#x} on GPU {SICK_GPU} "
        "(ROUTE_UNHEALTHY = 1: the NVLink domain's routes)",
        at,
    )
    return at


def verify(kube: Kube, agents: dict[str, Agent], injected: float, timeline: Timeline) -> dict[str, Any]:
    """The domain out as one, the gang checkpointed once, the domain back as one; then the rack's brake.
    Returns the summary's ``fabric`` and ``rack`` keys."""
    members = sorted(agents)
    sick = agents[members[SICK_NODE]]
    acked: set[str] = set()
    stop = threading.Event()
    threading.Thread(target=act_as_trainer, args=(kube, timeline, stop, acked, (APP,)), daemon=True).start()
    try:
        wait_for(lambda: all(n in timeline.taint_seen for n in members), timeout=60, what="every member tainted")
        last = max(timeline.taint_seen[n] for n in members)
        reasons = sorted({str(_status(kube, n).get("reason")) for n in members})
        timeline.add(
            f"NVLink domain {DOMAIN}: all {NODES} members out as one decision ({', '.join(reasons)}), "
            f"{last - injected:.2f}s after the fault",
            last,
        )
        wait_for(
            lambda: all((_status(kube, n).get("drain") or {}).get("phase") == "Completed" for n in members),
            timeout=90,
            what="every member's drain completed",
        )
        requests = sum(len(kube.node_events(n, "CheckpointRequested")) for n in members)
        timeline.add(f"NVLink domain {DOMAIN}: drained; {requests} checkpoint requests for the gang's {NODES} ranks")
    finally:
        stop.set()
    cleared = time.time()
    sick.lines = [ln for ln in sick.lines if ln not in fault_lines(sick=True)] + fault_lines(sick=False)
    sick.write()
    timeline.add(f"{sick.node}: GPU {SICK_GPU}'s fabric routes healthy again", cleared)
    back: dict[str, float] = {}

    def all_back() -> bool:
        for n in members:
            if n not in back and kube.state(n) == "Healthy" and kube.our_taint(n) is None:
                back[n] = time.time()
        return len(back) == NODES

    wait_for(all_back, timeout=90, what="the domain back in service")
    timeline.add(
        f"NVLink domain {DOMAIN}: every member back in service, "
        f"{max(back.values()) - cleared:.1f}s after the routes healed (probation 5s)",
        max(back.values()),
    )
    fabric = fabric_summary(
        members, reasons, last - injected, requests, len(acked), max(back.values()) - cleared, back.values()
    )
    return {"fabric": fabric, "rack": rack_story(kube, [agents[n] for n in members[:BRAKED]], members, timeline)}


def rack_story(kube: Kube, braked: list[Agent], members: list[str], timeline: Timeline) -> dict[str, Any]:
    """A power brake on ``braked`` nodes of the rack at once: one rack finding, not N node repairs."""
    at = time.time()
    for a in braked:
        a.lines.append(f"gpu {BRAKED_GPU} clock_reasons {POWER_BRAKE:#x}")
        a.write()
    names = [a.node for a in braked]
    timeline.add(f"rack {RACK}: fault injected: HW power brake (clock reason 0x80) on {', '.join(names)}", at)
    wait_for(
        lambda: all(_status(kube, n).get("reason") == "RackPowerBrake" for n in names),
        timeout=60,
        what="the rack's finding on each braked node",
    )
    seen = time.time()
    states = {n: str(_status(kube, n).get("state")) for n in names}
    tainted = sorted(n for n in members if kube.our_taint(n) is not None)
    timeline.add(
        f"rack {RACK}: one rack finding (RackPowerBrake: the facility, not the nodes) on {len(names)} nodes; "
        f"states {sorted(set(states.values()))}; nodes tainted: {len(tainted)}",
        seen,
    )
    # The brake lifts node by node, the first node last (as in issue #53's run): the rack falls below
    # minNodes while the others are still braked, and none of them may be held on its own meanwhile.
    held: set[str] = set()

    def back(node: str, rest: list[str]) -> bool:
        for n in rest:
            if kube.our_taint(n) is not None or _status(kube, n).get("reason") == "PowerBrake":
                held.add(n)
        return kube.state(node) == "Healthy"

    for k, a in enumerate(reversed(braked)):
        a.lines = [ln for ln in a.lines if ln != f"gpu {BRAKED_GPU} clock_reasons {POWER_BRAKE:#x}"]
        a.lines.append(f"gpu {BRAKED_GPU} clock_reasons {IDLE:#x}")
        a.write()
        rest = [b.node for b in reversed(braked)][k + 1 :]
        wait_for(partial(back, a.node, rest), timeout=60, what=f"{a.node} Healthy once its brake lifted")
    timeline.add(
        f"rack {RACK}: the brake lifted node by node; the nodes Healthy, "
        f"held on their own meanwhile: {sorted(held) or 'none'}"
    )
    return rack_summary(names, seen - at, states.values(), tainted, sorted(held))


def fabric_summary(
    members: list[str],
    reasons: list[str],
    decision_s: float,
    requests: int,
    acks: int,
    returned_s: float,
    back_at: Iterable[float],
) -> dict[str, Any]:
    """The summary's ``fabric`` key (documented in docs/development.md)."""
    back = list(back_at)
    return {
        "domain": DOMAIN,
        "nodes": members,
        "reasons": reasons,
        "decision_s": round(decision_s, 2),
        "checkpoints_requested": requests,
        "checkpoints_acknowledged": acks,
        "checkpointed_once": requests == NODES and acks == NODES,
        "returned_s": round(returned_s, 1),
        "returned_spread_s": round(max(back) - min(back), 1) if back else None,
    }


def rack_summary(
    braked: list[str], finding_s: float, states: Iterable[str], tainted: list[str], held_alone: Iterable[str] = ()
) -> dict[str, Any]:
    """The summary's ``rack`` key (documented in docs/development.md)."""
    return {
        "rack": RACK,
        "braked_nodes": braked,
        "finding": "RackPowerBrake",
        "finding_nodes": len(braked),
        "finding_s": round(finding_s, 2),
        "states": sorted(set(states)),
        "tainted_nodes": tainted,
        "held_alone": sorted(held_alone),
    }


def misses(summary: dict[str, Any]) -> list[str]:
    """What the fabric and rack stories must have shown; each miss in words."""
    out = []
    f, r = summary.get("fabric") or {}, summary.get("rack") or {}
    if f.get("reasons") != ["ImexDomain"]:
        out.append(f"the domain's members left for {f.get('reasons')}, expected ImexDomain on every one")
    if len(f.get("nodes") or []) != NODES:
        out.append(f"NVLink domain members {f.get('nodes')}, expected {NODES}")
    if not f.get("checkpointed_once"):
        out.append(
            f"the gang: {f.get('checkpoints_requested')} checkpoint requests, {f.get('checkpoints_acknowledged')} "
            f"acknowledged, expected one per rank ({NODES})"
        )
    if r.get("finding_nodes") != BRAKED or r.get("states") != ["Degraded"]:
        out.append(f"the rack's power brake: {r}, expected one RackPowerBrake finding on {BRAKED} Degraded nodes")
    if r.get("tainted_nodes"):
        out.append(f"the rack's power brake tainted {r['tainted_nodes']}: a facility finding repairs no node")
    if r.get("held_alone"):
        out.append(f"as the rack's brake lifted, {r['held_alone']} held on their own: the episode is the rack's")
    return out
