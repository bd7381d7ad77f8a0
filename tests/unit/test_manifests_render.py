"""The deployment manifests (manifests/) as rendered, no cluster needed: every entry point renders
without relaxing kustomize's load restrictions, the CRDs are the repository's files, the base is
hardened, RBAC is exactly what the code calls, the admission policies and overlays have the shape
they claim, the Prometheus component uses only metrics the code exports, and the Dockerfile is
multi-stage and non-root. What the API server makes of them is tests/integration/test_manifests.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from devkit.k8s import MANIFESTS
from devkit.manifests import ENTRY_POINTS, IMAGE, NS, REPO, find, render


def test_every_entry_point_renders_with_default_load_restrictions() -> None:
    for k in ENTRY_POINTS:
        assert render(k), k


def test_crds_are_the_repository_files_not_copies() -> None:
    rendered = {d["metadata"]["name"]: d for d in render("crds")}
    for f in sorted((REPO / "crds").glob("*.yaml")):
        crd = yaml.safe_load(f.read_text())
        assert rendered[crd["metadata"]["name"]] == crd, f"{f.name} differs from what kustomize renders"
    peering = rendered["clusterkopfpeerings.kopf.dev"]
    assert peering["spec"]["scope"] == "Cluster" and peering["spec"]["group"] == "kopf.dev"
    assert peering["spec"]["names"]["kind"] == "ClusterKopfPeering"
    assert "subresources" not in peering["spec"]["versions"][0], "Kopf patches status through the object itself"
    # No stray copies of the CRDs anywhere under manifests/.
    assert not [
        p for p in MANIFESTS.rglob("*.yaml") if "gpuhealth.dev" in p.read_text() and "openAPIV3Schema" in p.read_text()
    ]


def test_base_contents_and_hardening() -> None:
    docs = render("base")
    ns = find(docs, "Namespace", NS)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert find(docs, "ClusterKopfPeering", "gpuhealth")
    for sa in ("gpuhealth-operator", "gpuhealth-agent"):
        assert find(docs, "ServiceAccount", sa)["metadata"]["namespace"] == NS

    dep = find(docs, "Deployment", "gpuhealth-operator")
    ds = find(docs, "DaemonSet", "gpuhealth-agent")
    for w in (dep, ds):
        spec = w["spec"]["template"]["spec"]
        assert not any(spec.get(k) for k in ("hostPID", "hostNetwork", "hostIPC"))
        assert all("hostPath" not in v for v in spec.get("volumes") or [])
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        (c,) = spec["containers"]
        assert c["image"] == IMAGE
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"] and not sc.get("privileged")
        assert c["resources"]["requests"] and c["resources"]["limits"]
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        # The agent's XID journal lives in an emptyDir of its own (survives container restarts).
        want = {"/tmp", "/var/lib/gpuhealth-agent"} if w is ds else {"/tmp"}
        assert {m["mountPath"] for m in c["volumeMounts"]} == want
        assert all(set(v) == {"name", "emptyDir"} for v in spec.get("volumes") or [])

    op = dep["spec"]["template"]["spec"]["containers"][0]
    assert op["command"][:3] == ["gpuhealth-operator", "--peering=gpuhealth", "--liveness=http://0.0.0.0:8081/healthz"]
    assert "--event-namespace=default" in op["command"]
    assert {p["containerPort"] for p in op["ports"]} == {8080, 8081}
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "gpuhealth-operator"

    agent_spec = ds["spec"]["template"]["spec"]
    agent = agent_spec["containers"][0]
    assert agent["command"] == ["gpuhealth-agent"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["GPUHEALTH_STATE_DIR"]["value"] == "/var/lib/gpuhealth-agent"
    # The heartbeat Lease lives in the agent's own namespace, where the operator watches it.
    assert env["GPUHEALTH_LEASE_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    op_env = {e["name"]: e for e in op["env"]}
    assert op_env["GPUHEALTH_LEASE_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert [p["containerPort"] for p in agent["ports"]] == [9401]
    assert "nvidia.com/gpu" not in json.dumps(agent["resources"]), "the agent must not take GPUs from workloads"
    assert agent_spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    tolerated = {(t["key"], t["operator"]) for t in agent_spec["tolerations"]}
    assert tolerated == {("gpuhealth.dev/unhealthy", "Exists"), ("nvidia.com/gpu", "Exists")}
    assert agent_spec["serviceAccountName"] == "gpuhealth-agent"
    assert "runtimeClassName" not in agent_spec

    svcs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert svcs["gpuhealth-operator-metrics"]["spec"]["ports"][0]["port"] == 8080
    assert svcs["gpuhealth-agent-metrics"]["spec"]["ports"][0]["port"] == 9401


def _rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
        if not rule.get("resourceNames")
    }


def _expand(table: dict[tuple[str, str], str]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for (g, r), verbs in table.items() for v in verbs.split()}


OPERATOR_RULES = {
    ("", "nodes"): "get list watch patch",
    ("", "nodes/status"): "patch",
    ("", "pods"): "list watch patch delete",
    ("", "pods/eviction"): "create",
    ("gpuhealth.dev", "gpunodehealths"): "get list watch create delete",
    ("gpuhealth.dev", "gpunodehealths/status"): "patch",
    ("gpuhealth.dev", "gpuhealthpolicies"): "get list watch patch",  # Kopf's finalizer; spec: admission
    ("gpuhealth.dev", "gpuhealthpolicies/status"): "patch",
    ("kopf.dev", "clusterkopfpeerings"): "get list watch patch",
    ("resource.k8s.io", "resourceslices"): "list watch",  # controller/intake/slicewatch.py
    ("resource.k8s.io", "resourceclaims"): "list",  # which pods hold a device
    ("resource.k8s.io", "devicetaintrules"): "list create delete",  # never update: delete and recreate
}
AGENT_RULES = {("gpuhealth.dev", "gpunodehealths"): "get create patch"}


def test_rbac_is_exactly_what_the_code_uses() -> None:
    docs = render("base")
    roles = [d for d in docs if d["kind"] in ("ClusterRole", "Role")]
    for role in roles:
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(key, []), f"wildcard in {role['metadata']['name']}"
            assert "secrets" not in rule["resources"]
    assert _rules(find(docs, "ClusterRole", "gpuhealth-operator")) == _expand(OPERATOR_RULES)
    assert _rules(find(docs, "ClusterRole", "gpuhealth-agent")) == _expand(AGENT_RULES)
    events = find(docs, "Role", "gpuhealth-operator-events")
    assert events["metadata"]["namespace"] == "default"
    assert _rules(events) == {("", "events", "create")}
    # The heartbeat Leases: agents create and renew (merge patch) in their namespace; the operator
    # lists and watches them there. Nobody gets them cluster-wide, nobody may delete them.
    agent_lease = find(docs, "Role", "gpuhealth-agent-lease")
    assert agent_lease["metadata"]["namespace"] == NS
    assert _rules(agent_lease) == {("coordination.k8s.io", "leases", v) for v in ("create", "patch")}
    op_leases = find(docs, "Role", "gpuhealth-operator-leases")
    assert op_leases["metadata"]["namespace"] == NS
    assert _rules(op_leases) == {("coordination.k8s.io", "leases", v) for v in ("list", "watch")}
    bindings = [d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert {(b["roleRef"]["name"], b["subjects"][0]["name"], b["subjects"][0]["namespace"]) for b in bindings} == {
        ("gpuhealth-operator", "gpuhealth-operator", NS),
        ("gpuhealth-operator-events", "gpuhealth-operator", NS),
        ("gpuhealth-agent", "gpuhealth-agent", NS),
        ("gpuhealth-agent-lease", "gpuhealth-agent", NS),
        ("gpuhealth-operator-leases", "gpuhealth-operator", NS),
        ("gpuhealth-operator-remediation", "gpuhealth-operator", NS),
    }
    # Reset Jobs: only in their own namespace, only the verbs controller/act/remediator.py sends.
    jobs = find(docs, "Role", "gpuhealth-operator-remediation")
    assert jobs["metadata"]["namespace"] == "gpuhealth-remediation"
    assert _rules(jobs) == {("batch", "jobs", v) for v in ("create", "get", "delete")}
    rem_ns = find(docs, "Namespace", "gpuhealth-remediation")
    assert rem_ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert find(docs, "ServiceAccount", "gpuhealth-remediation")["automountServiceAccountToken"] is False
    assert all(len(b["subjects"]) == 1 for b in bindings)


KUEUE_RULES = {
    ("kueue.x-k8s.io", "workloads"): "list watch",
    ("kueue.x-k8s.io", "workloads/status"): "patch",
    ("kueue.x-k8s.io", "admissionchecks"): "list watch",
    ("kueue.x-k8s.io", "admissionchecks/status"): "patch",
    ("kueue.x-k8s.io", "resourceflavors"): "get",
    ("", "events"): "create",
}


def test_kueue_component_grants_exactly_the_kueue_calls_and_turns_the_room_on() -> None:
    docs = render("overlays/example-kueue")
    assert _rules(find(docs, "ClusterRole", "gpuhealth-operator-kueue")) == _expand(KUEUE_RULES)
    binding = find(docs, "ClusterRoleBinding", "gpuhealth-operator-kueue")
    assert binding["roleRef"]["name"] == "gpuhealth-operator-kueue"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuhealth-operator", "namespace": NS}]
    (container,) = find(docs, "Deployment", "gpuhealth-operator")["spec"]["template"]["spec"]["containers"]
    assert {"name": "GPUHEALTH_KUEUE", "value": "on"} in container["env"]
    # The base grants nothing in Kueue and leaves the room to `auto` (off without these permissions).
    base = render("base")
    assert not [d for d in base if "kueue" in d["metadata"]["name"]]
    (plain,) = find(base, "Deployment", "gpuhealth-operator")["spec"]["template"]["spec"]["containers"]
    assert "GPUHEALTH_KUEUE" not in {e["name"] for e in plain["env"]}
    # Everything else is the base's.
    assert {(d["kind"], d["metadata"]["name"]) for d in docs} - {(d["kind"], d["metadata"]["name"]) for d in base} == {
        ("ClusterRole", "gpuhealth-operator-kueue"),
        ("ClusterRoleBinding", "gpuhealth-operator-kueue"),
    }


def test_admission_policies_shape() -> None:
    docs = render("base")
    vap = find(docs, "ValidatingAdmissionPolicy", "gpuhealth-agent-own-node")
    assert vap["apiVersion"] == "admissionregistration.k8s.io/v1"
    rule, lease_rule = vap["spec"]["matchConstraints"]["resourceRules"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    assert set(rule["resources"]) == {"gpunodehealths", "gpunodehealths/status"}
    assert lease_rule["apiGroups"] == ["coordination.k8s.io"] and lease_rule["resources"] == ["leases"]
    assert set(lease_rule["operations"]) == {"CREATE", "UPDATE"}
    (cond,) = vap["spec"]["matchConditions"]
    assert "system:serviceaccount:gpuhealth-system:gpuhealth-agent" in cond["expression"]
    binding = find(docs, "ValidatingAdmissionPolicyBinding", "gpuhealth-agent-own-node")
    assert binding["spec"] == {"policyName": "gpuhealth-agent-own-node", "validationActions": ["Deny"]}

    vap = find(docs, "ValidatingAdmissionPolicy", "gpuhealth-operator-policy-spec")
    (rule,) = vap["spec"]["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["UPDATE"] and rule["resources"] == ["gpuhealthpolicies"]
    (cond,) = vap["spec"]["matchConditions"]
    assert "system:serviceaccount:gpuhealth-system:gpuhealth-operator" in cond["expression"]
    binding = find(docs, "ValidatingAdmissionPolicyBinding", "gpuhealth-operator-policy-spec")
    assert binding["spec"] == {"policyName": "gpuhealth-operator-policy-spec", "validationActions": ["Deny"]}

    # Two-person approval: any Node write that adds or changes an approval naming someone else.
    vap = find(docs, "ValidatingAdmissionPolicy", "gpuhealth-approver-identity")
    (rule,) = vap["spec"]["matchConstraints"]["resourceRules"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE"} and rule["resources"] == ["nodes"]
    assert vap["spec"]["failurePolicy"] == "Fail"
    assert "request.userInfo.username" in json.dumps(vap["spec"]["variables"])
    binding = find(docs, "ValidatingAdmissionPolicyBinding", "gpuhealth-approver-identity")
    assert binding["spec"] == {"policyName": "gpuhealth-approver-identity", "validationActions": ["Deny"]}


def test_example_overlay_changes_only_what_it_says() -> None:
    base = render("base")
    ex = render("overlays/example")
    assert sorted((d["kind"], d["metadata"]["name"]) for d in base) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in ex
    )
    dep = find(ex, "Deployment", "gpuhealth-operator")["spec"]["template"]["spec"]["containers"][0]
    assert dep["image"] == "registry.example.com/mirror/gpuhealth:0.1.0"
    assert dep["command"][-1] == "--workers=32"
    agent = find(ex, "DaemonSet", "gpuhealth-agent")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["GPUHEALTH_DCGM_URL"] == "http://nvidia-dcgm-exporter.gpu-operator.svc:9400/metrics"
    assert env["NODE_NAME"] is None  # still from the downward API
    # The optional GPU-access patch (not applied by default) is a well-formed patch of the agent.
    extra = yaml.safe_load((MANIFESTS / "overlays/example/agent-gpu-access.yaml").read_text())
    assert (extra["kind"], extra["metadata"]["name"]) == ("DaemonSet", "gpuhealth-agent")
    assert extra["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert extra["spec"]["template"]["spec"]["securityContext"]["supplementalGroups"]


def _metric_names() -> set[str]:
    from gpuhealth.agent.metrics import AgentMetrics
    from gpuhealth.controller import metrics

    names: set[str] = set()
    for registry in (metrics.REGISTRY, AgentMetrics().registry):
        for fam in registry.collect():
            names.add(fam.name)
            # Families without children yet have no samples: add the series names they will have.
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}.get(fam.type, ())
            names.update(fam.name + s for s in suffixes)
    return names


def _used_metrics(expr: str) -> set[str]:

    return set(re.findall(r"\bgpuhealth_[a-z_]+", expr))


def test_prometheus_component_uses_real_metrics() -> None:
    docs = render("components/prometheus")
    known = _metric_names()
    rule = find(docs, "PrometheusRule", "gpuhealth")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert "gpuhealth_breaker_open" in alerts["GPUHealthBreakerOpen"]["expr"]
    assert '{state="AwaitingRepair"}' in alerts["GPUHealthNodeAwaitingRepair"]["expr"]
    assert '{state="Unknown"}' in alerts["GPUHealthAgentSilent"]["expr"]
    assert alerts["GPUHealthAgentSilent"]["for"] == "10m"
    assert '{state="Draining"}' in alerts["GPUHealthDrainStuck"]["expr"]
    assert alerts["GPUHealthDrainStuck"]["for"] == "2h"
    assert 'rate(gpuhealth_faults_total{signal="XID"}[10m])' in alerts["GPUHealthXIDRate"]["expr"]
    exprs = [r["expr"] for r in alerts.values()]

    cm = find(docs, "ConfigMap", "gpuhealth-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["gpuhealth.json"])
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for p in panels:
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
        exprs += [t["expr"] for t in p["targets"]]
    used = set().union(*(_used_metrics(e) for e in exprs))
    assert used and used <= known, f"not exported by gpuhealth: {sorted(used - known)}"

    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceMonitor"}
    assert set(monitors) == {"gpuhealth-operator", "gpuhealth-agent"}
    base = render("base")
    for m in monitors.values():
        svc = [
            s
            for s in base
            if s["kind"] == "Service"
            and all(s["metadata"]["labels"].get(k) == v for k, v in m["spec"]["selector"]["matchLabels"].items())
        ]
        assert len(svc) == 1 and m["spec"]["endpoints"][0]["port"] == svc[0]["spec"]["ports"][0]["name"]


def test_dockerfile_is_multi_stage_non_root_and_wheel_only() -> None:
    text = (REPO / "Dockerfile").read_text()
    lines = text.splitlines()
    froms = [i for i, line in enumerate(lines) if line.startswith("FROM ")]
    assert len(froms) == 2 and lines[froms[0]].endswith(" AS builder")
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in text
    builder, final = "\n".join(lines[froms[0] : froms[1]]), "\n".join(lines[froms[1] :])
    assert "pip wheel" in builder
    assert "--no-index" in final and "USER 65532:65532" in final
    assert not any(tool in final for tool in ("build-essential", "gcc", "apt-get install"))
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert ignored[ignored.index("*")] == "*" and "!operator/" in ignored


# -- against the API server ----------------------------------------------------------------------
