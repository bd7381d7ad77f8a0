"""Scopes above the node on the real control plane: an NVLink domain out and back as one, a rack's power
brake as one finding, and a single node's power brake keeping new work off that node only."""

from __future__ import annotations

import datetime as dt
from functools import partial
from typing import Any

from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, healthy_spec, holds, wait_for
from devkit.k8s import ensure_namespace as namespace
from devkit.ranks import REQUESTED, acknowledge_all, live_pods, requested, running
from devkit.workloads import indexed_training_job
from tests.integration.conftest import policy_spec

CLIQUE_LABEL = "nvidia.com/gpu.clique"
RACK_LABEL = "topology.kubernetes.io/rack"


def _nodes(cluster: LocalCluster, group: str, count: int, **labels: str) -> list[str]:
    names = cluster.add_gpu_nodes(count, prefix=f"{group}-", labels={"gpuhealth-test": group, **labels})
    cluster.wait_nodes_ready(count, selector=f"gpuhealth-test={group}")
    return names


def _with(spec: dict[str, Any], gpu: int, **fields: Any) -> dict[str, Any]:
    spec["devices"][gpu].update(fields)
    return spec


def _status(kube: Kube, node: str) -> dict[str, Any]:
    return kube.report(node).get("status") or {}


def _in_state(kube: Kube, node: str, state: str) -> bool:
    return kube.state(node) == state


def _events(kube: Kube, nodes: list[str], reason: str) -> list[Any]:
    return [e for n in nodes for e in kube.node_events(n, reason)]


def test_a_domain_fault_takes_the_whole_clique_out_as_one_and_returns_it_as_one(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    clique = f"0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0.{abs(hash(group)) % 32768}"
    nodes = _nodes(cluster, group, 4, **{CLIQUE_LABEL: clique})
    ns = namespace(kube, f"dom-{group}"[:60])
    drains = {"checkpointTimeout": "5m", "onCheckpointTimeout": "Wait"}
    safety: dict[str, Any] = {"maxUnhealthy": 3, "maxConcurrentDrains": 4, "probation": "5s"}
    kube.apply_policy(group, policy_spec(group, actions={"drain": drains}, safety=safety))
    for n in nodes:
        kube.put_report(n, healthy_spec())
    wait_for(lambda: all(kube.state(n) == "Healthy" for n in nodes), what="4 Healthy nodes")
    job = indexed_training_job("gang", nodes[0], gpus=8, node_selector={CLIQUE_LABEL: clique})
    kube.batch.create_namespaced_job(ns, job)
    ranks = wait_for(lambda: running(kube, ns, "gang", 4), timeout=60, what="4 ranks running")
    assert {p.spec.node_name for p in ranks} == set(nodes), "one rank per node of the domain"

    # One GPU of one node asks for its NVLink domain's recovery.
    kube.put_report(nodes[2], _with(healthy_spec(), 3, recoveryAction="RecoverImexDomain"))
    # The breaker allows 3 nodes out, the domain is 4: no node leaves, none is tainted (never a part).
    wait_for(
        lambda: all(_status(kube, n).get("heldByBreaker") for n in nodes), what="the whole domain held by the breaker"
    )
    holds(lambda: not any(kube.our_taint(n) for n in nodes), 3, what="no member of the domain tainted")
    assert all(_status(kube, n).get("reason") == "ImexDomain" for n in nodes)

    # Room for the domain: all four go out, one decision.
    kube.apply_policy(group, policy_spec(group, actions={"drain": drains}, safety={**safety, "maxUnhealthy": 4}))
    wait_for(lambda: all(kube.our_taint(n) for n in nodes), what="all 4 members tainted")
    assert all(_status(kube, n).get("state") in ("Draining", "Quarantined") for n in nodes)
    assert all(clique in (_status(kube, n).get("message") or "") for n in nodes)

    # The gang spanning them is asked to checkpoint once, whichever members' drains see it.
    asked = wait_for(lambda: requested(kube, ns, "gang"), what="checkpoint requested on all 4 ranks")
    stamps = {p.metadata.name: p.metadata.annotations[REQUESTED] for p in asked}
    # Every member's drain passes over the gang meanwhile: none asks again, none evicts before the acks.
    holds(
        lambda: (
            {p.metadata.name: (p.metadata.annotations or {}).get(REQUESTED) for p in live_pods(kube, ns, "gang")}
            == stamps
        ),
        3,
        what="the gang asked once, no rank evicted",
    )
    acknowledge_all(kube, ns, asked)
    wait_for(
        lambda: all((_status(kube, n).get("drain") or {}).get("phase") == "Completed" for n in nodes),
        timeout=90,
        what="every member's drain completed",
    )
    wait_for(lambda: len(_events(kube, nodes, "CheckpointRequested")) >= 4, what="4 CheckpointRequested events")
    holds(
        lambda: len(_events(kube, nodes, "CheckpointRequested")) == 4, 2, what="4 CheckpointRequested events, no more"
    )
    kube.batch.delete_namespaced_job("gang", ns, propagation_policy="Background")

    # The action clears: the domain comes back together, after probation.
    kube.put_report(nodes[2], healthy_spec())
    # The status is written before the Node (the write-ahead order, docs/architecture.md): a read between
    # the two sees Healthy with the taint still on, so the return is both.
    wait_for(
        lambda: all(kube.state(n) == "Healthy" and not kube.our_taint(n) for n in nodes),
        timeout=90,
        what="all 4 Healthy again, untainted",
    )
    assert operator.metric("gpuhealth_domain_findings", {"policy": group, "domain": clique}) == 0


def _braked(since: str) -> dict[str, Any]:
    return _with(healthy_spec(), 1, clockEventReasons=0x80 | 0x8, clockEventsSince=since)


def test_a_power_brake_on_three_nodes_of_a_rack_is_one_rack_finding_not_three_repairs(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    rack = f"{group}-r1"[:63]
    nodes = _nodes(cluster, group, 4, **{RACK_LABEL: rack})
    # Long enough to cover writing the three reports on a loaded API server: the rack is seen whole
    # before the first node's own brake has held for sustainedFor.
    kube.apply_policy(group, policy_spec(group, rules={"powerBrake": {"sustainedFor": "15s"}}))
    for n in nodes:
        kube.put_report(n, healthy_spec())
    wait_for(lambda: all(kube.state(n) == "Healthy" for n in nodes), what="4 Healthy nodes")
    # The rack's power shelf brakes three of its nodes at one moment.
    since = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for n in nodes[:3]:
        kube.put_report(n, _braked(since))
    braked = nodes[:3]
    wait_for(
        lambda: all(_status(kube, n).get("reason") == "RackPowerBrake" for n in braked),
        timeout=60,
        what="the rack's finding on each braked node",
    )
    assert all(_status(kube, n).get("state") == "Degraded" for n in braked)
    wait_for(lambda: len(_events(kube, braked, "Degraded")) >= 3, what="one Degraded event per node")
    for e in _events(kube, braked, "Degraded"):
        assert rack in e.message and "facility" in e.message
    # No node repairs: no taint, no cordon, not one node quarantined for its own brake.
    holds(lambda: not any(kube.our_taint(n) or kube.node(n)["spec"].get("unschedulable") for n in nodes), 3)
    assert not _events(kube, nodes, "Quarantined")
    assert kube.state(nodes[3]) == "Healthy"
    labels = {"policy": group, "rack": rack, "reason": "RackPowerBrake"}
    wait_for(lambda: operator.metric("gpuhealth_rack_findings", labels) == 3, what="gpuhealth_rack_findings 3")

    # The brake lifts node by node (issue #53): the rack falls below minNodes, and the last braked node,
    # whose own brake has held past sustainedFor, stays under the rack's finding until its brake lifts.
    for n in braked[1:]:
        kube.put_report(n, healthy_spec())
        wait_for(partial(_in_state, kube, n, "Healthy"), timeout=60, what=f"{n} Healthy once its brake lifted")
    last = braked[0]
    own_held = dt.datetime.fromisoformat(since) + dt.timedelta(seconds=15 + 3)
    window = max(3.0, (own_held - dt.datetime.now(dt.UTC)).total_seconds())

    def rack_only() -> bool:
        st = _status(kube, last)
        return (st.get("reason"), st.get("state")) == ("RackPowerBrake", "Degraded") and not (
            kube.our_taint(last) or kube.node(last)["spec"].get("unschedulable")
        )

    holds(rack_only, window, what=f"{last}: the rack's finding alone, past its own brake's sustainedFor")
    assert "1 node" in (_status(kube, last).get("message") or "")
    kube.put_report(last, healthy_spec())
    wait_for(lambda: all(kube.state(n) == "Healthy" for n in nodes), timeout=60, what="the rack Healthy")
    assert not _events(kube, nodes, "Quarantined") and not any(kube.our_taint(n) for n in nodes)
    wait_for(lambda: operator.metric("gpuhealth_rack_findings", labels) == 0, what="gpuhealth_rack_findings 0")


def test_a_single_nodes_power_brake_keeps_new_work_off_it_and_running_work_on(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    rack = f"{group}-r2"[:63]
    nodes = _nodes(cluster, group, 2, **{RACK_LABEL: rack})
    ns = namespace(kube, f"brake-{group}"[:60])
    kube.apply_policy(group, policy_spec(group, rules={"powerBrake": {"sustainedFor": "2s"}}))
    for n in nodes:
        kube.put_report(n, healthy_spec())
    job = indexed_training_job("run", nodes[0], ranks=2, gpus=2, node_selector={"gpuhealth-test": group})
    kube.batch.create_namespaced_job(ns, job)
    pods = wait_for(lambda: running(kube, ns, "run", 2), timeout=60, what="2 ranks running")
    on_bad = [p.metadata.name for p in pods if p.spec.node_name == nodes[0]]
    assert on_bad, "a rank runs on the node to be braked"

    kube.put_report(nodes[0], _braked(dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")))
    wait_for(lambda: kube.our_taint(nodes[0]), timeout=60, what="the braked node tainted")
    taint = kube.our_taint(nodes[0])
    assert taint is not None and taint["effect"] == "NoSchedule" and taint["value"] == "PowerBrake"
    assert kube.node(nodes[0])["spec"].get("unschedulable") is True
    assert _status(kube, nodes[0]).get("state") == "Quarantined"
    # Running work is untouched: not asked to checkpoint, not evicted; the other node serves on.
    holds(
        lambda: all(
            (p := kube.core.read_namespaced_pod(name, ns)).metadata.deletion_timestamp is None
            and REQUESTED not in (p.metadata.annotations or {})
            for name in on_bad
        ),
        3,
        what="the rank on the braked node untouched",
    )
    assert kube.our_taint(nodes[1]) is None and kube.state(nodes[1]) == "Healthy"


def test_a_power_brake_that_moves_work_at_the_next_checkpoint_asks_waits_and_never_forces(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    nodes = _nodes(cluster, group, 2)
    ns = namespace(kube, f"patient-{group}"[:60])
    rules = {"powerBrake": {"sustainedFor": "2s", "moveRunningWork": "AtNextCheckpoint"}}
    drains = {"checkpointTimeout": "2s", "onCheckpointTimeout": "Evict", "maxWait": "2s"}
    kube.apply_policy(group, policy_spec(group, rules=rules, actions={"drain": drains}))
    for n in nodes:
        kube.put_report(n, healthy_spec())
    job = indexed_training_job("ckpt", nodes[0], ranks=2, gpus=2, node_selector={"gpuhealth-test": group})
    kube.batch.create_namespaced_job(ns, job)
    pods = wait_for(lambda: running(kube, ns, "ckpt", 2), timeout=60, what="2 ranks running")
    assert {p.spec.node_name for p in pods} == {nodes[0]}

    kube.put_report(nodes[0], _braked(dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")))
    wait_for(lambda: kube.state(nodes[0]) == "Draining", timeout=60, what="the braked node draining")
    asked = wait_for(lambda: requested(kube, ns, "ckpt", 2), what="both ranks asked to checkpoint")
    # Past the policy's checkpoint timeout and maxWait: still asked, still running, never evicted.
    holds(lambda: len(live_pods(kube, ns, "ckpt")) == 2, 6, what="no rank evicted without its acknowledgement")
    acknowledge_all(kube, ns, asked)
    wait_for(
        lambda: (_status(kube, nodes[0]).get("drain") or {}).get("phase") == "Completed",
        timeout=60,
        what="the drain completed once both ranks acknowledged",
    )
    wait_for(lambda: len(_events(kube, [nodes[0]], "Evicted")) == 2, what="2 Evicted events, after the acks")


def _fabric(cluster_uuid: str, clique_id: int, **subfields: Any) -> dict[str, Any]:
    """A GPU's fabric facts as the agent reports them: the mask decoded per sub-field (api/fabric.py)."""
    return {
        "state": "Completed",
        "status": 0,
        "clusterUuid": cluster_uuid,
        "cliqueId": clique_id,
        "healthSummary": "Unhealthy" if any(subfields.values()) else "Healthy",
        **subfields,
    }


def test_unhealthy_fabric_routes_take_the_whole_clique_out_and_a_mask_of_false_sub_fields_nothing(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    cluster_uuid, clique_id = "5a4b3c2d-1e0f-4a1b-9c8d-7e6f5a4b3c2d", abs(hash(group)) % 32768
    clique = f"{cluster_uuid}.{clique_id}"
    nodes = _nodes(cluster, group, 4, **{CLIQUE_LABEL: clique})
    kube.apply_policy(group, policy_spec(group, safety={"maxUnhealthy": 4, "probation": "5s"}))
    for n in nodes:
        kube.put_report(n, healthy_spec())
    wait_for(lambda: all(kube.state(n) == "Healthy" for n in nodes), what="4 Healthy nodes")

    # A non-zero mask whose sub-fields are all "false" (2 per 2-bit field: 0xAA) is healthy: nothing happens.
    false_mask = _fabric(cluster_uuid, clique_id, degradedBandwidth=False, routeRecovery=False, routeUnhealthy=False)
    kube.put_report(nodes[1], _with(healthy_spec(), 0, fabric={**false_mask, "healthMask": 0xAA}))
    holds(
        lambda: all(kube.state(n) == "Healthy" and not kube.our_taint(n) for n in nodes),
        3,
        what="a mask of false sub-fields takes nothing out",
    )

    # ROUTE_UNHEALTHY = 1 on one GPU of one member: the whole domain leaves as one decision.
    sick = _fabric(cluster_uuid, clique_id, routeUnhealthy=True)
    kube.put_report(nodes[2], _with(healthy_spec(), 5, fabric={**sick, "healthMask": 0x1 << 4}))
    wait_for(lambda: all(kube.our_taint(n) for n in nodes), what="all 4 members tainted")
    assert all(_status(kube, n).get("reason") == "ImexDomain" for n in nodes)
    assert all("fabric routes unhealthy" in (_status(kube, n).get("message") or "") for n in nodes)

    # The routes heal: the domain returns together.
    kube.put_report(nodes[2], healthy_spec())
    # The status is written before the Node (the write-ahead order, docs/architecture.md): a read between
    # the two sees Healthy with the taint still on, so the return is both.
    wait_for(
        lambda: all(kube.state(n) == "Healthy" and not kube.our_taint(n) for n in nodes),
        timeout=90,
        what="all 4 Healthy again, untainted",
    )
