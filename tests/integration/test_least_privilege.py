"""Least privilege, proven on the real API server with the installed RBAC and admission policy.

- The access matrix of both service accounts (`kubectl auth can-i --as=...`): every verb the code
  needs is allowed; secrets, node deletion, pod creation, policy specs and the agent's reach beyond
  its own report are not.
- Own node only: the agent's token reaches its own node's objects and nothing else
  (test_agent_identity.py).
- The operator, run under its service account's token, carries a whole XID 79 scenario (taint,
  cordon, condition, label, Events, stub report for a silent node, policy status, Kopf peering)
  without a single 403.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client

from devkit.cluster import REPO, LocalCluster, free_port
from devkit.k8s import (
    GROUP,
    VERSION,
    Kube,
    OperatorProcess,
    healthy_spec,
    refusals,
    service_account_token,
    token_kubeconfig,
    wait_for,
)
from devkit.k8s import xid_event as xid
from devkit.rbac import (
    AGENT_USER,
    ALL,
    NS,
    OPERATOR_USER,
    PEERINGS,
    POLICIES,
    REPORTS,
    as_agent_on,
    can_i,
    whoami,
)
from gpuhealth.workload import acknowledge
from tests.integration.conftest import make_nodes, policy_spec

SLICES, CLAIMS = "resourceslices.resource.k8s.io", "resourceclaims.resource.k8s.io"
TAINT_RULES = "devicetaintrules.resource.k8s.io"
LEASES = "leases.coordination.k8s.io"
REMEDIATION_NS = "gpuhealth-remediation"

# (verb, resource, namespace, subresource)
OPERATOR_CAN = [
    *[(v, "nodes", None, "") for v in ("get", "list", "watch", "patch")],
    ("patch", "nodes", None, "status"),
    *[(v, "pods", ALL, "") for v in ("list", "watch", "patch", "delete")],
    ("delete", "pods", "gpu-operator", ""),  # the device plugin's pod after a repair (spec.remediation.devicePlugin)
    ("create", "pods", ALL, "eviction"),
    ("create", "events", "default", ""),
    *[(v, REPORTS, None, "") for v in ("get", "list", "watch", "create", "delete")],
    ("patch", REPORTS, None, "status"),
    *[(v, POLICIES, None, "") for v in ("get", "list", "watch", "patch")],  # patch: Kopf's finalizer only
    ("patch", POLICIES, None, "status"),
    *[(v, PEERINGS, None, "") for v in ("get", "list", "watch", "patch")],
    *[(v, SLICES, None, "") for v in ("list", "watch")],
    ("list", CLAIMS, ALL, ""),
    *[(v, TAINT_RULES, None, "") for v in ("list", "create", "delete")],
    *[(v, LEASES, NS, "") for v in ("list", "watch")],  # the agents' heartbeats, in their namespace
    *[(v, "jobs.batch", REMEDIATION_NS, "") for v in ("create", "get", "delete")],  # GPU reset Jobs, there only
]
OPERATOR_CANNOT = [
    ("create", "jobs.batch", ALL, ""),
    ("create", "jobs.batch", NS, ""),
    ("create", "jobs.batch", "default", ""),
    ("list", "jobs.batch", REMEDIATION_NS, ""),
    ("update", "jobs.batch", REMEDIATION_NS, ""),
    ("create", "pods", REMEDIATION_NS, ""),
    ("get", "secrets", ALL, ""),
    ("list", "secrets", NS, ""),
    ("delete", "nodes", None, ""),
    ("create", "nodes", None, ""),
    ("update", "nodes", None, ""),
    ("get", "pods", ALL, ""),
    ("create", "pods", ALL, ""),
    ("create", "pods", NS, ""),
    ("update", "pods", ALL, ""),
    ("create", "pods", ALL, "exec"),
    ("update", POLICIES, None, ""),
    ("create", POLICIES, None, ""),
    ("delete", POLICIES, None, ""),
    ("patch", REPORTS, None, ""),
    ("update", REPORTS, None, ""),
    ("create", "events", "kube-system", ""),
    ("create", "events", NS, ""),
    ("delete", "events", "default", ""),
    ("get", "configmaps", NS, ""),
    ("create", "serviceaccounts", NS, "token"),
    ("create", PEERINGS, None, ""),
    ("delete", PEERINGS, None, ""),
    ("create", "clusterrolebindings", None, ""),
    ("escalate", "clusterroles", None, ""),
    ("impersonate", "serviceaccounts", ALL, ""),
    *[(v, SLICES, None, "") for v in ("get", "create", "update", "patch", "delete")],
    *[(v, CLAIMS, ALL, "") for v in ("get", "watch", "create", "update", "patch", "delete")],
    ("patch", CLAIMS, ALL, "status"),
    *[(v, TAINT_RULES, None, "") for v in ("get", "update", "patch")],
    ("create", "deviceclasses.resource.k8s.io", None, ""),
    *[(v, LEASES, NS, "") for v in ("get", "create", "update", "patch", "delete")],
    *[(v, LEASES, ALL, "") for v in ("list", "watch")],
    ("list", LEASES, "kube-node-lease", ""),
    ("*", "*", ALL, ""),
]
AGENT_CAN = [
    *[(v, REPORTS, None, "") for v in ("get", "create", "patch")],
    *[(v, LEASES, NS, "") for v in ("create", "patch")],
]
AGENT_CANNOT = [
    ("create", TAINT_RULES, None, ""),
    ("list", SLICES, None, ""),
    ("patch", REPORTS, None, "status"),
    ("update", REPORTS, None, "status"),
    ("update", REPORTS, None, ""),
    ("delete", REPORTS, None, ""),
    ("list", REPORTS, None, ""),
    ("watch", REPORTS, None, ""),
    ("get", POLICIES, None, ""),
    ("get", "nodes", None, ""),
    ("patch", "nodes", None, ""),
    ("patch", "nodes", None, "status"),
    ("list", "pods", ALL, ""),
    ("get", "secrets", NS, ""),
    ("create", "events", "default", ""),
    *[(v, LEASES, NS, "") for v in ("get", "list", "watch", "update", "delete")],
    *[(v, LEASES, "kube-node-lease", "") for v in ("create", "patch", "delete")],
    ("create", LEASES, "default", ""),
    ("*", "*", ALL, ""),
]


def test_access_matrix(cluster: LocalCluster, rbac_installed: None) -> None:
    wrong = []
    for user, cases, expected in (
        (OPERATOR_USER, OPERATOR_CAN, True),
        (OPERATOR_USER, OPERATOR_CANNOT, False),
        (AGENT_USER, AGENT_CAN, True),
        (AGENT_USER, AGENT_CANNOT, False),
    ):
        for verb, resource, ns, sub in cases:
            if can_i(cluster, user, verb, resource, ns, sub) is not expected:
                wrong.append(f"{user.rsplit(':', 1)[1]} {'cannot' if expected else 'can'} {verb} {resource}/{sub} {ns}")
    assert not wrong, "\n".join(wrong)


KUEUE = "kueue.x-k8s.io"
# With the optional Kueue component (manifests/components/kueue): exactly operator/gpuhealth/kube/kueue.py.
OPERATOR_KUEUE_CAN = [
    *[(v, f"workloads.{KUEUE}", ALL, "") for v in ("list", "watch")],
    ("patch", f"workloads.{KUEUE}", ALL, "status"),
    *[(v, f"admissionchecks.{KUEUE}", None, "") for v in ("list", "watch")],
    ("patch", f"admissionchecks.{KUEUE}", None, "status"),
    ("get", f"resourceflavors.{KUEUE}", None, ""),
    ("create", "events", "team-a", ""),  # a Workload's Events go into its own namespace
]
OPERATOR_KUEUE_CANNOT = [
    *[(v, f"workloads.{KUEUE}", ALL, "") for v in ("get", "create", "update", "patch", "delete")],
    ("update", f"workloads.{KUEUE}", ALL, "status"),
    *[(v, f"admissionchecks.{KUEUE}", None, "") for v in ("get", "create", "update", "patch", "delete")],
    *[(v, f"resourceflavors.{KUEUE}", None, "") for v in ("list", "watch", "patch", "delete")],
    *[(v, f"{r}.{KUEUE}", None, "") for r in ("clusterqueues", "cohorts") for v in ("get", "list", "patch")],
    *[(v, f"localqueues.{KUEUE}", ALL, "") for v in ("get", "list", "patch")],
    ("patch", f"clusterqueues.{KUEUE}", None, "status"),
    ("patch", "jobs.batch", ALL, ""),
    ("update", "events", "team-a", ""),
    ("delete", "events", "team-a", ""),
    ("get", "secrets", ALL, ""),
]


def sar(kube: Kube, user: str, verb: str, resource: str, ns: str | None, sub: str = "") -> bool:
    """A SubjectAccessReview: what the API server's authorizer answers, with no discovery involved
    (`kubectl auth can-i` cannot name a resource whose CRD is not installed)."""
    name, _, group = resource.partition(".")
    attrs: dict[str, Any] = {"verb": verb, "resource": name, "group": group}
    if sub:
        attrs["subresource"] = sub
    if ns and ns != ALL:
        attrs["namespace"] = ns
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": user, "resourceAttributes": attrs},
    }
    return bool(client.AuthorizationV1Api(kube.api).create_subject_access_review(body).status.allowed)


def test_kueue_component_access_matrix(cluster: LocalCluster, kube: Kube, rbac_installed: None) -> None:
    rbac = REPO / "manifests" / "components" / "kueue" / "operator-kueue-rbac.yaml"
    user = OPERATOR_USER
    assert not sar(kube, user, "list", f"workloads.{KUEUE}", ALL), "the base alone grants nothing in Kueue"
    cluster.apply(rbac)
    try:
        # RBAC takes effect a moment after the objects exist.
        wait_for(lambda: sar(kube, user, "list", f"workloads.{KUEUE}", ALL), what="the Kueue role in force")
        wrong = []
        for cases, expected in ((OPERATOR_KUEUE_CAN, True), (OPERATOR_KUEUE_CANNOT, False)):
            for verb, resource, ns, sub in cases:
                if sar(kube, user, verb, resource, ns, sub) is not expected:
                    wrong.append(f"operator {'cannot' if expected else 'can'} {verb} {resource}/{sub} {ns}")
        assert not wrong, "\n".join(wrong)
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "-f", str(rbac))


def test_operator_cannot_change_what_a_policy_says(
    cluster: LocalCluster, kube: Kube, rbac_installed: None, group: str, tmp_path: Path
) -> None:
    kube.apply_policy(group, policy_spec(group))
    token = service_account_token(kube, NS, "gpuhealth-operator")
    op = Kube(token_kubeconfig(cluster, token, tmp_path / "operator.kubeconfig", user="gpuhealth-operator"))

    def patch(body: dict[str, Any]) -> None:
        op.custom.patch_cluster_custom_object(
            GROUP, VERSION, "gpuhealthpolicies", group, body, _content_type="application/merge-patch+json"
        )

    def refused() -> str | None:
        try:
            patch({"spec": {"mode": "Paused"}})
        except client.ApiException as e:
            message = str(json.loads(e.body)["message"])
            return message if e.status == 403 and "gpuhealth-operator-policy-spec" in message else None
        raise AssertionError("the operator changed a policy's spec")

    msg = wait_for(refused, what="the operator's admission policy refusal")
    assert "may not change a GPUHealthPolicy's spec" in msg, msg
    assert kube.get_policy(group)["spec"]["mode"] == "Enforce"
    # Metadata (what Kopf writes: its finalizer) and the status subresource remain writable.
    patch({"metadata": {"annotations": {"gpuhealth.dev/probe": "metadata-only"}}})
    op.custom.patch_cluster_custom_object_status(
        GROUP,
        VERSION,
        "gpuhealthpolicies",
        group,
        {"status": {"nodes": 0}},
        _content_type="application/merge-patch+json",
    )
    assert kube.get_policy(group)["metadata"]["annotations"]["gpuhealth.dev/probe"] == "metadata-only"


# -- the operator under its own service account --------------------------------------------------


def test_operator_runs_a_scenario_with_only_its_service_account(
    cluster: LocalCluster,
    kube: Kube,
    operator: OperatorProcess,
    rbac_installed: None,
    group: str,
    tmp_path: Path,
) -> None:
    """XID 79 with a checkpointing workload: taint, cordon, condition, label, Events, checkpoint request
    (pod patch), eviction, drain status; a stub report and Unknown for a silent node; policy status;
    Kopf peering. All under the operator's service-account token, with no 403 anywhere."""
    reporting, silent = make_nodes(cluster, group, 2)
    kube.apply_policy(
        group, policy_spec(group, rules={"agentSilence": {"after": "5s"}}, safety={"maxUnhealthy": "100%"})
    )
    ns = group[:60]
    kube.core.create_namespace({"metadata": {"name": ns}})
    wait_for(lambda: kube.core.read_namespaced_service_account("default", ns), what="default service account")
    kube.core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "trainer", "annotations": {"gpuhealth.dev/checkpoint": "annotation"}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": reporting},
                "containers": [{"name": "c", "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            },
        },
    )
    wait_for(lambda: kube.core.read_namespaced_pod("trainer", ns).status.phase == "Running", what="workload running")

    agent = as_agent_on(cluster, kube, reporting, tmp_path)
    token = service_account_token(kube, NS, "gpuhealth-operator")
    kubeconfig = token_kubeconfig(cluster, token, tmp_path / "operator.kubeconfig", user="gpuhealth-operator")
    assert whoami(Kube(kubeconfig))["username"] == OPERATOR_USER

    log = tmp_path / "sa-operator.log"
    # One operator at a time: the session's (admin) operator steps aside for this test.
    operator.kill()
    liveness = free_port()
    sa_operator = OperatorProcess(
        cluster,
        log,
        # The Deployment's flags (liveness on loopback here), with the service account's kubeconfig.
        extra_args=[
            f"--kubeconfig={kubeconfig}",
            "--peering=gpuhealth",
            "--event-namespace=default",
            f"--liveness=http://127.0.0.1:{liveness}/healthz",
        ],
    )
    try:
        sa_operator.start()

        # The Deployment's liveness probe path answers (Kopf serves it once the operator runs).
        def healthz() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{liveness}/healthz", timeout=5) as r:
                return bool(r.status == 200)

        started = time.monotonic()
        wait_for(healthz, timeout=30, what="Kopf liveness endpoint")
        assert time.monotonic() - started < 25, "must answer well within the probe's initialDelaySeconds"
        agent.put_report(reporting, healthy_spec())
        wait_for(lambda: kube.state(reporting) == "Healthy", what="Healthy verdict")

        agent.put_report(reporting, healthy_spec(xids=[xid(79)]))
        taint = wait_for(lambda: kube.our_taint(reporting), what="gpuhealth taint")
        assert taint["value"] == "XID79"
        node = kube.node(reporting)
        assert node["spec"]["unschedulable"] is True
        cond = wait_for(
            lambda: (c := kube.condition(reporting)) and c["status"] == "False" and c, what="GPUHealthy=False"
        )
        assert cond["reason"] == "XID79"
        wait_for(lambda: kube.node_events(reporting, "Quarantined"), what="Quarantined event")
        wait_for(lambda: kube.node_events(reporting, "GPUHealthAction"), what="GPUHealthAction event")

        # The drain asks the workload to checkpoint (pod patch), waits for the acknowledgement,
        # then evicts it through the Eviction API.
        wait_for(
            lambda: (kube.core.read_namespaced_pod("trainer", ns).metadata.annotations or {}).get(
                "gpuhealth.dev/checkpoint-requested"
            ),
            what="checkpoint requested",
        )
        assert kube.state(reporting) == "Draining"
        acknowledge(ns, "trainer", kube.api)
        wait_for(lambda: kube.node_events(reporting, "Evicted"), what="Evicted event")
        wait_for(lambda: kube.state(reporting) == "Quarantined", what="quarantined after the drain")
        wait_for(
            lambda: kube.node(reporting)["metadata"]["labels"].get("gpuhealth.dev/state") == "Quarantined",
            what="state label",
        )
        wait_for(lambda: kube.node_events(reporting, "DrainComplete"), what="DrainComplete event")

        # The silent node: the operator creates the stub report and records Unknown.
        wait_for(lambda: kube.state(silent) == "Unknown", timeout=45, what="Unknown verdict for a silent node")
        wait_for(lambda: (kube.get_policy(group).get("status") or {}).get("nodes") == 2, what="policy status written")
        assert kube.get_policy(group)["metadata"].get("finalizers"), "Kopf's finalizer (operator's patch)"
        peers = json.loads(cluster.kubectl("get", f"{PEERINGS}/gpuhealth", "-o", "json").stdout).get("status")
        assert peers, "the operator's keep-alive is in the peering object"
        time.sleep(2)  # let a sweep or two run under the same credentials
    finally:
        sa_operator.stop()
        operator.start()
    text = log.read_text()
    assert not refusals(text), f"refused requests in the operator's log:\n{text[-4000:]}"
