"""The Helm chart (charts/gpuhealth): lint, one source of truth with manifests/, and a real install.

Rendering tests need no cluster: `helm template` with default values must give exactly the objects
of `kubectl kustomize manifests/base` (the chart's CRDs are the repository's CRD files; the chart
adds only its first policy, and leaves the namespace to the installer), and with monitoring on,
exactly the Prometheus component's objects. Install tests put the chart on the local control plane
with the real `helm` and check the operator and agents run from the installed objects as far as
KWOK allows (pods scheduled and Running), then uninstall it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devkit.chart import CHART, by_key, helm_template, kustomize
from devkit.tools import run

MONITORING = (
    "--set=metrics.serviceMonitor.enabled=true",
    "--set=metrics.prometheusRule.enabled=true",
    "--set=metrics.dashboard.enabled=true",
)


def test_helm_lint() -> None:
    out = run("helm", "lint", "--strict", str(CHART))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


def test_default_values_render_manifests_base() -> None:
    rendered = helm_template(crds=True)
    chart = by_key(rendered, skip_kinds=("GPUHealthPolicy", "Namespace"))
    base = by_key(kustomize("base"), skip_kinds=("Namespace",))
    assert sorted(chart) == sorted(base)
    # Helm creates the release's namespace; the reset Jobs' own (privileged) one it renders itself.
    (ns,) = [o for o in rendered if o["kind"] == "Namespace"]
    assert ns["metadata"]["name"] == "gpuhealth-remediation"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for k, obj in base.items():
        if k[0] == "CustomResourceDefinition":
            # Helm installs crds/ verbatim (no templating), so without kustomize's part-of label.
            obj = {**obj, "metadata": {"name": obj["metadata"]["name"]}}
        assert chart[k] == obj, f"{k} differs between the chart and manifests/base"


def test_monitoring_values_render_the_prometheus_component() -> None:
    chart = by_key(helm_template(*MONITORING), skip_kinds=("GPUHealthPolicy",))
    component = by_key(kustomize("components/prometheus"))
    assert {k[0] for k in component} == {"ServiceMonitor", "PrometheusRule", "ConfigMap"}
    for k, obj in component.items():
        assert k in chart, f"the chart does not render {k}"
        assert chart[k] == obj, f"{k} differs between the chart and the Prometheus component"
    monitored = by_key(helm_template(*MONITORING, "--set=metrics.additionalLabels.release=kps"))
    assert monitored[("PrometheusRule", "gpuhealth-system", "gpuhealth")]["metadata"]["labels"]["release"] == "kps"


def test_kueue_values_render_the_kueue_overlay() -> None:
    chart = by_key(helm_template("--set=kueue.enabled=true", crds=True), skip_kinds=("GPUHealthPolicy", "Namespace"))
    overlay = by_key(kustomize("overlays/example-kueue"), skip_kinds=("Namespace",))
    assert sorted(chart) == sorted(overlay)
    for k, obj in overlay.items():
        if k[0] == "CustomResourceDefinition":
            obj = {**obj, "metadata": {"name": obj["metadata"]["name"]}}
        assert chart[k] == obj, f"{k} differs between the chart (kueue.enabled) and manifests/overlays/example-kueue"


def test_kueue_gpu_resources_reach_the_operator() -> None:
    """kueue.gpuResources: the quota names that count GPUs (--gpu-resources), for DRA claims that
    Kueue accounts under a deviceClassMappings name; unset, the operator keeps its default."""
    chart = by_key(
        helm_template("--set=kueue.enabled=true", "--set=kueue.gpuResources={nvidia.com/gpu,example.com/gpu}")
    )
    (container,) = chart[("Deployment", "gpuhealth-system", "gpuhealth-operator")]["spec"]["template"]["spec"][
        "containers"
    ]
    assert {"name": "GPUHEALTH_GPU_RESOURCES", "value": "nvidia.com/gpu,example.com/gpu"} in container["env"]
    plain = by_key(helm_template("--set=kueue.enabled=true"))
    (default,) = plain[("Deployment", "gpuhealth-system", "gpuhealth-operator")]["spec"]["template"]["spec"][
        "containers"
    ]
    assert "GPUHEALTH_GPU_RESOURCES" not in {e["name"] for e in default["env"]}


def test_first_policy_is_dry_run_and_values_reach_the_objects() -> None:
    default = by_key(helm_template())
    policy = default[("GPUHealthPolicy", "", "default")]
    assert policy["spec"]["mode"] == "DryRun"
    objs = by_key(
        helm_template(
            "--namespace=gpu-health",
            "--set=image.repository=registry.example.com/gpuhealth,image.tag=9.9.9",
            "--set=operator.replicas=1,operator.peering.enabled=false,operator.workers=32",
            "--set=agent.dcgmExporterUrl=http://nvidia-dcgm-exporter.gpu-operator.svc:9400/metrics",
            "--set=agent.nodeSelector.pool=h100,agent.runtimeClassName=nvidia,agent.supplementalGroups={44}",
            "--set=policy.spec.mode=Enforce,operator.eventNamespace=gpu-events",
            namespace="gpu-health",
        )
    )
    op = objs[("Deployment", "gpu-health", "gpuhealth-operator")]
    c = op["spec"]["template"]["spec"]["containers"][0]
    assert op["spec"]["replicas"] == 1 and c["image"] == "registry.example.com/gpuhealth:9.9.9"
    assert "--workers=32" in c["command"] and "--event-namespace=gpu-events" in c["command"]
    assert not any(a.startswith("--peering") for a in c["command"])
    assert not any(k[0] == "ClusterKopfPeering" for k in objs)
    ds = objs[("DaemonSet", "gpu-health", "gpuhealth-agent")]["spec"]["template"]["spec"]
    assert ds["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "h100"}
    assert ds["runtimeClassName"] == "nvidia" and ds["securityContext"]["supplementalGroups"] == [44]
    env = {e["name"]: e.get("value") for e in ds["containers"][0]["env"]}
    assert env["GPUHEALTH_DCGM_URL"] == "http://nvidia-dcgm-exporter.gpu-operator.svc:9400/metrics"
    assert objs[("Role", "gpu-events", "gpuhealth-operator-events")]
    assert objs[("GPUHealthPolicy", "", "default")]["spec"]["mode"] == "Enforce"
    # The admission policies name the service accounts of the release's namespace.
    vap = objs[("ValidatingAdmissionPolicy", "", "gpuhealth-agent-own-node")]
    assert "system:serviceaccount:gpu-health:gpuhealth-agent" in json.dumps(vap["spec"]["matchConditions"])
    crb = objs[("ClusterRoleBinding", "", "gpuhealth-agent")]
    assert crb["subjects"][0]["namespace"] == "gpu-health"


def test_chart_crds_are_the_repository_files() -> None:
    for f in (CHART / "crds").iterdir():
        assert f.is_symlink(), f"{f} must link to the repository's CRD file, not copy it"
        assert f.resolve().is_file()
    assert {Path(f).resolve().name for f in (CHART / "crds").iterdir()} == {
        "gpuhealthpolicies.yaml",
        "gpunodehealths.yaml",
        "kopf-peering-crd.yaml",
    }


def _agent_pod(*values: str, workload: tuple[str, str] = ("DaemonSet", "gpuhealth-agent")) -> dict[str, Any]:
    objs = by_key(helm_template(*values))
    spec: dict[str, Any] = objs[(workload[0], "gpuhealth-system", workload[1])]["spec"]["template"]["spec"]
    return spec


def _agent_container(pod: dict[str, Any]) -> dict[str, Any]:
    (agent,) = [c for c in pod["containers"] if c["name"] == "agent"]
    return dict(agent)


def test_pod_resources_are_off_by_default_and_the_agent_stays_restricted() -> None:
    pod = _agent_pod()
    agent = _agent_container(pod)
    assert not [v for v in pod["volumes"] if "hostPath" in v]
    assert "GPUHEALTH_POD_RESOURCES_SOCKET" not in {e["name"] for e in agent["env"]}
    assert agent["securityContext"]["runAsNonRoot"] is True and "runAsUser" not in agent["securityContext"]


@pytest.mark.parametrize(
    "workload", [("DaemonSet", "gpuhealth-agent"), ("DaemonSet", "gpuhealth-dcgm-exporter")], ids=["own", "sidecar"]
)
def test_pod_resources_mount_the_kubelet_s_socket_read_only_and_run_the_agent_as_root_without_capabilities(
    workload: tuple[str, str],
) -> None:
    mode = ["--set=agent.mode=sidecar"] if workload[1] == "gpuhealth-dcgm-exporter" else []
    pod = _agent_pod("--set=agent.podResources.enabled=true", *mode, workload=workload)
    agent = _agent_container(pod)
    # One host path, the socket's directory, read-only; nothing else of the host.
    host = [v for v in pod["volumes"] if "hostPath" in v]
    assert host == [
        {"name": "pod-resources", "hostPath": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}}
    ]
    mounts = [m for m in agent["volumeMounts"] if m["name"] == "pod-resources"]
    assert mounts == [{"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["GPUHEALTH_POD_RESOURCES_SOCKET"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert env["GPUHEALTH_POD_RESOURCES_TIMEOUT"] == "3"
    # uid 0 (the socket's owner) and nothing more: no capability, no escalation, no privileged mode.
    ctx = agent["securityContext"]
    assert ctx == {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert not {"hostPID", "hostNetwork", "hostIPC"} & set(pod)
    # The other containers keep the pod's non-root user.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert all(c["securityContext"].get("runAsNonRoot", True) for c in pod["containers"] if c["name"] != "agent")


def test_pod_resources_follow_the_kubelet_s_root_dir_and_timeout() -> None:
    pod = _agent_pod(
        "--set=agent.podResources.enabled=true",
        "--set=agent.podResources.hostPath=/data/kubelet/pod-resources",
        "--set=agent.podResources.timeoutSeconds=7",
    )
    (volume,) = [v for v in pod["volumes"] if v["name"] == "pod-resources"]
    assert volume["hostPath"]["path"] == "/data/kubelet/pod-resources"
    env = {e["name"]: e.get("value") for e in _agent_container(pod)["env"]}
    assert env["GPUHEALTH_POD_RESOURCES_TIMEOUT"] == "7"
