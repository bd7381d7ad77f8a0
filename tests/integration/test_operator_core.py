"""The operator against the real control plane: verdicts, actions, ownership, safety, restarts."""

from __future__ import annotations

import time

from tests.integration.conftest import make_nodes, policy_spec
from tests.support.cluster import LocalCluster
from tests.support.k8s import Kube, OperatorProcess, healthy_spec, utcnow, wait_for

TAINT = "gpuhealth.dev/unhealthy"


def xid(code: int, gpu: int = 3) -> dict[str, object]:
    return {"xid": code, "gpu": gpu, "uuid": f"GPU-{gpu:08d}-0000-0000-0000-000000000000", "time": utcnow(),
            "source": "simulated"}


def test_xid79_taints_cordons_and_explains(cluster: LocalCluster, kube: Kube, operator: OperatorProcess,
                                          group: str) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.apply_policy(group, policy_spec(group))
    kube.put_report(node, healthy_spec())
    wait_for(lambda: kube.state(node) == "Healthy", what="Healthy verdict")
    kube.put_report(node, healthy_spec(xids=[xid(79)]))
    taint = wait_for(lambda: kube.our_taint(node), what="gpuhealth taint")
    assert taint["value"] == "XID79" and taint["effect"] == "NoSchedule"
    n = kube.node(node)
    assert n["spec"]["unschedulable"] is True
    assert n["metadata"]["labels"]["gpuhealth.dev/state"] == "Draining"
    cond = next(c for c in n["status"]["conditions"] if c["type"] == "GPUHealthy")
    assert cond["status"] == "False" and cond["reason"] == "XID79"
    ev = wait_for(lambda: kube.node_events(node, "Quarantined"), what="Quarantined event")
    msg = ev[0].message
    assert "GPU 3 (GPU-00000003" in msg and "XID 79" in msg and "fallen off the bus" in msg.lower()
    assert "drained" in msg
    status = kube.report(node)["status"]
    assert status["state"] == "Draining" and status["reason"] == "XID79"
    assert status["evidence"][0]["code"] == 79


def test_application_xid_ignored_then_escalated_when_repeated(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.apply_policy(group, policy_spec(group, rules={"xid": {"applicationRepeat": {"count": 3, "window": "10m"}}}))
    kube.put_report(node, healthy_spec(xids=[xid(13, gpu=1)]))
    wait_for(lambda: kube.state(node) == "Healthy", what="app XID ignored")
    time.sleep(2)
    assert kube.our_taint(node) is None
    kube.put_report(node, healthy_spec(xids=[xid(13, gpu=1), xid(13, gpu=1), xid(13, gpu=1)]))
    taint = wait_for(lambda: kube.our_taint(node), what="escalation taint")
    assert taint["value"] == "RepeatedAppXID"
    assert kube.report(node)["status"]["evidence"][0]["gpu"] == 1


def test_human_cordon_survives_quarantine_and_recovery(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.core.patch_node(node, {"spec": {"unschedulable": True,
                                         "taints": [{"key": "example.com/maintenance", "effect": "NoSchedule"}]}})
    kube.apply_policy(group, policy_spec(group, safety={"probation": "3s"},
                                         rules={"xid": {"overrides": [{"code": 79, "action": "cordon"}]}}))
    kube.put_report(node, healthy_spec(xids=[xid(79)]))
    wait_for(lambda: kube.our_taint(node), what="taint")
    assert kube.state(node) == "Quarantined"
    keys = {t["key"] for t in kube.taints(node)}
    assert {TAINT, "example.com/maintenance"} <= keys
    # The node reboots: the agent's XID history is empty again.
    kube.put_report(node, healthy_spec(xids=[]))
    wait_for(lambda: kube.state(node) == "Healthy", timeout=30, what="return to service")
    n = kube.node(node)
    assert n["spec"].get("unschedulable") is True, "the human's cordon must survive"
    keys = {t["key"] for t in n["spec"]["taints"]}
    assert "example.com/maintenance" in keys and TAINT not in keys
    assert any("someone else" in e.message for e in kube.node_events(node, "GPUHealthAction"))


def test_recovery_only_after_probation(cluster: LocalCluster, kube: Kube, operator: OperatorProcess,
                                       group: str) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.apply_policy(group, policy_spec(group, safety={"probation": "6s"},
                                         rules={"xid": {"overrides": [{"code": 48, "action": "cordon"}]}}))
    kube.put_report(node, healthy_spec(xids=[xid(48)]))
    wait_for(lambda: kube.our_taint(node), what="taint")
    kube.put_report(node, healthy_spec(xids=[]))
    wait_for(lambda: kube.state(node) == "Recovering", what="probation")
    started = time.monotonic()
    assert kube.our_taint(node) is not None
    wait_for(lambda: kube.state(node) == "Healthy", timeout=30, what="healthy after probation")
    assert time.monotonic() - started >= 4.5
    n = kube.node(node)
    assert kube.our_taint(node) is None and not n["spec"].get("unschedulable")
    assert n["metadata"]["labels"]["gpuhealth.dev/state"] == "Healthy"
    assert kube.node_events(node, "ReturnedToService")


def test_dry_run_writes_nothing_to_nodes(cluster: LocalCluster, kube: Kube, operator: OperatorProcess,
                                         group: str) -> None:
    (node,) = make_nodes(cluster, group, 1)
    before = kube.node(node)
    kube.apply_policy(group, policy_spec(group, mode="DryRun"))
    kube.put_report(node, healthy_spec(xids=[xid(79)]))
    ev = wait_for(lambda: kube.node_events(node, "Quarantined"), what="DryRun event")
    assert ev[0].message.startswith("DryRun")
    time.sleep(2)
    after = kube.node(node)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"] or (
        after["spec"] == before["spec"] and after["metadata"].get("labels") == before["metadata"].get("labels")
        and after["metadata"].get("annotations") == before["metadata"].get("annotations")
    )
    assert not any(c["type"] == "GPUHealthy" for c in after["status"]["conditions"])
    assert kube.report(node)["status"]["dryRun"] is True
