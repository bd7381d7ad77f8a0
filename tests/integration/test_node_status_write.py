"""A node's first verdict is one Node write: the state label rides on the condition's write through
``nodes/status`` (``actions/nodes.py``, ``node_writes``). That rests on the API server's status
strategy for Nodes, which resets only the spec; these check it on the control plane (v1.37) through
the operator's own Kube port: the metadata lands, its resourceVersion precondition holds, and a spec
change in the same patch is dropped (why a taint or a cordon is always a write of its own)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes import client

from devkit.cluster import LocalCluster
from gpuhealth.actions.nodes import Marks, node_writes, plan_condition, plan_node
from gpuhealth.api.names import COMPONENT, CONDITION_TYPE, QUARANTINE_ANNOTATION, STATE_LABEL, TAINT_KEY, State
from gpuhealth.kube.client import Kube as OperatorKube
from gpuhealth.kube.client import is_conflict
from gpuhealth.kube.credentials import api_client
from tests.integration.conftest import make_nodes

NOW = "2026-12-04T00:00:00Z"


@pytest.fixture
def port(cluster: LocalCluster) -> OperatorKube:
    return OperatorKube(api_client(str(cluster.kubeconfig), user_agent=COMPONENT))  # as the operator's main


def _condition(node: Mapping[str, Any]) -> dict[str, str]:
    conds = (node.get("status") or {}).get("conditions") or []
    return dict(next(c for c in conds if c["type"] == CONDITION_TYPE))


def test_a_first_verdict_writes_the_label_and_the_condition_in_one_status_patch(
    cluster: LocalCluster, port: OperatorKube, group: str
) -> None:
    (name,) = make_nodes(cluster, group, 1)
    node = port.get_node(name)
    plan = plan_node(node, Marks(State.HEALTHY, quarantine=False))
    to_node, to_status = node_writes(plan.patch, plan_condition(node, State.HEALTHY, "", "", NOW))
    assert to_node is None and to_status is not None

    answer = port.patch_node_status(name, to_status)

    stored = port.get_node(name)
    assert stored["metadata"]["labels"][STATE_LABEL] == "Healthy"
    assert _condition(stored)["status"] == "True" and _condition(stored)["reason"] == "Healthy"
    # The answer is the Node as stored, for the operator's cache.
    assert answer["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    assert answer["metadata"]["labels"][STATE_LABEL] == "Healthy"
    # The kubelet's own conditions are kept: the patch merges by type.
    assert {c["type"] for c in answer["status"]["conditions"]} >= {"Ready", CONDITION_TYPE}
    # The write is the operator's by name in managedFields (its User-Agent; it sets no field manager).
    raw = client.CoreV1Api(api_client(str(cluster.kubeconfig))).read_node(name)
    assert (COMPONENT, "status") in {(m.manager, m.subresource) for m in raw.metadata.managed_fields}


def test_the_status_write_refuses_a_stale_resource_version(
    cluster: LocalCluster, port: OperatorKube, group: str
) -> None:
    (name,) = make_nodes(cluster, group, 1)
    stale = port.get_node(name)
    port.patch_node(name, {"metadata": {"annotations": {"example.com/touched": "yes"}}})  # someone else
    plan = plan_node(stale, Marks(State.DEGRADED, quarantine=False))
    _, to_status = node_writes(plan.patch, plan_condition(stale, State.DEGRADED, "Slow", "m", NOW))
    assert to_status is not None

    with pytest.raises(Exception) as refused:
        port.patch_node_status(name, to_status)

    assert is_conflict(refused.value)
    assert STATE_LABEL not in (port.get_node(name)["metadata"].get("labels") or {})


def test_a_status_write_drops_spec_so_a_taint_is_a_write_of_its_own(
    cluster: LocalCluster, port: OperatorKube, group: str
) -> None:
    name, other = make_nodes(cluster, group, 2)
    node = port.get_node(name)
    marks = Marks(State.QUARANTINED, quarantine=True, reason="XID79", since=NOW)
    plan = plan_node(node, marks)
    assert plan.patch is not None
    cond = plan_condition(node, State.QUARANTINED, "XID79", "GPU 0: XID 79", NOW)
    assert cond is not None

    # What node_writes never does: the taint sent through nodes/status is dropped by the API server,
    # while the metadata in the same patch lands.
    answer = port.patch_node_status(name, {**plan.patch, **cond})
    assert not any(t.get("key") == TAINT_KEY for t in answer["spec"].get("taints") or [])
    assert answer["metadata"]["annotations"][QUARANTINE_ANNOTATION]

    # What it does, on a node of the same kind: the plan on the Node, then the condition.
    node = port.get_node(other)
    plan = plan_node(node, marks)
    to_node, to_status = node_writes(plan.patch, plan_condition(node, State.QUARANTINED, "XID79", "m", NOW))
    assert to_node is not None and "spec" in to_node and to_status is not None
    port.patch_node(other, to_node)
    port.patch_node_status(other, to_status)
    final = port.get_node(other)
    assert any(t.get("key") == TAINT_KEY for t in final["spec"].get("taints") or [])
    assert _condition(final)["status"] == "False"
