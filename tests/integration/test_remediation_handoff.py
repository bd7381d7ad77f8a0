"""The remediation hand-off: a NodeHealthCheck-style remediator sees exactly the nodes gpuhealth holds.

The example manifests/remediation/nodehealthcheck.yaml is applied (strict validation) against a
minimal stand-in of medik8s NodeHealthCheck's CRD with the same shape. A remediator that follows
NodeHealthCheck's matching rules (nodes selected by spec.selector whose conditions match one of
spec.unhealthyConditions for at least its duration) must select exactly the nodes whose
GPUNodeHealth says AwaitingRepair: not the node quarantined for a drain-only fault, not the
healthy one, and not the held one once it is released.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from devkit.cluster import LocalCluster
from devkit.k8s import MANIFESTS, Kube, OperatorProcess, healthy_spec, wait_for, xid_event
from tests.integration.conftest import make_nodes, policy_spec

EXAMPLE = MANIFESTS / "remediation" / "nodehealthcheck.yaml"
GROUP, VERSION, PLURAL = "remediation.medik8s.io", "v1alpha1", "nodehealthchecks"

_SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"type": "string"},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}
_REF = {
    "type": "object",
    "required": ["apiVersion", "kind", "name"],
    "properties": {k: {"type": "string"} for k in ("apiVersion", "kind", "name", "namespace")},
}
# NodeHealthCheck's spec as medik8s defines it (the fields the example uses, same types and names).
STUB_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Cluster",
        "names": {
            "kind": "NodeHealthCheck",
            "plural": PLURAL,
            "singular": "nodehealthcheck",
            "listKind": "NodeHealthCheckList",
        },
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["selector"],
                                "properties": {
                                    "selector": _SELECTOR,
                                    "minHealthy": {"x-kubernetes-int-or-string": True},
                                    "maxUnhealthy": {"x-kubernetes-int-or-string": True},
                                    "pauseRequests": {"type": "array", "items": {"type": "string"}},
                                    "unhealthyConditions": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": ["type", "status", "duration"],
                                            "properties": {
                                                "type": {"type": "string"},
                                                "status": {"type": "string"},
                                                "duration": {
                                                    "type": "string",
                                                    "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$",
                                                },
                                            },
                                        },
                                    },
                                    "remediationTemplate": _REF,
                                },
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


def _seconds(duration: str) -> float:
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * units[u] for n, u in re.findall(r"([0-9.]+)(ns|us|µs|ms|s|m|h)", duration))


def _selector(sel: dict[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in (sel.get("matchLabels") or {}).items()]
    for e in sel.get("matchExpressions") or []:
        op = {"In": "in", "NotIn": "notin"}.get(e["operator"])
        if op:
            parts.append(f"{e['key']} {op} ({','.join(e['values'])})")
        else:
            parts.append(e["key"] if e["operator"] == "Exists" else f"!{e['key']}")
    return ",".join(parts)


def remediator_targets(kube: Kube, now: dt.datetime) -> set[str]:
    """The nodes a NodeHealthCheck-following remediator would remediate now, over every NHC object."""
    targets: set[str] = set()
    for nhc in kube.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]:
        spec = nhc["spec"]
        for node in kube.core.list_node(label_selector=_selector(spec["selector"])).items:
            for want in spec["unhealthyConditions"]:
                for c in node.status.conditions or []:
                    held = (now - c.last_transition_time).total_seconds() >= _seconds(want["duration"])
                    if c.type == want["type"] and c.status == want["status"] and held:
                        targets.add(node.metadata.name)
    return targets


def awaiting_repair(kube: Kube) -> set[str]:
    items = kube.custom.list_cluster_custom_object("gpuhealth.dev", "v1alpha1", "gpunodehealths")["items"]
    return {r["metadata"]["name"] for r in items if (r.get("status") or {}).get("state") == "AwaitingRepair"}


@pytest.fixture
def nhc_installed(cluster: LocalCluster) -> Iterator[None]:
    cluster.apply_objects([STUB_CRD])
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{PLURAL}.{GROUP}")
    cluster.kubectl("apply", "--server-side", "--validate=strict", "-f", str(EXAMPLE))
    try:
        yield
    finally:
        cluster.kubectl("delete", "crd", f"{PLURAL}.{GROUP}", "--ignore-not-found", "--wait=false")


def test_remediator_sees_exactly_the_nodes_held_for_repair(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str, nhc_installed: None
) -> None:
    held, drained, fine = make_nodes(cluster, group, 3)
    kube.apply_policy(
        group,
        policy_spec(
            group,
            rules={"xid": {"overrides": [{"code": 64, "action": "repair"}]}},
            safety={"maxUnhealthy": "100%"},
        ),
    )
    for n in (held, drained, fine):
        kube.put_report(n, healthy_spec())
    wait_for(lambda: all(kube.state(n) == "Healthy" for n in (held, drained, fine)), what="healthy")
    kube.put_report(held, healthy_spec(xids=[xid_event(64)]))
    kube.put_report(drained, healthy_spec(xids=[xid_event(79)]))
    wait_for(lambda: kube.state(held) == "AwaitingRepair", timeout=60, what="held for repair")
    wait_for(lambda: kube.state(drained) == "Quarantined", timeout=60, what="quarantined after its drain")
    cond = wait_for(lambda: (c := kube.condition(held)) and c["status"] == "False" and c, what="GPUHealthy=False")
    assert cond["reason"]

    nhc = kube.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "gpuhealth-awaiting-repair")
    delay = _seconds(nhc["spec"]["unhealthyConditions"][0]["duration"])
    # Not before the condition has held for the NodeHealthCheck's duration ...
    early = remediator_targets(kube, dt.datetime.now(dt.UTC))
    assert held not in early or delay == 0
    # ... and then exactly the nodes gpuhealth holds for repair, across the whole cluster.
    targets = wait_for(
        lambda: (t := remediator_targets(kube, dt.datetime.now(dt.UTC))) and held in t and t,
        timeout=delay + 30,
        what="the remediator selecting the held node",
    )
    assert targets == awaiting_repair(kube)
    assert drained not in targets and fine not in targets

    # Repaired and released: the node goes to probation and leaves the remediator's view at once.
    kube.core.patch_node(held, {"metadata": {"annotations": {"gpuhealth.dev/release": "now"}}})
    wait_for(lambda: kube.state(held) == "Recovering", what="released to probation")
    wait_for(lambda: held not in remediator_targets(kube, dt.datetime.now(dt.UTC)), what="out of the remediator's view")
    assert remediator_targets(kube, dt.datetime.now(dt.UTC)) == awaiting_repair(kube)
    assert json.loads(json.dumps(nhc["spec"]["selector"])) == {"matchLabels": {"gpuhealth.dev/state": "AwaitingRepair"}}
