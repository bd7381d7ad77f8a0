"""Proof before return for a whole node (spec.validation), on the real control plane with KWOK.

After a reboot hand-off: a failing reset of GPU 3 climbs to NodeReboot, the node waits
(AwaitingRepair), the test "reboots" it (clean facts) and releases it. The node then does not
return on its probation alone: ONE validation Job for all its GPUs runs while it is still tainted
and cordoned, and KWOK ends its pod with a DCGM result (``devkit/kwok/pod-validation.yaml``): a pass
returns the node, a failure (PCIe width) sends it back to AwaitingRepair with the findings.

New-node burn-in (``spec.validation.newNodes``): GPU nodes that join are held by gpuhealth's own
NoSchedule taint until their burn-in passes, at most ``batchSize`` at once.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, healthy_spec, wait_for
from devkit.ladder import OUTCOME_LABEL, reset_job_template, validation_job_template
from gpuhealth.api.names import BURN_IN_TAINT_KEY, RELEASE_ANNOTATION, TAINT_KEY
from gpuhealth.api.timeutil import parse_time
from gpuhealth.cli.changes import plan_release
from tests.integration.conftest import make_nodes, policy_spec
from tests.integration.test_device_quarantine import ecc
from tests.integration.test_remediation_ladder import NS, STATE_LABEL, jobs_of, ladder, setup_namespace, start

SCOPE = "gpuhealth.dev/validation-scope"
STEPS = [{"type": "GPUReset", "attempts": 1, "timeout": "1m"}, {"type": "NodeReboot"}, {"type": "Replace"}]


def _node_validations(kube: Kube, node: str) -> list[Any]:
    return [j for j in jobs_of(kube, node) if (j.metadata.labels or {}).get(SCOPE) == "node"]


def _nv(kube: Kube, node: str) -> dict[str, Any]:
    return dict((kube.report(node).get("status") or {}).get("nodeValidation") or {})


def _taints(kube: Kube, node: str) -> set[str]:
    return {t["key"] for t in (kube.node(node).get("spec") or {}).get("taints") or []}


def _state(kube: Kube, node: str) -> str:
    return str((kube.report(node).get("status") or {}).get("state") or "")


def _validations_total(operator: OperatorProcess, result: str) -> float:
    return operator.metric("gpuhealth_validations_total", {"result": result}) or 0.0


def _unhold(kube: Kube, job: Any) -> None:
    """Let a held validation pod end with its pass (KWOK's pass stage matches it once the label is gone)."""
    pods = wait_for(
        lambda: kube.core.list_namespaced_pod(NS, label_selector=f"job-name={job.metadata.name}").items,
        timeout=30,
        what=f"the pod of {job.metadata.name}",
    )
    for p in pods:
        kube.core.patch_namespaced_pod(p.metadata.name, NS, {"metadata": {"labels": {OUTCOME_LABEL: None}}})


def _released_after_reboot(kube: Kube, cluster: LocalCluster, group: str, **template: Any) -> str:
    """A node handed off for a reboot, 'rebooted' (clean facts) and released by a human."""
    node = start(kube, cluster, group, ladders=[{"reasons": ["EccUncorrected"], "steps": STEPS}])
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"probation": "2s", "maxUnhealthyGPUs": 8},
            remediation={
                "enabled": True,
                "ladders": [{"reasons": ["EccUncorrected"], "steps": STEPS}],
                "jobTemplate": reset_job_template(fail=True),
            },
            validation={"enabled": True, "level": 2, "jobTemplate": validation_job_template(3, **template)},
        ),
    )
    kube.put_report(node, ecc(3))
    wait_for(
        lambda: kube.node(node)["metadata"]["labels"].get(STATE_LABEL) == "AwaitingRepair",
        timeout=90,
        what="the node handed off for a reboot",
    )
    assert ladder(kube, node, 3).get("phase") == "HandedOff"
    assert not _node_validations(kube, node), "nothing validates a node before its release"
    kube.put_report(node, healthy_spec())  # rebooted: the GPU's facts are clean
    kube.core.patch_node(node, {"metadata": {"annotations": {RELEASE_ANNOTATION: "rebooted"}}})
    return node


def test_a_node_released_after_a_reboot_returns_only_after_its_validation_passes(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    passed = _validations_total(operator, "Passed")
    node = _released_after_reboot(kube, cluster, group, hold=True)
    (job,) = wait_for(lambda: _node_validations(kube, node), timeout=40, what="one node validation Job")
    pod = job.spec.template.spec
    assert pod.node_name == node
    (container,) = pod.containers
    assert container.command == ["dcgmi", "diag", "-r", "2", "-i", "0,1,2,3,4,5,6,7", "--json"], "all its GPUs"
    assert "gpuhealth.dev/gpu" not in job.metadata.labels
    nv = _nv(kube, node)
    assert nv["trigger"] == "Release" and nv["result"] == "Running" and nv["job"] == f"{NS}/{job.metadata.name}"

    # Its probation of clean facts runs out while the diagnostic runs: it still does not return.
    def probation_over() -> bool:
        since = parse_time((kube.report(node).get("status") or {}).get("healthySince"))
        return since is not None and (dt.datetime.now(dt.UTC) - since).total_seconds() > 4

    wait_for(probation_over, timeout=30, what="the probation over while the validation runs")
    assert _state(kube, node) == "Recovering" and TAINT_KEY in _taints(kube, node)
    assert kube.node(node)["spec"].get("unschedulable"), "still cordoned while it is validated"

    _unhold(kube, job)
    # Back in service is the status and the Node both: the status is written first (the write-ahead
    # record, docs/architecture.md), the taint lifted by the Node write after it, so a read between
    # the two sees Healthy and the taint (a cold make test under load did).
    wait_for(
        lambda: _state(kube, node) == "Healthy" and TAINT_KEY not in _taints(kube, node),
        timeout=60,
        what="the node back in service, its taint lifted",
    )
    assert _nv(kube, node)["result"] == "Passed"
    assert len(_node_validations(kube, node)) == 1
    kube.await_events(
        node, "Released", "ValidationPending", "ValidationStarted", "ValidationPassed", "ReturnedToService"
    )
    assert _validations_total(operator, "Passed") == passed + 1


def test_a_node_failing_its_validation_after_release_awaits_repair_with_the_findings(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    failed = _validations_total(operator, "Failed")
    node = _released_after_reboot(kube, cluster, group, fail=True)
    wait_for(lambda: _nv(kube, node).get("result") == "Failed", timeout=60, what="the node validation failed")
    wait_for(lambda: _state(kube, node) == "AwaitingRepair", timeout=30, what="the node awaits a human again")
    assert "GPU 3 pcie Fail (DCGM error 46)" in _nv(kube, node)["findings"]
    assert "DCGM error 46" in (kube.report(node).get("status") or {}).get("message", "")
    assert TAINT_KEY in _taints(kube, node) and kube.node(node)["spec"].get("unschedulable")
    assert len(_node_validations(kube, node)) == 1
    msgs = [e.message for e in kube.await_events(node, "ValidationFailed")]
    assert any("DCGM error 46" in m for m in msgs), msgs
    assert _validations_total(operator, "Failed") == failed + 1


def _burn_in_policy(kube: Kube, group: str, batch: int, **template: Any) -> None:
    setup_namespace(kube)
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"probation": "2s"},
            remediation={"enabled": True},
            validation={
                "enabled": True,
                "level": 2,
                "jobTemplate": validation_job_template(0, **template),
                "newNodes": {"enabled": True, "batchSize": batch},
            },
        ),
    )


def test_a_new_node_is_held_until_its_burn_in_passes(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    _burn_in_policy(kube, group, 2, hold=True)
    (node,) = make_nodes(cluster, group, 1)
    kube.put_report(node, healthy_spec())
    wait_for(lambda: BURN_IN_TAINT_KEY in _taints(kube, node), timeout=40, what="the new node held")
    (job,) = wait_for(lambda: _node_validations(kube, node), timeout=40, what="its burn-in Job")
    assert _nv(kube, node)["trigger"] == "BurnIn" and _nv(kube, node)["held"] is True
    assert any(t.key == BURN_IN_TAINT_KEY for t in job.spec.template.spec.tolerations)
    assert BURN_IN_TAINT_KEY in _taints(kube, node), "held while its burn-in runs"
    _unhold(kube, job)
    wait_for(lambda: BURN_IN_TAINT_KEY not in _taints(kube, node), timeout=60, what="the burn-in taint lifted")
    assert _nv(kube, node)["result"] == "Passed" and not _nv(kube, node).get("held")
    kube.await_events(node, "BurnInHeld", "BurnInPassed")


def test_a_failed_burn_in_stays_held_until_a_human_releases_it(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    _burn_in_policy(kube, group, 2, fail=True)
    (node,) = make_nodes(cluster, group, 1)
    # a foreign taint is left alone throughout
    kube.core.patch_node(node, {"spec": {"taints": [{"key": "example.com/other", "effect": "NoSchedule"}]}})
    kube.put_report(node, healthy_spec())
    wait_for(lambda: _nv(kube, node).get("result") == "Failed", timeout=60, what="the burn-in failed")
    assert BURN_IN_TAINT_KEY in _taints(kube, node) and "example.com/other" in _taints(kube, node)
    assert "DCGM error 46" in _nv(kube, node)["findings"]
    wait_for(lambda: kube.node_events(node, "BurnInFailed"), timeout=20, what="the BurnInFailed Event")
    # Healthy (nothing wrong was known when it joined) yet held: none of its GPUs is in service.
    held = kube.report(node)["status"]
    assert (held["state"], held["inServiceGPUs"]) == ("Healthy", 0), held
    # The runbook's step (BurnInFailed): `kubectl gpuhealth release NODE`, planned on what the API holds,
    # not refused and without --force.
    plan = plan_release(node, kube.report(node), kube.get_policy(group), dt.datetime.now(dt.UTC))
    assert plan.patch is not None and "lifts its burn-in taint" in "\n".join(plan.lines)
    kube.core.patch_node(node, plan.patch)
    wait_for(lambda: BURN_IN_TAINT_KEY not in _taints(kube, node), timeout=30, what="released: taint lifted")
    assert "example.com/other" in _taints(kube, node), "never a taint gpuhealth does not own"
    wait_for(
        lambda: (kube.report(node).get("status") or {}).get("inServiceGPUs") == held["totalGPUs"],
        timeout=30,
        what="its GPUs in service once released",
    )
    assert _state(kube, node) == "Healthy"
    assert len(_node_validations(kube, node)) == 1


def test_nodes_that_join_together_are_burned_in_in_bounded_batches(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    _burn_in_policy(kube, group, 2, hold=True)
    nodes = make_nodes(cluster, group, 3)
    for n in nodes:
        kube.put_report(n, healthy_spec())
    wait_for(lambda: all(BURN_IN_TAINT_KEY in _taints(kube, n) for n in nodes), timeout=60, what="all three held")

    def running() -> list[Any]:
        return [j for n in nodes for j in _node_validations(kube, n)]

    first = wait_for(lambda: running() if len(running()) == 2 else None, timeout=60, what="two burn-ins (the batch)")
    waiting = [n for n in nodes if not _node_validations(kube, n)]
    assert len(waiting) == 1
    (third,) = waiting
    wait_for(
        lambda: any("batchSize (2)" in e.message for e in kube.node_events(third, "RemediationBlocked")),
        timeout=30,
        what="the third waits for the batch",
    )
    assert _nv(kube, third)["result"] == "Pending" and len(running()) == 2
    _unhold(kube, first[0])
    (job,) = wait_for(lambda: _node_validations(kube, third), timeout=60, what="the third's burn-in after one ended")
    assert len([j for j in running() if not j.status.succeeded]) <= 2
    for j in running():
        _unhold(kube, j)
    wait_for(lambda: not any(BURN_IN_TAINT_KEY in _taints(kube, n) for n in nodes), timeout=90, what="all three passed")
    assert len(running()) == 3 and job.metadata.name in {j.metadata.name for j in running()}, "one Job per node"
