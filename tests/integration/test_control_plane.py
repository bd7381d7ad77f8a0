"""Proof that the local control plane is real: each test would fail against a fake API."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from devkit.cluster import LocalCluster
from devkit.k8s import GROUP, VERSION, Kube, wait_for
from devkit.k8s import ensure_namespace as _ns
from tests.integration.conftest import make_nodes


def _gpu_pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "tolerations": [{"operator": "Exists"}],
        },
    }


def test_scheduler_places_gpu_pod_on_fake_gpu_node(cluster: LocalCluster, kube: Kube, group: str) -> None:
    (node,) = make_nodes(cluster, group, 1)
    ns = _ns(kube, "cp-sched")
    pod = _gpu_pod("gpu-pod")
    pod["spec"]["nodeSelector"] = {"gpuhealth-test": group}
    kube.core.create_namespaced_pod(ns, pod)
    p = wait_for(
        lambda: (p := kube.core.read_namespaced_pod("gpu-pod", ns)).status.phase == "Running" and p,
        what="pod Running",
    )
    assert p.spec.node_name == node
    assert p.status.conditions and any(c.type == "PodScheduled" and c.status == "True" for c in p.status.conditions)


def test_deployment_pod_is_recreated_after_delete(cluster: LocalCluster, kube: Kube) -> None:
    ns = _ns(kube, "cp-deploy")
    dep = {
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": _gpu_pod("x")["spec"]},
        },
    }
    kube.apps.create_namespaced_deployment(ns, dep)
    first = wait_for(
        lambda: [
            p for p in kube.core.list_namespaced_pod(ns, label_selector="app=web").items if p.status.phase == "Running"
        ],
        what="first pod",
    )[0]
    kube.core.delete_namespaced_pod(first.metadata.name, ns)
    second = wait_for(
        lambda: [
            p
            for p in kube.core.list_namespaced_pod(ns, label_selector="app=web").items
            if p.metadata.uid != first.metadata.uid and p.status.phase == "Running"
        ],
        timeout=60,
        what="replacement pod",
    )[0]
    assert second.metadata.name != first.metadata.name


def test_pdb_blocks_eviction_with_429_then_allows(cluster: LocalCluster, kube: Kube) -> None:
    ns = _ns(kube, "cp-pdb")
    kube.core.create_namespaced_pod(ns, _gpu_pod("guarded", {"app": "guarded"}))
    wait_for(lambda: kube.core.read_namespaced_pod("guarded", ns).status.phase == "Running", what="pod Running")
    kube.policy.create_namespaced_pod_disruption_budget(
        ns,
        {
            "metadata": {"name": "pdb"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )
    wait_for(
        lambda: kube.policy.read_namespaced_pod_disruption_budget("pdb", ns).status.observed_generation,
        what="PDB observed by the disruption controller",
    )
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "guarded", "namespace": ns},
    }
    with pytest.raises(client.ApiException) as err:
        kube.core.create_namespaced_pod_eviction("guarded", ns, eviction)
    assert err.value.status == 429
    kube.policy.patch_namespaced_pod_disruption_budget("pdb", ns, {"spec": {"minAvailable": 0}})

    def evicted() -> bool:
        try:
            kube.core.create_namespaced_pod_eviction("guarded", ns, eviction)
            return True
        except client.ApiException as e:
            if e.status == 429:
                return False
            raise

    wait_for(evicted, what="eviction allowed once the budget allows it")


INVALID_POLICIES: list[tuple[str, dict[str, Any], str]] = [
    ("bad-mode", {"mode": "Sometimes"}, "spec.mode"),
    (
        "xid-out-of-range",
        {"rules": {"xid": {"overrides": [{"code": 5000, "action": "drain"}]}}},
        "spec.rules.xid.overrides[0].code",
    ),
    (
        "xid-bad-action",
        {"rules": {"xid": {"overrides": [{"code": 79, "action": "explode"}]}}},
        "spec.rules.xid.overrides[0].action",
    ),
    (
        "xid-duplicate",
        {"rules": {"xid": {"overrides": [{"code": 79, "action": "drain"}, {"code": 79, "action": "ignore"}]}}},
        "spec.rules.xid.overrides[1]",
    ),
    ("ecc-zero", {"rules": {"ecc": {"uncorrectedThreshold": 0}}}, "spec.rules.ecc.uncorrectedThreshold"),
    (
        "thermal-hot",
        {"rules": {"thermal": {"temperatureThresholdC": 500}}},
        "spec.rules.thermal.temperatureThresholdC",
    ),
    (
        "bad-duration",
        {"rules": {"thermal": {"sustainedFor": "five minutes"}}},
        "spec.rules.thermal.sustainedFor",
    ),
    ("silence-too-short", {"rules": {"agentSilence": {"after": "1s"}}}, "spec.rules.agentSilence.after"),
    ("breaker-percent", {"safety": {"maxUnhealthy": "150%"}}, "spec.safety.maxUnhealthy"),
    ("breaker-negative", {"safety": {"maxUnhealthy": -1}}, "spec.safety.maxUnhealthy"),
    (
        "flapping-window",
        {"safety": {"probation": "2h", "flapping": {"window": "1h"}}},
        "spec.safety.flapping.window",
    ),
    (
        "force-before-wait",
        {"actions": {"drain": {"allowForceDelete": True, "maxWait": "2h", "forceDeleteAfter": "1h"}}},
        "spec.actions.drain.forceDeleteAfter",
    ),
    ("taint-effect", {"actions": {"taintEffect": "PreferNoSchedule"}}, "spec.actions.taintEffect"),
    ("cordon-string", {"actions": {"cordon": "false"}}, "spec.actions.cordon"),
    (
        "selector-values",
        {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}},
        "spec.nodeSelector.matchExpressions[0].values",
    ),
    ("priority-range", {"priority": 100000}, "spec.priority"),
    ("device-scope", {"devices": {"scope": "Rack"}}, "spec.devices.scope"),
    ("bad-gpus-per-node", {"devices": {"maxBadGPUsPerNode": 0}}, "spec.devices.maxBadGPUsPerNode"),
    ("on-flapping", {"devices": {"onFlapping": "Cordon"}}, "spec.devices.onFlapping"),
    ("dra-driver", {"devices": {"drivers": ["Not A Driver"]}}, "spec.devices.drivers[0]"),
    ("rule-scope", {"rules": {"ecc": {"scope": "GPU"}}}, "spec.rules.ecc.scope"),
    (
        "xid-scope",
        {"rules": {"xid": {"overrides": [{"code": 48, "scope": "Rack"}]}}},
        "spec.rules.xid.overrides[0].scope",
    ),
    ("xid-override-empty", {"rules": {"xid": {"overrides": [{"code": 48}]}}}, "spec.rules.xid.overrides[0]"),
    ("gpu-budget", {"safety": {"maxUnhealthyGPUs": "120%"}}, "spec.safety.maxUnhealthyGPUs"),
    ("slow-budget", {"safety": {"maxSlow": "lots"}}, "spec.safety.maxSlow"),
    ("power-brake-repair", {"rules": {"powerBrake": {"action": "repair"}}}, "spec.rules.powerBrake.action"),
    ("power-brake-domain", {"rules": {"powerBrake": {"scope": "Domain"}}}, "spec.rules.powerBrake.scope"),
    ("slowdown-move", {"rules": {"hwSlowdown": {"moveRunningWork": "Now"}}}, "spec.rules.hwSlowdown.moveRunningWork"),
    ("rack-min-nodes", {"rules": {"powerBrake": {"rack": {"minNodes": 1}}}}, "spec.rules.powerBrake.rack.minNodes"),
    ("rack-action", {"rules": {"powerBrake": {"rack": {"action": "drain"}}}}, "spec.rules.powerBrake.rack.action"),
    ("domain-label", {"topology": {"domainLabel": "not a label"}}, "spec.topology.domainLabel"),
    ("nvlink-repair", {"rules": {"nvlink": {"action": "repair"}}}, "spec.rules.nvlink.action"),
    ("pcie-move", {"rules": {"pcie": {"moveRunningWork": "Now"}}}, "spec.rules.pcie.moveRunningWork"),
    ("fabric-broken", {"rules": {"fabric": {"brokenAction": "panic"}}}, "spec.rules.fabric.brokenAction"),
    ("fabric-scope", {"rules": {"fabric": {"scope": "Rack"}}}, "spec.rules.fabric.scope"),
    ("nic-degraded", {"rules": {"nic": {"degradedAction": "repair"}}}, "spec.rules.nic.degradedAction"),
    ("nic-symbol-rate", {"rules": {"nic": {"symbolErrorsFatalPerHour": 0}}}, "spec.rules.nic.symbolErrorsFatalPerHour"),
    ("nic-rcv-rate", {"rules": {"nic": {"portRcvErrorsPerSecond": "fast"}}}, "spec.rules.nic.portRcvErrorsPerSecond"),
    ("validation-level", {"validation": {"level": 7}}, "spec.validation.level"),
    ("validation-timeout", {"validation": {"timeout": "soon"}}, "spec.validation.timeout"),
    ("validation-concurrency", {"validation": {"maxConcurrent": 0}}, "spec.validation.maxConcurrent"),
    ("validation-batch", {"validation": {"newNodes": {"batchSize": 0}}}, "spec.validation.newNodes.batchSize"),
    ("approval", {"remediation": {"approval": "Sometimes"}}, "spec.remediation.approval"),
    (
        "repeat-repairs",
        {"remediation": {"repeatOffenders": {"maxRepairs": 0}}},
        "spec.remediation.repeatOffenders.maxRepairs",
    ),
    (
        "repeat-window",
        {"remediation": {"repeatOffenders": {"window": "soon"}}},
        "spec.remediation.repeatOffenders.window",
    ),
    (
        "repeat-window-zero",
        {"remediation": {"repeatOffenders": {"window": "0s"}}},
        "spec.remediation.repeatOffenders.window",
    ),
]

INVALID_REPORTS: list[tuple[str, dict[str, Any], str]] = [
    ("other-node", {"nodeName": "someone-else"}, "spec.nodeName"),
    ("xid-zero", {"xidEvents": [{"xid": 0, "time": "2026-01-01T00:00:00Z"}]}, "spec.xidEvents[0].xid"),
    ("gpu-index", {"devices": [{"index": 99}]}, "spec.devices[0].index"),
    (
        "negative-ecc",
        {"devices": [{"index": 0, "ecc": {"volatileUncorrected": -3}}]},
        "spec.devices[0].ecc.volatileUncorrected",
    ),
    ("bad-time", {"heartbeatTime": "yesterday"}, "spec.heartbeatTime"),
]


@pytest.mark.parametrize(("name", "spec", "field"), INVALID_POLICIES, ids=[c[0] for c in INVALID_POLICIES])
def test_invalid_policy_is_refused_naming_the_field(kube: Kube, name: str, spec: dict[str, Any], field: str) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUHealthPolicy",
        "metadata": {"name": f"invalid-{name}"},
        "spec": spec,
    }
    with pytest.raises(client.ApiException) as err:
        kube.custom.create_cluster_custom_object(GROUP, VERSION, "gpuhealthpolicies", body)
    assert err.value.status == 422
    assert field in json.loads(err.value.body)["message"], err.value.body


@pytest.mark.parametrize(("name", "spec", "field"), INVALID_REPORTS, ids=[c[0] for c in INVALID_REPORTS])
def test_invalid_report_is_refused_naming_the_field(kube: Kube, name: str, spec: dict[str, Any], field: str) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUNodeHealth",
        "metadata": {"name": f"invalid-{name}"},
        "spec": {"nodeName": f"invalid-{name}", **spec},
    }
    with pytest.raises(client.ApiException) as err:
        kube.custom.create_cluster_custom_object(GROUP, VERSION, "gpunodehealths", body)
    assert err.value.status == 422
    assert field in json.loads(err.value.body)["message"], err.value.body


def test_printer_columns(cluster: LocalCluster, kube: Kube) -> None:
    kube.apply_policy("columns", {"nodeSelector": {"matchLabels": {"nobody": "here"}}})
    out = cluster.kubectl("get", "gpuhealth").stdout.splitlines()[0].split()
    assert out == ["NAME", "MODE", "NODES", "HEALTHY", "QUARANTINED", "DRAINING", "UNKNOWN", "BREAKER", "AGE"]
    kube.put_report("columns-node", {})
    out = cluster.kubectl("get", "gpunodes").stdout.splitlines()[0].split()
    assert out == ["NAME", "STATE", "REASON", "GPUS", "HEALTHY-GPUS", "LAST-XID", "AGENT-AGE", "AGE"]
    assert cluster.kubectl("get", "ghp").returncode == 0 and cluster.kubectl("get", "gnh").returncode == 0
