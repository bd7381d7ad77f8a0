"""The operator against the real control plane: verdicts, actions, ownership, safety, restarts."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, healthy_spec, utcnow, wait_for
from devkit.k8s import xid_event as xid
from tests.integration.conftest import make_nodes, policy_spec

TAINT = "gpuhealth.dev/unhealthy"


def test_xid79_taints_cordons_and_explains(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.apply_policy(group, policy_spec(group))
    kube.put_report(node, healthy_spec())
    wait_for(lambda: kube.state(node) == "Healthy", what="Healthy verdict")
    kube.put_report(node, healthy_spec(xids=[xid(79)]))
    taint = wait_for(lambda: kube.our_taint(node), what="gpuhealth taint")
    assert taint["value"] == "XID79" and taint["effect"] == "NoSchedule"
    n = kube.node(node)
    assert n["spec"]["unschedulable"] is True
    # XID 79 drains; with no workload pods the drain completes at once and the node stays quarantined.
    assert n["metadata"]["labels"]["gpuhealth.dev/state"] in ("Draining", "Quarantined")
    cond = wait_for(lambda: (c := kube.condition(node)) and c["status"] == "False" and c, what="GPUHealthy=False")
    assert cond["reason"] == "XID79"
    ev = wait_for(lambda: kube.node_events(node, "Quarantined"), what="Quarantined event")
    msg = ev[0].message
    assert "GPU 3 (GPU-00000003" in msg and "XID 79" in msg and "fallen off the bus" in msg.lower()
    assert "drained" in msg
    wait_for(lambda: kube.state(node) == "Quarantined", what="drain of an empty node completes")
    status = kube.report(node)["status"]
    assert status["reason"] == "XID79" and status["drain"]["phase"] == "Completed"
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
    kube.core.patch_node(
        node, {"spec": {"unschedulable": True, "taints": [{"key": "example.com/maintenance", "effect": "NoSchedule"}]}}
    )
    kube.apply_policy(
        group,
        policy_spec(
            group, safety={"probation": "3s"}, rules={"xid": {"overrides": [{"code": 79, "action": "cordon"}]}}
        ),
    )
    kube.put_report(node, healthy_spec(xids=[xid(79)]))
    wait_for(lambda: kube.our_taint(node), what="taint")
    assert kube.state(node) == "Quarantined"
    keys = {t["key"] for t in kube.taints(node)}
    assert {TAINT, "example.com/maintenance"} <= keys
    # The node reboots: the agent's XID history is empty again.
    kube.put_report(node, healthy_spec(xids=[]))
    wait_for(lambda: kube.state(node) == "Healthy", timeout=30, what="return to service")
    # The verdict is recorded first, then the Node follows.
    n = wait_for(lambda: kube.our_taint(node) is None and kube.node(node), what="our taint lifted")
    assert n["spec"].get("unschedulable") is True, "the human's cordon must survive"
    keys = {t["key"] for t in n["spec"]["taints"]}
    assert "example.com/maintenance" in keys and TAINT not in keys
    wait_for(
        lambda: any("someone else" in e.message for e in kube.node_events(node, "GPUHealthAction")),
        what="the foreign cordon noted in an Event",
    )


def test_recovery_only_after_probation(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.apply_policy(
        group,
        policy_spec(
            group, safety={"probation": "6s"}, rules={"xid": {"overrides": [{"code": 48, "action": "cordon"}]}}
        ),
    )
    kube.put_report(node, healthy_spec(xids=[xid(48)]))
    wait_for(lambda: kube.our_taint(node), what="taint")
    kube.put_report(node, healthy_spec(xids=[]))
    wait_for(lambda: kube.state(node) == "Recovering", what="probation")
    started = time.monotonic()
    assert kube.our_taint(node) is not None
    wait_for(lambda: kube.state(node) == "Healthy", timeout=30, what="healthy after probation")
    assert time.monotonic() - started >= 4.5
    # The verdict is recorded first, then the Node follows.
    n = wait_for(
        lambda: (n := kube.node(node))["metadata"]["labels"]["gpuhealth.dev/state"] == "Healthy" and n,
        what="node marks lifted",
    )
    assert kube.our_taint(node) is None and not n["spec"].get("unschedulable")
    wait_for(lambda: kube.node_events(node, "ReturnedToService"), what="ReturnedToService event")


def test_dry_run_writes_nothing_to_nodes(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    # Let the node controller finish with the new node (it lifts its not-ready taint) before the baseline.
    before = wait_for(lambda: not (n := kube.node(node))["spec"].get("taints") and n, what="node settled")
    kube.apply_policy(group, policy_spec(group, mode="DryRun"))
    kube.put_report(node, healthy_spec(xids=[xid(79)]))
    ev = wait_for(lambda: kube.node_events(node, "Quarantined"), what="DryRun event")
    assert ev[0].message.startswith("DryRun")
    time.sleep(2)
    after = kube.node(node)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"] or (
        after["spec"] == before["spec"]
        and after["metadata"].get("labels") == before["metadata"].get("labels")
        and after["metadata"].get("annotations") == before["metadata"].get("annotations")
    )
    assert not any(c["type"] == "GPUHealthy" for c in after["status"]["conditions"])
    assert kube.report(node)["status"]["dryRun"] is True


def _quarantined(kube: Kube, nodes: list[str]) -> list[str]:
    return [n for n in nodes if kube.our_taint(n) is not None]


def test_breaker_holds_at_limit_then_closes_after_recovery(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    nodes = make_nodes(cluster, group, 10)
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"maxUnhealthy": 3, "probation": "2s"},
            rules={"xid": {"overrides": [{"code": 79, "action": "cordon"}]}},
        ),
    )
    for n in nodes:
        kube.put_report(n, healthy_spec())
    wait_for(lambda: all(kube.state(n) == "Healthy" for n in nodes), what="all healthy")
    for n in nodes:
        kube.put_report(n, healthy_spec(xids=[xid(79)]))
    wait_for(lambda: kube.get_policy(group).get("status", {}).get("breaker") == "Open", what="breaker open")
    seen_max = 0
    for _ in range(15):  # sample: never more than the limit at any instant
        q = _quarantined(kube, nodes)
        seen_max = max(seen_max, len(q))
        time.sleep(0.2)
    assert seen_max == 3
    status = kube.get_policy(group)["status"]
    assert status["quarantined"] == 3 and status["heldBack"] == 7
    cond = next(c for c in status["conditions"] if c["type"] == "BreakerOpen")
    assert cond["status"] == "True"
    assert wait_for(
        lambda: (
            kube.custom
            and [
                e
                for e in kube.core.list_namespaced_event("default", field_selector=f"involvedObject.name={group}").items
                if e.reason == "BreakerOpen"
            ]
        ),
        what="BreakerOpen event",
    )
    held = [n for n in nodes if kube.state(n) == "Degraded"]
    assert len(held) == 7
    wait_for(lambda: kube.node_events(held[0], "QuarantineHeldBack"), what="QuarantineHeldBack event")
    for n in nodes:
        kube.put_report(n, healthy_spec(xids=[]))
    wait_for(lambda: kube.get_policy(group)["status"].get("breaker") == "Closed", timeout=40, what="breaker closed")
    wait_for(lambda: all(kube.state(n) == "Healthy" for n in nodes), timeout=40, what="fleet healthy")
    wait_for(lambda: _quarantined(kube, nodes) == [], what="every taint lifted after its verdict")


def _count_actions(kube: Kube, node: str) -> tuple[int, int]:
    evs = kube.node_events(node)
    return (sum(1 for e in evs if e.reason == "Quarantined"), sum(1 for e in evs if e.reason == "GPUHealthAction"))


def test_operator_killed_mid_quarantine_resumes_without_duplicates(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    nodes = make_nodes(cluster, group, 3)
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"maxUnhealthy": "100%", "probation": "2s"},
            rules={"xid": {"overrides": [{"code": 79, "action": "cordon"}]}},
        ),
    )
    for n in nodes:
        kube.put_report(n, healthy_spec())
    wait_for(lambda: all(kube.state(n) == "Healthy" for n in nodes), what="healthy")
    kube.put_report(nodes[0], healthy_spec(xids=[xid(79)]))
    wait_for(lambda: kube.our_taint(nodes[0]), what="first quarantine")
    # Events are posted in the background: a kill before they land loses them (at most once, never twice).
    wait_for(lambda: _count_actions(kube, nodes[0]) == (1, 1), what="first quarantine announced")
    operator.kill()
    # While the operator is down, another node faults and the first one is still faulty.
    kube.put_report(nodes[1], healthy_spec(xids=[xid(79)]))
    operator.start()
    wait_for(lambda: kube.our_taint(nodes[1]), what="quarantine after restart")
    time.sleep(3)  # several sweeps
    assert _count_actions(kube, nodes[0]) == (1, 1), "no duplicate decision or action after restart"
    assert _count_actions(kube, nodes[1]) == (1, 1)
    assert kube.state(nodes[0]) == "Quarantined" and kube.report(nodes[0])["status"]["quarantines"].__len__() == 1
    # A write-ahead record without the Node write (killed in between) converges on restart.
    operator.kill()
    kube.custom.patch_cluster_custom_object_status(
        "gpuhealth.dev",
        "v1alpha1",
        "gpunodehealths",
        nodes[2],
        {"status": {"state": "Quarantined", "reason": "XID79", "quarantines": [utcnow()[:19] + "Z"]}},
        _content_type="application/merge-patch+json",
    )
    kube.put_report(nodes[2], healthy_spec(xids=[xid(79)]))
    operator.start()
    taint = wait_for(lambda: kube.our_taint(nodes[2]), what="node converged to the recorded quarantine")
    assert taint["value"] == "XID79"
    time.sleep(2)
    assert _count_actions(kube, nodes[2]) == (0, 1), "the decision was made before the kill; only the action is new"


def test_agent_clock_ahead_does_not_keep_a_silent_node_healthy(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.apply_policy(group, policy_spec(group, rules={"agentSilence": {"after": "5s"}}))
    ahead = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    kube.put_report(node, healthy_spec(heartbeatTime=ahead))
    wait_for(lambda: kube.state(node) == "Healthy", what="Healthy verdict on a live report")
    skew = wait_for(lambda: kube.node_events(node, "ClockSkew"), what="ClockSkew event")
    assert "ahead of the operator's" in skew[0].message
    # The agent dies: its heartbeat still says an hour from now, but nothing new is written.
    wait_for(lambda: kube.state(node) == "Unknown", timeout=20, what="silence detected despite the future heartbeat")
    assert "no heartbeat from the agent" in kube.report(node)["status"]["message"]


def test_restarted_operator_does_not_announce_an_open_breaker_again(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    nodes = make_nodes(cluster, group, 3)
    kube.apply_policy(
        group,
        policy_spec(
            group, safety={"maxUnhealthy": 1}, rules={"xid": {"overrides": [{"code": 79, "action": "cordon"}]}}
        ),
    )
    for n in nodes:
        kube.put_report(n, healthy_spec())
    wait_for(lambda: all(kube.state(n) == "Healthy" for n in nodes), what="all healthy")
    for n in nodes[:2]:
        kube.put_report(n, healthy_spec(xids=[xid(79)]))
    wait_for(lambda: kube.get_policy(group).get("status", {}).get("breaker") == "Open", what="breaker open")

    def breaker_events() -> list[Any]:
        evs = kube.core.list_namespaced_event("default", field_selector=f"involvedObject.name={group}").items
        return [e for e in evs if e.reason == "BreakerOpen"]

    wait_for(breaker_events, what="BreakerOpen event")
    operator.kill()
    operator.start()
    # The restarted operator is acting once it holds back the next fault too; then give it a few sweeps.
    kube.put_report(nodes[2], healthy_spec(xids=[xid(79)]))
    wait_for(lambda: kube.node_events(nodes[2], "QuarantineHeldBack"), what="restarted operator acting")
    time.sleep(3)
    assert kube.get_policy(group)["status"]["breaker"] == "Open"
    assert [e.count or 1 for e in breaker_events()] == [1], "the transition was announced once"


def test_a_deleted_nodes_report_is_deleted_and_a_relabelled_nodes_is_kept(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    gone, relabelled = make_nodes(cluster, group, 2)
    kube.apply_policy(group, policy_spec(group))
    for n in (gone, relabelled):
        kube.put_report(n, healthy_spec())
    wait_for(lambda: kube.state(gone) == "Healthy" and kube.state(relabelled) == "Healthy", what="healthy")
    # Losing the GPU label looks like DELETED to the operator's label-selected watch: not a deletion.
    kube.core.patch_node(relabelled, {"metadata": {"labels": {"nvidia.com/gpu.present": "false"}}})
    kube.core.delete_node(gone)

    def report_gone() -> bool:
        try:
            kube.report(gone)
        except Exception as e:
            return getattr(e, "status", None) == 404
        return False

    wait_for(report_gone, timeout=30, what="the deleted Node's report deleted by the operator")
    assert kube.report(relabelled)["status"]["state"] == "Healthy"
