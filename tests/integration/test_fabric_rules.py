"""The fabric's verdicts on the real control plane (evaluation/fabric_rules.py): a real agent on the fake
NVML and a fake sysfs tree; an inactive NVLink on one GPU keeps new work off that GPU and leaves the work
running on it alone (under the slow budget, with the budget for dead GPUs at zero); an InfiniBand port
going down takes the node out; a symbol-error rate below its threshold does nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit import dra, fakesysfs
from devkit.agents import AgentFleet
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, ensure_namespace, healthy_spec, holds, wait_for
from gpuhealth.api.names import CHECKPOINT_REQUESTED
from tests.integration.conftest import make_nodes, policy_spec

TAINT = "gpuhealth.dev/unhealthy"


@pytest.fixture
def fleet(cluster: LocalCluster, tmp_path: Path) -> Iterator[AgentFleet]:
    f = AgentFleet(cluster.kubeconfig, tmp_path / "agents", interval=0.5, heartbeat=2, nics=True)
    try:
        yield f
    finally:
        f.stop()


def _rules(kube: Kube, node: str) -> dict[str, dict[str, Any]]:
    items = kube.custom.list_cluster_custom_object(dra.G, dra.V, "devicetaintrules").get("items") or []
    return {r["metadata"]["name"]: r for r in items if r["spec"]["deviceSelector"].get("pool") == node}


def _status(kube: Kube, node: str) -> dict[str, Any]:
    return kube.report(node).get("status") or {}


def _device(kube: Kube, node: str, index: int) -> dict[str, Any]:
    return next((d for d in _status(kube, node).get("devices") or [] if d["index"] == index), {})


def _pod(kube: Kube, ns: str, name: str) -> Any:
    return kube.core.read_namespaced_pod(name, ns)


def test_an_inactive_nvlink_keeps_new_work_off_that_gpu_and_running_work_untouched(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str, fleet: AgentFleet
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    ns = ensure_namespace(kube, f"fr-{group}"[:60])
    dra.publish_device_classes(kube)
    dra.publish_slices(kube, [node])  # the fake NVML's UUIDs
    dra.create_claim_template(kube, ns, "one-gpu", 1)
    # No budget for dead GPUs at all: a slow GPU spends the slow one (maxSlow), never that.
    safety = {"maxUnhealthyGPUs": 0, "probation": "2s"}
    kube.apply_policy(group, policy_spec(group, safety=safety, actions={"drain": {"checkpointMode": "annotation"}}))
    fleet.start([node])
    wait_for(lambda: kube.state(node) == "Healthy", timeout=60, what="the agent reports, the node Healthy")
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "rank-0", "one-gpu", node))
    (held,) = dra.wait_allocated(kube, ns, "rank-0")
    bad = int(held.removeprefix("gpu-"))
    rule = f"gpuhealth-{node}-gpu-{bad}"

    fleet[node].set(f"gpu {bad} nvlink_inactive 0x1")
    wait_for(lambda: rule in _rules(kube, node), timeout=60, what="a DeviceTaintRule for the GPU with the down link")
    taint = _rules(kube, node)[rule]["spec"]["taint"]
    assert (taint["key"], taint["value"], taint["effect"]) == (TAINT, "NVLinkDegraded", "NoSchedule")
    gpu = _device(kube, node, bad)
    assert (gpu["state"], gpu["reason"], gpu.get("rule")) == ("Quarantined", "NVLinkDegraded", "nvlink")
    assert "1 of 18 NVLinks inactive" in gpu["message"] and not gpu.get("heldByBreaker")
    status = _status(kube, node)
    assert (status["state"], status["reason"]) == ("Degraded", "DeviceQuarantined")
    assert kube.our_taint(node) is None and not kube.node(node)["spec"].get("unschedulable")

    # The rank on that GPU runs on: never asked to checkpoint, never evicted (slow is not broken).
    def untouched() -> bool:
        p = _pod(kube, ns, "rank-0")
        return p.metadata.deletion_timestamp is None and CHECKPOINT_REQUESTED not in (p.metadata.annotations or {})

    holds(untouched, 3, what="the running rank untouched")

    # Degraded capacity is counted apart from broken, in the policy's status.
    def counted() -> tuple[object, object]:
        s = kube.get_policy(group).get("status") or {}
        return s.get("gpusSlow"), s.get("gpusBroken")

    wait_for(lambda: counted() == (1, 0), timeout=30, what="the policy counting one slow GPU and no broken one")

    # Once that work ends by itself, no new work lands on the GPU: the scheduler honours the rule.
    dra.wait_rule_seen(kube, rule)
    kube.core.delete_namespaced_pod("rank-0", ns, grace_period_seconds=0)

    def freed() -> bool:
        claims = kube.custom.list_namespaced_custom_object(dra.G, dra.V, ns, "resourceclaims").get("items") or []
        return not any((c.get("status") or {}).get("allocation") and held in dra.allocated_devices(c) for c in claims)

    wait_for(freed, timeout=60, what="the rank's claim gone, its GPU free")
    dra.create_claim_template(kube, ns, "that-gpu", 1, cel=f"device.attributes['{dra.DRIVER}'].index == {bad}")
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "pinned", "that-gpu", node))
    dra.wait_unschedulable(kube, ns, "pinned")

    # The link comes back: the GPU returns after its probation, and the waiting pod gets it.
    fleet[node].unset(f"gpu {bad} nvlink_inactive 0x1")
    wait_for(lambda: rule not in _rules(kube, node), timeout=60, what="the GPU back in service")
    assert _device(kube, node, bad).get("state", "InService") == "InService"
    assert dra.wait_allocated(kube, ns, "pinned", timeout=90) == [held]


def test_an_ib_port_going_down_takes_the_node_out(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str, fleet: AgentFleet
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.apply_policy(group, policy_spec(group))
    fleet.start([node])
    agent = fleet[node]
    assert agent.sysfs is not None
    fakesysfs.write_port(agent.sysfs, "mlx5_0")
    fakesysfs.write_port(agent.sysfs, "mlx5_1")
    wait_for(lambda: kube.state(node) == "Healthy", timeout=60, what="the agent reports, the node Healthy")
    wait_for(lambda: len(kube.report(node)["spec"].get("nics") or []) == 2, timeout=30, what="two ports reported")
    holds(lambda: kube.state(node) == "Healthy", 2, what="two active ports: the node stays Healthy")

    fakesysfs.write_port(agent.sysfs, "mlx5_1", state="DOWN", phys_state="Disabled")
    wait_for(lambda: kube.our_taint(node) is not None, timeout=60, what="the node tainted for its down port")
    status = _status(kube, node)
    assert status["state"] in ("Draining", "Quarantined") and status["reason"] == "NICDown"
    assert "mlx5_1/1 port DOWN/Disabled" in status["message"]
    assert kube.our_taint(node)["value"] == "NICDown"  # type: ignore[index]
    assert kube.node(node)["spec"].get("unschedulable")


def test_a_symbol_error_rate_below_its_threshold_does_nothing(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    """The agent's rates over its window (agent/nic_source.py) as a report carries them: 2 a minute is
    the 120 an hour of NVSentinel's default, not above it; 3 a minute is."""
    (node,) = make_nodes(cluster, group, 1)
    kube.apply_policy(group, policy_spec(group))

    def report(per_min: float) -> dict[str, Any]:
        port = {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "physState": "LinkUp", "linkLayer": "InfiniBand"}
        return {**healthy_spec(), "nics": [{**port, "symbolErrorsPerMin": per_min, "linkDowned": 0}]}

    kube.put_report(node, report(2.0))
    wait_for(lambda: kube.state(node) == "Healthy", what="the node Healthy")
    holds(lambda: kube.state(node) == "Healthy" and kube.our_taint(node) is None, 3, what="nothing done")
    assert not _status(kube, node).get("reason")

    kube.put_report(node, report(3.0))
    wait_for(lambda: kube.our_taint(node) is not None, timeout=30, what="above the threshold, the node out")
    assert _status(kube, node)["reason"] == "NICDown" and "symbol_error 3/min" in _status(kube, node)["message"]
