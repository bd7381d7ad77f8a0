"""A hung NVML call, end to end: a real agent on the fake NVML (one call blocked), the real API server,
the real operator.

Before, the sampler stopped, the Lease kept being renewed from the last snapshot (a fresh heartbeat
vouching for stale facts), and a restarted agent whose nvmlInit blocked too left the node as a dead
agent. Now: within the agent's bound the node's reason is NVMLUnresponsive (here the policy cordons),
the Lease says how old its facts are and that NVML hangs, an agent restarted as the liveness probe
would (SIGKILL, nvmlInit blocked as well) keeps reporting it, and once NVML answers the node returns
after probation.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devkit.agents import AgentFleet
from devkit.cluster import LocalCluster
from devkit.k8s import GPUHEALTH_NAMESPACE, Kube, OperatorProcess, ensure_namespace, holds, wait_for
from gpuhealth.api.names import LEASE_NVML_UNRESPONSIVE_ANNOTATION, LEASE_SAMPLED_AT_ANNOTATION
from gpuhealth.api.timeutil import parse_time
from tests.integration.conftest import make_nodes, policy_spec

HANG_AFTER_S = 3.0
BLOCKED = "nvmlDeviceGetTotalEccErrors"
PROBATION_S = 5


@pytest.fixture
def fleet(cluster: LocalCluster, kube: Kube, tmp_path: Path) -> Iterator[AgentFleet]:
    ensure_namespace(kube, GPUHEALTH_NAMESPACE)
    f = AgentFleet(cluster.kubeconfig, tmp_path / "agents", interval=0.5, heartbeat=1.0)
    f.lease_namespace = GPUHEALTH_NAMESPACE
    f.nvml_hang_after = HANG_AFTER_S
    try:
        yield f
    finally:
        for a in f.agents.values():
            a.lines = [ln for ln in a.lines if not ln.startswith("block ")]
            a.write()
        f.stop()


def lease(kube: Kube, node: str) -> dict[str, Any]:
    obj = client.CoordinationV1Api(kube.api).read_namespaced_lease(node, GPUHEALTH_NAMESPACE)
    return kube.api.sanitize_for_serialization(obj)  # type: ignore[no-any-return]


def notes(kube: Kube, node: str) -> dict[str, str]:
    return dict((lease(kube, node).get("metadata") or {}).get("annotations") or {})


def hang_of(kube: Kube, node: str) -> dict[str, Any] | None:
    found = ((kube.report(node).get("spec") or {}).get("nvml") or {}).get("unresponsive")
    return dict(found) if found else None


def reason(kube: Kube, node: str) -> str | None:
    return (kube.report(node).get("status") or {}).get("reason")


def test_a_hung_nvml_call_is_its_own_reason_survives_an_agent_restart_and_clears(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str, fleet: AgentFleet
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    rules = {"nvmlUnresponsive": {"action": "cordon"}, "agentSilence": {"after": "20s"}}
    kube.apply_policy(group, policy_spec(group, rules=rules, safety={"probation": f"{PROBATION_S}s"}))
    fleet.start([node])
    wait_for(lambda: kube.state(node) == "Healthy", timeout=60, what="the agent reports, the node Healthy")
    wait_for(lambda: LEASE_SAMPLED_AT_ANNOTATION in notes(kube, node), timeout=20, what="the Lease's sampled-at")
    assert LEASE_NVML_UNRESPONSIVE_ANNOTATION not in notes(kube, node)
    agent = fleet[node]

    # The GPU wedges: the ECC counter read never returns.
    blocked = time.monotonic()
    agent.set(f"block {BLOCKED}")
    wait_for(lambda: reason(kube, node) == "NVMLUnresponsive", timeout=HANG_AFTER_S + 30, what="NVMLUnresponsive")
    took = time.monotonic() - blocked
    assert took < HANG_AFTER_S + 15, f"NVMLUnresponsive after {took:.1f}s (bound {HANG_AFTER_S}s)"
    assert kube.state(node) == "Quarantined"
    taint = kube.our_taint(node)
    assert taint is not None and taint["value"] == "NVMLUnresponsive"
    hang = hang_of(kube, node)
    assert hang is not None and hang["call"] == BLOCKED
    since = parse_time(hang["since"])
    assert since is not None

    # The Lease no longer vouches for the old facts: still renewed, but it names the hang and its
    # sampled-at stays at the newest sample before it.
    wait_for(lambda: LEASE_NVML_UNRESPONSIVE_ANNOTATION in notes(kube, node), timeout=10, what="the Lease's hang")
    first = lease(kube, node)
    assert notes(kube, node)[LEASE_NVML_UNRESPONSIVE_ANNOTATION].startswith(f"{BLOCKED} since ")
    sampled = parse_time(notes(kube, node)[LEASE_SAMPLED_AT_ANNOTATION])
    assert sampled is not None and sampled <= since
    wait_for(lambda: lease(kube, node)["spec"]["renewTime"] != first["spec"]["renewTime"], timeout=10, what="a renewal")
    assert parse_time(notes(kube, node)[LEASE_SAMPLED_AT_ANNOTATION]) == sampled

    # The liveness probe restarts the agent; now nvmlInit blocks too. The restarted agent keeps
    # reporting the hang (its marker, the original time), never going silent.
    agent.set("block nvmlInitWithFlags")
    agent.kill()
    fleet.launch(agent)
    wait_for(
        lambda: (kube.report(node)["spec"].get("nvml") or {}).get("available") is False,
        timeout=HANG_AFTER_S + 30,
        what="the restarted agent's report",
    )
    after = hang_of(kube, node)
    assert after is not None and after["call"] == BLOCKED and parse_time(after["since"]) == since
    holds(lambda: reason(kube, node) == "NVMLUnresponsive" and kube.state(node) == "Quarantined", 3, what="held")

    # NVML answers again: the marker goes, and the node returns after probation.
    agent.unset("block nvmlInitWithFlags")
    agent.unset(f"block {BLOCKED}")
    wait_for(lambda: hang_of(kube, node) is None, timeout=30, what="the hang cleared in the report")
    wait_for(lambda: LEASE_NVML_UNRESPONSIVE_ANNOTATION not in notes(kube, node), timeout=10, what="Lease cleared")
    wait_for(lambda: kube.state(node) == "Healthy", timeout=PROBATION_S + 60, what="back after probation")
    # The status is written ahead of the Node (architecture.md, "Restart safety"): the taint lifts just after.
    wait_for(lambda: kube.our_taint(node) is None, timeout=10, what="the taint lifted")
    assert [e.reason for e in kube.node_events(node, "Recovering")], "no probation before the return"
    assert agent.state_dir is not None and not (agent.state_dir / "nvml-unresponsive.json").exists()
