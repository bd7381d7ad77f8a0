"""The agent as a sidecar of a DCGM exporter: chart value and kustomize component, same objects,
same least privilege, and a pod spec the API server accepts under Pod Security "restricted"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from devkit.chart import by_key, helm_template, kustomize
from devkit.cluster import LocalCluster

SIDECAR = ("DaemonSet", "gpuhealth-system", "gpuhealth-dcgm-exporter")
PSA_NS = "gpuhealth-sidecar-psa"


def _sidecar_ds() -> dict[str, Any]:
    return by_key(kustomize("overlays/example-sidecar"))[SIDECAR]


def test_chart_value_and_component_render_the_same_objects() -> None:
    chart = by_key(
        helm_template("--set=agent.mode=sidecar"),
        skip_kinds=("GPUHealthPolicy", "CustomResourceDefinition", "Namespace"),  # as test_chart.py compares
    )
    overlay = by_key(kustomize("overlays/example-sidecar"), skip_kinds=("Namespace", "CustomResourceDefinition"))
    assert sorted(chart) == sorted(overlay)
    for k, obj in overlay.items():
        assert chart[k] == obj, f"{k} differs between the chart (agent.mode=sidecar) and the component"
    assert ("DaemonSet", "gpuhealth-system", "gpuhealth-agent") not in overlay


def test_sidecar_agent_is_the_base_agent_reading_the_exporter_on_localhost() -> None:
    base = by_key(kustomize("base"))[("DaemonSet", "gpuhealth-system", "gpuhealth-agent")]["spec"]["template"]["spec"]
    pod = _sidecar_ds()["spec"]["template"]["spec"]
    exporter, agent = pod["containers"]
    assert exporter["name"] == "dcgm-exporter" and agent["name"] == "agent"
    want = json.loads(json.dumps(base["containers"][0]))
    want["env"].append({"name": "GPUHEALTH_DCGM_URL", "value": "http://localhost:9400/metrics"})
    assert agent == want
    assert {p["containerPort"] for p in exporter["ports"]} == {9400}
    # Same identity, so the same RBAC and the same own-node admission policy.
    assert pod["serviceAccountName"] == base["serviceAccountName"] == "gpuhealth-agent"
    for k in ("securityContext", "nodeSelector", "tolerations", "volumes"):
        assert pod[k] == base[k], k
    assert not any(k in pod for k in ("hostPID", "hostNetwork", "hostIPC"))
    assert all(v.keys() == {"name", "emptyDir"} for v in pod["volumes"])


@pytest.fixture
def restricted_namespace(cluster: LocalCluster) -> Iterator[str]:
    cluster.apply_objects(
        [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": PSA_NS,
                    "labels": {
                        "pod-security.kubernetes.io/enforce": "restricted",
                        "pod-security.kubernetes.io/warn": "restricted",
                    },
                },
            },
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "gpuhealth-agent", "namespace": PSA_NS},
            },
        ]
    )
    try:
        yield PSA_NS
    finally:
        cluster.kubectl("delete", "namespace", PSA_NS, "--ignore-not-found", "--wait=false")


def test_sidecar_pod_is_valid_and_restricted(cluster: LocalCluster, restricted_namespace: str) -> None:
    ds = _sidecar_ds()
    ds["metadata"]["namespace"] = restricted_namespace
    out = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "--validate=strict", "-o", "json", "-f", "-", input=json.dumps(ds)
    )
    assert json.loads(out.stdout)["kind"] == "DaemonSet"
    assert "PodSecurity" not in out.stderr, out.stderr

    tmpl = ds["spec"]["template"]
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sidecar", "namespace": restricted_namespace, "labels": tmpl["metadata"]["labels"]},
        "spec": {**tmpl["spec"], "nodeName": "gpu-node-0000"},
    }
    created = cluster.kubectl("create", "--dry-run=server", "--validate=strict", "-f", "-", input=json.dumps(pod))
    assert "PodSecurity" not in created.stderr, created.stderr

    # The check bites: the exporter with the capability its profiling metrics need is refused.
    pod["spec"]["containers"][0]["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    refused = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert refused.returncode != 0 and 'violates PodSecurity "restricted' in refused.stderr
    assert "SYS_ADMIN" in refused.stderr
