"""The chaos control planes and the identities whose requests the API server audits."""

from __future__ import annotations

from pathlib import Path

from devkit.cluster import REPO, LocalCluster

OPERATOR_A = ("chaos-operator-a-token", "gpuhealth-chaos-operator")
OPERATOR_B = ("chaos-operator-b-token", "gpuhealth-chaos-operator-b")
AGENT = ("chaos-agent-token", "gpuhealth-chaos-agent")
LOAD = ("chaos-load-token", "gpuhealth-chaos-load")
# Not system:masters: the API server exempts that group from its in-flight limits (and APF), which
# would hide throttling. The group is bound to cluster-admin instead.
CHAOS_GROUP = "gpuhealth-chaos"
IDENTITIES = {"a": OPERATOR_A, "b": OPERATOR_B}
OPERATOR_USERS = (OPERATOR_A[1], OPERATOR_B[1])
# Without API Priority and Fairness the plain in-flight limits apply to every request.
THROTTLE_ARGS = (
    "--max-requests-inflight=5",
    "--max-mutating-requests-inflight=2",
    "--enable-priority-and-fairness=false",
)
PEERING_CRD = REPO / "manifests" / "crds" / "kopf-peering-crd.yaml"
PEERING_OBJECT = REPO / "manifests" / "base" / "peering.yaml"
FALLBACK_CRD = Path(__file__).resolve().parents[1] / "kopf-peering-crd.yaml"
FALLBACK_OBJECT = Path(__file__).resolve().parents[1] / "kopf-peering.yaml"


def start_cluster(workdir: Path, throttled: bool = False) -> LocalCluster:
    """A fresh control plane with no nodes, auditing the operator's and the agents' identities. The
    main one runs etcd with fsync, as a real one does: control_plane_crashes SIGKILLs it."""
    tokens = {tok: (user, CHAOS_GROUP) for tok, user in (OPERATOR_A, OPERATOR_B, AGENT, LOAD)}
    cluster = LocalCluster(
        workdir,
        nodes=0,
        apiserver_args=THROTTLE_ARGS if throttled else (),
        extra_tokens=tokens,
        audit_users=[OPERATOR_A[1], OPERATOR_B[1], AGENT[1]],
        etcd_fsync=not throttled,
    )
    cluster.start()
    try:
        cluster.apply_objects(
            [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": "gpuhealth-chaos-identities"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "cluster-admin",
                    },
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": CHAOS_GROUP}],
                }
            ]
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster
