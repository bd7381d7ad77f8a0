"""The deployment manifests (manifests/) against the real control plane (what the files say, rendered,
is tests/unit/test_manifests_render.py).

The API server accepts
the base, the example overlays and the sample policies (server-side dry run, then a real apply of the
base); Pod Security Admission admits the operator's and the agent's pods in a namespace enforcing
"restricted" and refuses a privileged one there; the agents' DaemonSet reaches quarantined GPU nodes;
the Prometheus component's rules and dashboard use only metrics the code exports.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from devkit.cluster import LocalCluster
from devkit.k8s import (
    MANIFESTS,
    install_gpuhealth,
    remove_gpuhealth_workloads,
    wait_for,
)
from devkit.manifests import NS, find, pod_from_template, render
from tests.integration.conftest import make_nodes


@pytest.fixture(scope="module")
def installed(cluster: LocalCluster) -> Iterator[subprocess.CompletedProcess[str]]:
    proc = install_gpuhealth(cluster)
    try:
        yield proc
    finally:
        remove_gpuhealth_workloads(cluster)


# -- rendering (no cluster needed) ---------------------------------------------------------------


def test_server_side_dry_run_and_apply(cluster: LocalCluster, installed: subprocess.CompletedProcess[str]) -> None:
    for k in ("base", "overlays/example"):
        proc = cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "--dry-run=server", "-k", str(MANIFESTS / k)
        )
        assert "PodSecurity" not in proc.stderr, proc.stderr
    # The real apply (fixture) went through without Pod Security warnings either.
    assert "PodSecurity" not in installed.stderr, installed.stderr
    for obj in (
        "namespace/gpuhealth-system",
        "clusterkopfpeering.kopf.dev/gpuhealth",
        "validatingadmissionpolicy/gpuhealth-agent-own-node",
        "validatingadmissionpolicybinding/gpuhealth-agent-own-node",
        "validatingadmissionpolicy/gpuhealth-operator-policy-spec",
        "validatingadmissionpolicybinding/gpuhealth-operator-policy-spec",
        "validatingadmissionpolicy/gpuhealth-approver-identity",
        "validatingadmissionpolicybinding/gpuhealth-approver-identity",
        "clusterrole/gpuhealth-operator",
        "clusterrole/gpuhealth-agent",
        "role/gpuhealth-operator-events",
    ):
        ns_args = ["-n", "default"] if obj.startswith("role/") else []
        cluster.kubectl("get", obj, *ns_args)
    cluster.kubectl(
        "get",
        "-n",
        NS,
        "deployment/gpuhealth-operator",
        "daemonset/gpuhealth-agent",
        "service/gpuhealth-operator-metrics",
        "service/gpuhealth-agent-metrics",
    )


def test_pod_security_restricted_admits_ours_refuses_privileged(
    cluster: LocalCluster, installed: subprocess.CompletedProcess[str]
) -> None:
    labels = json.loads(cluster.kubectl("get", "namespace", NS, "-o", "json").stdout)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    docs = render("base")
    for kind, name in (("Deployment", "gpuhealth-operator"), ("DaemonSet", "gpuhealth-agent")):
        pod = pod_from_template(find(docs, kind, name), f"psa-{name}")
        proc = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod))
        assert "PodSecurity" not in proc.stderr, proc.stderr

    privileged = pod_from_template(find(docs, "Deployment", "gpuhealth-operator"), "psa-privileged")
    c = privileged["spec"]["containers"][0]
    c["securityContext"] = {"privileged": True}
    proc = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(privileged), check=False)
    assert proc.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in proc.stderr and "privileged" in proc.stderr

    as_root = pod_from_template(find(docs, "DaemonSet", "gpuhealth-agent"), "psa-root")
    as_root["spec"]["securityContext"] = {"runAsUser": 0}
    as_root["spec"]["hostPID"] = True
    proc = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(as_root), check=False)
    assert proc.returncode != 0 and "violates PodSecurity" in proc.stderr
    assert "host namespaces" in proc.stderr and "runAsUser=0" in proc.stderr


def test_workloads_are_admitted_and_agents_reach_quarantined_gpu_nodes(
    cluster: LocalCluster, installed: subprocess.CompletedProcess[str], group: str
) -> None:
    healthy, quarantined = make_nodes(cluster, group, 2)
    cluster.kubectl(
        "taint", "node", quarantined, "gpuhealth.dev/unhealthy=XID79:NoExecute", "nvidia.com/gpu=present:NoSchedule"
    )
    cluster.kubectl("cordon", quarantined)

    def agent_nodes() -> set[str]:
        out = cluster.kubectl(
            "get",
            "pods",
            "-n",
            NS,
            "-l",
            "app.kubernetes.io/name=gpuhealth-agent",
            "-o",
            "jsonpath={range .items[?(@.status.phase=='Running')]}{.spec.nodeName}{'\\n'}{end}",
        ).stdout
        return set(out.split())

    wait_for(lambda: {healthy, quarantined} <= agent_nodes(), timeout=60, what="agent pods on both GPU nodes")
    wait_for(
        lambda: cluster.kubectl(
            "get", "pods", "-n", NS, "-l", "app.kubernetes.io/name=gpuhealth-operator", "-o", "name"
        ).stdout.strip(),
        timeout=60,
        what="the operator pod (admitted under restricted)",
    )
    rs_events = cluster.kubectl("get", "events", "-n", NS, "--field-selector", "reason=FailedCreate", "-o", "name")
    assert not rs_events.stdout.strip(), "a controller failed to create a gpuhealth pod (Pod Security?)"


def test_sample_policies_are_valid_and_parse(cluster: LocalCluster) -> None:
    from gpuhealth.api.policy import parse_policy

    samples = sorted((MANIFESTS / "samples").glob("*.yaml"))
    assert {p.name for p in samples} >= {"training-fleet.yaml", "inference-fleet.yaml"}
    for path in samples:
        proc = cluster.kubectl("create", "--dry-run=server", "--validate=strict", "-o", "json", "-f", str(path))
        obj = json.loads(proc.stdout)
        assert obj["kind"] == "GPUHealthPolicy"
        policy = parse_policy(obj)  # what the operator will make of it, after the server's defaults
        assert policy.name == obj["metadata"]["name"]


STUB_CRDS = [
    {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": plural[:-1], "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                        }
                    },
                }
            ],
        },
    }
    for kind, plural in (("ServiceMonitor", "servicemonitors"), ("PrometheusRule", "prometheusrules"))
]


def test_prometheus_component_applies_with_monitoring_crds(
    cluster: LocalCluster, installed: subprocess.CompletedProcess[str]
) -> None:
    """Minimal stand-ins for the Prometheus Operator's CRDs (test fixtures only), then a dry run."""
    cluster.apply_objects(STUB_CRDS)
    try:
        cluster.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        )
        out = cluster.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--dry-run=server",
            "-o",
            "name",
            "-k",
            str(MANIFESTS / "overlays/example-monitoring"),
        ).stdout
        for name in (
            "servicemonitor.monitoring.coreos.com/gpuhealth-operator",
            "servicemonitor.monitoring.coreos.com/gpuhealth-agent",
            "prometheusrule.monitoring.coreos.com/gpuhealth",
            "configmap/gpuhealth-grafana-dashboard",
        ):
            assert name in out
    finally:
        cluster.kubectl(
            "delete",
            "crd",
            "servicemonitors.monitoring.coreos.com",
            "prometheusrules.monitoring.coreos.com",
            "--ignore-not-found",
            "--wait=false",
        )
