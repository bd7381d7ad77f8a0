"""Real agents (fake NVML through the real pynvml) -> real API server -> real operator."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.agents import AgentFleet
from devkit.cluster import LocalCluster, free_port
from devkit.k8s import Kube, OperatorProcess, holds, wait_for
from tests.integration.conftest import make_nodes, policy_spec


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


def test_mig_devices_and_an_instance_xid_reach_the_report_end_to_end(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str, fleet: AgentFleet
) -> None:
    """A real agent lists GPU 2's MIG devices and an XID NVML attributed to one of its instances; the
    API server keeps every field (the CRD's structural schema would prune unknown ones) and the
    operator reads the report (the node stays Healthy: XID 43 is an application error)."""
    (node,) = make_nodes(cluster, group, 1)
    kube.apply_policy(group, policy_spec(group))
    fleet.start([node])
    wait_for(lambda: kube.state(node) == "Healthy", timeout=60, what="Healthy")
    agent = fleet[node]
    for line in ("gpu 2 mig 1", "gpu 2 mig_device 0 1 0 3g.40gb", "gpu 2 mig_device 1 2 0 3g.40gb MIG-e2e-0001"):
        agent.set(line)

    def mig_devices() -> list[dict[str, object]]:
        gpu2 = next(d for d in kube.report(node)["spec"]["devices"] if d["index"] == 2)
        return list(gpu2.get("migDevices", []))

    wait_for(lambda: len(mig_devices()) == 2, timeout=20, what="GPU 2's MIG devices in the report")
    first, second = mig_devices()
    assert str(first["uuid"]).startswith("MIG-")
    assert {k: first[k] for k in ("index", "gpuInstanceId", "computeInstanceId", "profile")} == {
        "index": 0,
        "gpuInstanceId": 1,
        "computeInstanceId": 0,
        "profile": "3g.40gb",
    }
    assert second == {
        "index": 1,
        "uuid": "MIG-e2e-0001",
        "gpuInstanceId": 2,
        "computeInstanceId": 0,
        "profile": "3g.40gb",
    }
    others = [d for d in kube.report(node)["spec"]["devices"] if d["index"] != 2]
    assert len(others) == 7 and not any("migDevices" in d for d in others)

    agent.inject_xid(gpu=2, code=43, gi=2, ci=0)
    wait_for(lambda: kube.report(node)["spec"]["xidEvents"], timeout=20, what="the XID in the report")
    (xid,) = kube.report(node)["spec"]["xidEvents"]
    assert (xid["xid"], xid["gpu"], xid["gpuInstanceId"], xid["computeInstanceId"]) == (43, 2, 2, 0)
    time.sleep(2)  # a few operator passes over the new report
    assert kube.state(node) == "Healthy"
    assert not kube.node_events(node, "InvalidReport")


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
    # While the agent stays dead, the node stays Unknown: over several sweeper ticks and more than
    # another silence period, it is never made Healthy (nor its condition True).
    samples = holds(
        lambda: (
            kube.state(node) == "Unknown"
            and next(c for c in kube.node(node)["status"]["conditions"] if c["type"] == "GPUHealthy")["status"]
            == "Unknown"
        ),
        seconds=8,
        what="Unknown while the agent is dead",
    )
    # Each sample is two API reads: a loaded machine took 7 in the 8 s (a fresh-clone make test), an idle
    # one ~30. Four spread over 8 s still see several sweeper ticks (--tick=1).
    assert samples >= 4
    fleet.launch(fleet[node])
    wait_for(lambda: kube.state(node) == "Healthy", timeout=30, what="Healthy again on a fresh report")


def test_xid_held_by_an_agent_killed_before_its_report_write_is_published_after_restart(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str, fleet: AgentFleet, tmp_path: Path
) -> None:
    """NVML delivers an XID once. The agent gets it while it cannot reach the API server (so it cannot
    have published it), is SIGKILLed, and restarts with the same state dir (the DaemonSet's emptyDir):
    its XID journal brings the fault to the report and the node is quarantined."""
    (node,) = make_nodes(cluster, group, 1)
    kube.apply_policy(group, policy_spec(group))
    fleet.start([node])
    wait_for(lambda: kube.state(node) == "Healthy", timeout=60, what="agent reports, node Healthy")
    agent = fleet[node]
    agent.kill()
    # The same cluster at a port nobody listens on: the agent retries its restore forever, writes nothing.
    dead_api = json.loads(cluster.kubeconfig.read_text())
    for entry in dead_api["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    (tmp_path / "dead-api.kubeconfig").write_text(json.dumps(dead_api))
    fleet.launch(agent, kubeconfig=tmp_path / "dead-api.kubeconfig")
    # "started" is logged once the XID events are registered: an XID injected earlier would count as past.
    wait_for(lambda: agent.log.read_text().count("agent started for node") == 2, timeout=30, what="agent restarted")
    agent.inject_xid(gpu=5, code=79)
    wait_for(lambda: 1 in agent.emitted(), timeout=10, interval=0.01, what="NVML delivered the XID")
    wait_for(lambda: agent.journal(), timeout=10, interval=0.01, what="the agent journaled the XID")
    agent.kill()  # SIGKILL with the XID only in its memory and its journal; NVML will not repeat it
    assert not kube.report(node)["spec"].get("xidEvents") and kube.our_taint(node) is None
    fleet.launch(agent)  # the real API again, the same state dir
    taint = wait_for(lambda: kube.our_taint(node), timeout=30, what="taint from the journaled XID")
    assert taint["value"] == "XID79"
    xids = kube.report(node)["spec"]["xidEvents"]
    assert [(e["xid"], e["gpu"]) for e in xids] == [(79, 5)]
    assert list(agent.emitted()) == [1], "the restarted agent got the XID from its journal, not from NVML"


def test_a_corrupt_inforom_reaches_the_report_and_degrades_the_node_without_quarantine(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str, fleet: AgentFleet
) -> None:
    """The fact declared once (api/device_facts.py), end to end: the fake driver answers
    NVML_ERROR_CORRUPTED_INFOROM for GPU 3, the agent (which validates the InfoROM at start, then hourly)
    writes inforomCorrupt, the API server keeps it (the generated CRD declares it), and the operator
    observes it: Degraded for InfoROMCorrupt, no taint, no cordon."""
    (node,) = make_nodes(cluster, group, 1)
    kube.apply_policy(group, policy_spec(group))
    fleet.start([node])
    wait_for(lambda: kube.state(node) == "Healthy", timeout=60, what="agent reports, node Healthy")
    assert all(d["inforomCorrupt"] is False for d in kube.report(node)["spec"]["devices"])
    agent = fleet[node]
    agent.set("gpu 3 inforom_corrupt 1")
    agent.kill(signal.SIGTERM)
    fleet.launch(agent)  # a restarted agent validates the InfoROM at once
    wait_for(lambda: kube.state(node) == "Degraded", timeout=30, what="Degraded from the corrupt InfoROM")
    report = kube.report(node)
    gpu3 = next(d for d in report["spec"]["devices"] if d["index"] == 3)
    assert gpu3["inforomCorrupt"] is True
    assert report["status"]["reason"] == "InfoROMCorrupt"
    assert kube.our_taint(node) is None and not kube.node(node)["spec"].get("unschedulable")
