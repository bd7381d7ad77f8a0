"""What the least-privilege tests share: the two service accounts' user names, the resources they
are checked against, ``kubectl auth can-i`` as either, a 403 and its message, and gpuhealth installed
with its admission policy in force (tests/integration/test_least_privilege.py,
tests/integration/test_agent_identity.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from devkit.cluster import LocalCluster
from devkit.k8s import (
    GPUHEALTH_NAMESPACE,
    GROUP,
    VERSION,
    Kube,
    install_gpuhealth,
    remove_gpuhealth_workloads,
    service_account_token,
    token_kubeconfig,
    wait_for,
)

NS = GPUHEALTH_NAMESPACE
OPERATOR_USER = f"system:serviceaccount:{NS}:gpuhealth-operator"
AGENT_USER = f"system:serviceaccount:{NS}:gpuhealth-agent"
VAP = "ValidatingAdmissionPolicy 'gpuhealth-agent-own-node'"
REPORTS = "gpunodehealths.gpuhealth.dev"
POLICIES = "gpuhealthpolicies.gpuhealth.dev"
PEERINGS = "clusterkopfpeerings.kopf.dev"
ALL = "*all-namespaces*"


def can_i(cluster: LocalCluster, user: str, verb: str, resource: str, ns: str | None = None, sub: str = "") -> bool:
    args = ["auth", "can-i", verb, resource, f"--as={user}"]
    if sub:
        args.append(f"--subresource={sub}")
    if ns == ALL:
        args.append("--all-namespaces")
    elif ns:
        args += ["-n", ns]
    proc = cluster.kubectl(*args, check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl {' '.join(args)}: {proc.stdout} {proc.stderr}"
    return answer == "yes"


def refusal(fn: Any, *args: Any) -> str:
    """Call ``fn``; it must be refused with 403. Returns the server's message."""
    try:
        fn(*args)
    except client.ApiException as e:
        assert e.status == 403, f"expected 403, got {e.status}: {e.body}"
        return str(json.loads(e.body)["message"])
    raise AssertionError(f"{getattr(fn, '__name__', fn)}{args[:1]} was allowed")


def agent_pod(kube: Kube, node: str) -> dict[str, Any]:
    """The gpuhealth-agent DaemonSet's pod on ``node`` (KWOK runs it)."""

    def find() -> dict[str, Any] | None:
        pods = kube.core.list_namespaced_pod(
            NS, label_selector="app.kubernetes.io/name=gpuhealth-agent", field_selector=f"spec.nodeName={node}"
        ).items
        live = [p for p in pods if p.metadata.deletion_timestamp is None]
        return kube.api.sanitize_for_serialization(live[0]) if live else None

    return wait_for(find, timeout=60, what=f"agent pod on {node}")


def as_agent_on(cluster: LocalCluster, kube: Kube, node: str, tmp_path: Path) -> Kube:
    """A client holding the token the kubelet would mount into the agent pod on ``node``."""
    token = service_account_token(kube, NS, "gpuhealth-agent", pod=agent_pod(kube, node))
    return Kube(token_kubeconfig(cluster, token, tmp_path / f"agent-{node}.kubeconfig", user=f"agent-{node}"))


def whoami(k: Kube) -> dict[str, Any]:
    review = client.AuthenticationV1Api(k.api).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    return k.api.sanitize_for_serialization(review.status.user_info)  # type: ignore[no-any-return]


@contextlib.contextmanager
def rbac_installed(cluster: LocalCluster) -> Iterator[None]:
    """gpuhealth installed from manifests/ (RBAC, the agent's admission policy, the workloads), until
    the block ends; the workloads are removed then, the RBAC kept."""
    install_gpuhealth(cluster)
    try:
        # Admission policies take effect a moment after they are created: wait until the agent's is
        # enforced (an impersonated request carries no node name, so it must be refused).
        probe = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUNodeHealth", "metadata": {"name": "vap-probe"}}
        wait_for(
            lambda: (
                "gpuhealth-agent-own-node"
                in cluster.kubectl(
                    "create", "--dry-run=server", f"--as={AGENT_USER}", "-f", "-", input=json.dumps(probe), check=False
                ).stderr
            ),
            what="the agent's admission policy in force",
        )
        yield
    finally:
        remove_gpuhealth_workloads(cluster)
