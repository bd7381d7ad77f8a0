"""Real agents (fake NVML through the real pynvml) -> real API server -> real operator."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import make_nodes, policy_spec
from tests.support.agents import AgentFleet
from tests.support.cluster import LocalCluster
from tests.support.k8s import Kube, OperatorProcess, wait_for


@pytest.fixture
def fleet(cluster: LocalCluster, tmp_path: Path) -> Iterator[AgentFleet]:
    f = AgentFleet(cluster.kubeconfig, tmp_path / "agents", interval=0.5, heartbeat=2)
    try:
        yield f
    finally:
        f.stop()


def test_injected_xid79_taints_and_cordons_end_to_end(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str, fleet: AgentFleet
) -> None:
    nodes = make_nodes(cluster, group, 2)
    kube.apply_policy(group, policy_spec(group))
    fleet.start(nodes)
    wait_for(lambda: all(kube.state(n) == "Healthy" for n in nodes), timeout=60, what="agents report, nodes Healthy")
    report = kube.report(nodes[0])["spec"]
    assert len(report["devices"]) == 8 and report["nvml"]["available"] is True
    assert report["agent"]["sources"] == ["nvml"]
    before = time.time()
    fleet[nodes[0]].inject_xid(gpu=5, code=79)
    taint = wait_for(lambda: kube.our_taint(nodes[0]), timeout=20, what="taint from the agent's XID")
    assert taint["value"] == "XID79"
    # The fake library logged the instant it handed the XID to the agent: the start of the
    # end-to-end latency make bench measures.
    (emitted,) = fleet[nodes[0]].emitted().values()
    assert before <= emitted <= time.time()
    n = kube.node(nodes[0])
    assert n["spec"]["unschedulable"] is True
    xids = kube.report(nodes[0])["spec"]["xidEvents"]
    assert [(e["xid"], e["gpu"]) for e in xids] == [(79, 5)]
    assert kube.our_taint(nodes[1]) is None


def test_dead_agent_makes_node_unknown_never_healthy(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str, fleet: AgentFleet
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.apply_policy(group, policy_spec(group, rules={"agentSilence": {"after": "5s"}}))
    fleet.start([node])
    wait_for(lambda: kube.state(node) == "Healthy", timeout=60, what="Healthy")
    fleet[node].kill()
    # Two heartbeat intervals (2s each) plus the policy's silence period.
    wait_for(lambda: kube.state(node) == "Unknown", timeout=15, what="Unknown after the agent died")
    wait_for(
        lambda: (
            next(c for c in kube.node(node)["status"]["conditions"] if c["type"] == "GPUHealthy")["status"] == "Unknown"
        ),
        what="GPUHealthy=Unknown on the Node",
    )
    wait_for(lambda: kube.node_events(node, "AgentSilent"), what="AgentSilent event")
    fleet.launch(fleet[node])
    wait_for(lambda: kube.state(node) == "Healthy", timeout=30, what="Healthy again on a fresh report")
