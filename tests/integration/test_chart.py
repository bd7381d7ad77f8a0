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
