"""Own node only, proven on the real API server with the installed RBAC and admission policy: the
agent's pod-bound token (the API server records the pod's node in the user's extra) may create and
patch its own node's GPUNodeHealth and renew its own node's Lease, and nothing else; it can never
write the verdict (RBAC refuses the status subresource, and the admission policy refuses it even
where RBAC is widened). The service accounts' access matrix is test_least_privilege.py's."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from kubernetes import client

from devkit.cluster import LocalCluster
from devkit.k8s import (
    GROUP,
    VERSION,
    Kube,
    healthy_spec,
    service_account_token,
    token_kubeconfig,
    utcnow,
    wait_for,
)
from devkit.rbac import (
    AGENT_USER,
    NS,
    REPORTS,
    VAP,
    as_agent_on,
    can_i,
    refusal,
    whoami,
)
from gpuhealth.agent.lease import KubeLeaseTransport, NodeLease
from tests.integration.conftest import make_nodes


def test_agent_writes_only_its_own_nodes_report(
    cluster: LocalCluster, kube: Kube, rbac_installed: None, group: str, tmp_path: Path
) -> None:
    a, b = make_nodes(cluster, group, 2)
    agent_a = as_agent_on(cluster, kube, a, tmp_path)
    agent_b = as_agent_on(cluster, kube, b, tmp_path)

    me = whoami(agent_a)
    assert me["username"] == AGENT_USER
    assert me["extra"]["authentication.kubernetes.io/node-name"] == [a]

    # Its own report: create (CREATE), then merge-patch it (PATCH arrives at admission as UPDATE).
    agent_a.put_report(a, healthy_spec())
    agent_a.put_report(a, healthy_spec(heartbeatTime=utcnow()))
    assert agent_a.report(a)["spec"]["nodeName"] == a

    # Another node's report: creating it is refused...
    def create_b() -> None:
        agent_a.custom.create_cluster_custom_object(
            GROUP,
            VERSION,
            "gpunodehealths",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "GPUNodeHealth",
                "metadata": {"name": b},
                "spec": {"nodeName": b},
            },
        )

    msg = refusal(create_b)
    assert VAP in msg and f"runs on {a}, not on {b}" in msg, msg
    # ...and so is patching it once it exists (written by b's own agent).
    agent_b.put_report(b, healthy_spec())

    def patch_b() -> None:
        agent_a.custom.patch_cluster_custom_object(
            GROUP,
            VERSION,
            "gpunodehealths",
            b,
            {"spec": {"xidEvents": []}},
            _content_type="application/merge-patch+json",
        )

    msg = refusal(patch_b)
    assert VAP in msg and f"runs on {a}, not on {b}" in msg, msg
    assert kube.report(b)["spec"]["devices"], "b's report is untouched"

    # A token of the agent's account that is not bound to a pod carries no node: refused everywhere.
    unbound = Kube(
        token_kubeconfig(cluster, service_account_token(kube, NS, "gpuhealth-agent"), tmp_path / "unbound.kubeconfig")
    )
    msg = refusal(unbound.put_report, a, healthy_spec())
    assert VAP in msg and "token names no node" in msg, msg


def test_agent_renews_only_its_own_nodes_lease(
    cluster: LocalCluster, kube: Kube, rbac_installed: None, group: str, tmp_path: Path
) -> None:
    """Through the agent's own code (NodeLease over the real client), with the pod-bound tokens."""
    a, b = make_nodes(cluster, group, 2)
    agent_a = as_agent_on(cluster, kube, a, tmp_path)
    agent_b = as_agent_on(cluster, kube, b, tmp_path)
    lease_a = NodeLease(KubeLeaseTransport(agent_a.api), NS, a, heartbeat_interval_s=30)
    lease_b = NodeLease(KubeLeaseTransport(agent_b.api), NS, b, heartbeat_interval_s=30)
    leases = client.CoordinationV1Api(kube.api)

    # Its own Lease: created, then renewed (a merge patch reaches admission as UPDATE).
    assert lease_a.renew(dt.datetime.now(dt.UTC)) == "create"
    assert lease_a.renew(dt.datetime.now(dt.UTC)) == "renew"
    assert leases.read_namespaced_lease(a, NS).spec.holder_identity == a

    # Node b's Lease: agent a may neither create it nor renew it once b's agent has.
    as_a_for_b = NodeLease(KubeLeaseTransport(agent_a.api), NS, b, heartbeat_interval_s=30)
    msg = refusal(as_a_for_b.renew, dt.datetime.now(dt.UTC))
    assert VAP in msg and f"runs on {a}, not on {b}" in msg, msg
    assert lease_b.renew(dt.datetime.now(dt.UTC)) == "create"
    before = leases.read_namespaced_lease(b, NS).spec.renew_time
    msg = refusal(as_a_for_b.renew, dt.datetime.now(dt.UTC))
    assert VAP in msg and f"runs on {a}, not on {b}" in msg, msg
    assert leases.read_namespaced_lease(b, NS).spec.renew_time == before

    # Nor delete it (no delete at all), nor claim its own Lease for another holder.
    msg = refusal(client.CoordinationV1Api(agent_a.api).delete_namespaced_lease, b, NS)
    assert 'cannot delete resource "leases"' in msg, msg

    def hand_over() -> None:
        client.CoordinationV1Api(agent_a.api).patch_namespaced_lease(
            a, NS, {"spec": {"holderIdentity": b}}, _content_type="application/merge-patch+json"
        )

    msg = refusal(hand_over)
    assert VAP in msg and "holderIdentity" in msg, msg


def test_agent_never_writes_the_verdict(
    cluster: LocalCluster, kube: Kube, rbac_installed: None, group: str, tmp_path: Path
) -> None:
    (a,) = make_nodes(cluster, group, 1)
    agent = as_agent_on(cluster, kube, a, tmp_path)
    agent.put_report(a, healthy_spec())
    kube.custom.patch_cluster_custom_object_status(
        GROUP,
        VERSION,
        "gpunodehealths",
        a,
        {"status": {"state": "Quarantined", "reason": "XID79"}},
        _content_type="application/merge-patch+json",
    )

    def patch_status() -> None:
        agent.custom.patch_cluster_custom_object_status(
            GROUP,
            VERSION,
            "gpunodehealths",
            a,
            {"status": {"state": "Healthy", "reason": ""}},
            _content_type="application/merge-patch+json",
        )

    # RBAC: the agent has no access to the status subresource.
    msg = refusal(patch_status)
    assert 'cannot patch resource "gpunodehealths/status"' in msg, msg

    # Through the main resource the server drops status changes (status subresource): no effect.
    agent.custom.patch_cluster_custom_object(
        GROUP,
        VERSION,
        "gpunodehealths",
        a,
        {"status": {"state": "Healthy"}},
        _content_type="application/merge-patch+json",
    )
    assert kube.report(a)["status"]["state"] == "Quarantined"

    # Defence in depth: even if someone widens the agent's RBAC to the status subresource, the
    # admission policy still refuses the write.
    widened = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": f"{group}-widen-agent"},
        "rules": [{"apiGroups": [GROUP], "resources": ["gpunodehealths/status"], "verbs": ["patch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{group}-widen-agent"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{group}-widen-agent"},
        "subjects": [{"kind": "ServiceAccount", "name": "gpuhealth-agent", "namespace": NS}],
    }
    cluster.apply_objects([widened, binding])
    try:
        wait_for(lambda: can_i(cluster, AGENT_USER, "patch", REPORTS, None, "status"), what="widened RBAC")

        def refused_by_policy() -> str | None:
            try:
                patch_status()
            except client.ApiException as e:
                body = json.loads(e.body)["message"]
                return str(body) if VAP in body else None
            raise AssertionError("the agent changed the verdict")

        msg = wait_for(refused_by_policy, what="admission policy refusal")
        assert "may not write GPUNodeHealth status" in msg, msg
        assert kube.report(a)["status"]["state"] == "Quarantined"
    finally:
        cluster.kubectl("delete", "clusterrolebinding,clusterrole", f"{group}-widen-agent", "--ignore-not-found")
