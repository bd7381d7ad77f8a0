"""Repeat offenders across repairs and human approval, on the real control plane with KWOK.

A DRA node whose GPU 3 reports an uncorrected ECC error, as in test_remediation_ladder.py (KWOK ends
the reset and validation pods; the test plays the GPU's clean counters after a reset).

- A GPU that a reset fixed and that faults again within the window goes straight to Replace: no
  second reset Job, its attempt kept by UUID in ``status.repairs``, Event ``RepeatOffender``.
- ``approval: Manual``: no Job while the reset waits in PendingApproval; ``kubectl gpuhealth approve``
  (the Node annotation) lets exactly one run, across a SIGKILL right after it was consumed; the
  validation that follows waits for an approval of its own.
- ``kubectl gpuhealth reject`` sends the waiting GPU to AwaitingRepair, and no Job runs.
"""

from __future__ import annotations

from typing import Any

from devkit import dra
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, healthy_spec, wait_for
from devkit.ladder import validation_job_template
from tests.integration.conftest import policy_spec
from tests.integration.test_cli import ok, plugin
from tests.integration.test_device_quarantine import device, ecc, rules_of
from tests.integration.test_remediation_ladder import job_done, ladder, start
from tests.integration.test_validation import _resets, _validations

RULE = "gpuhealth-{node}-gpu-3"
APPROVALS = ("gpuhealth.dev/approve", "gpuhealth.dev/approve-gpu", "gpuhealth.dev/reject", "gpuhealth.dev/reject-gpu")


def _annotations(kube: Kube, node: str) -> dict[str, str]:
    return dict((kube.node(node)["metadata"].get("annotations") or {}).items())


def _no_approval_left(kube: Kube, node: str) -> bool:
    """Neither an approve/reject annotation nor one naming its approver (gpuhealth.dev/approver*) is left."""
    return not any(k in APPROVALS or k.startswith("gpuhealth.dev/approver") for k in _annotations(kube, node))


def _repairs(kube: Kube, node: str) -> dict[str, Any]:
    return dict((kube.report(node).get("status") or {}).get("repairs") or {})


def _manual(kube: Kube, cluster: LocalCluster, group: str, **extra: Any) -> str:
    node = start(kube, cluster, group)
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"probation": "2s", "maxUnhealthyGPUs": 8},
            remediation={"enabled": True, "approval": "Manual"},
            **extra,
        ),
    )
    kube.put_report(node, ecc(3))
    wait_for(lambda: ladder(kube, node, 3).get("phase") == "PendingApproval", timeout=30, what="the reset waits")
    # The GPU is drained and held out, every other precondition holds: only the approval is missing.
    wait_for(lambda: device(kube, node, 3).get("drained") is True, timeout=30, what="GPU 3 drained")
    wait_for(lambda: any(e.reason == "ApprovalRequired" for e in kube.node_events(node)), timeout=20, what="the Event")
    assert ladder(kube, node, 3).get("phase") == "PendingApproval" and ladder(kube, node, 3)["step"] == "GPUReset"
    assert not _resets(kube, node), "no Job before a human approves"
    return node


def test_a_second_fault_within_the_window_after_a_successful_reset_goes_straight_to_replace(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    node = start(kube, cluster, group)
    rule, uuid = RULE.format(node=node), dra.report_uuid(3)
    offenders = operator.metric("gpuhealth_repeat_offenders_total") or 0.0  # the session operator's, so far
    kube.put_report(node, ecc(3))
    wait_for(lambda: _resets(kube, node) and job_done(_resets(kube, node)[0], "Complete"), timeout=60, what="reset")
    wait_for(lambda: ladder(kube, node, 3).get("phase") == "Verifying", timeout=20, what="waiting for clean facts")
    kube.put_report(node, healthy_spec())  # the reset cleared the volatile counters
    wait_for(lambda: rule not in rules_of(kube, node), timeout=40, what="GPU 3 back in service")
    wait_for(lambda: not ladder(kube, node, 3), timeout=20, what="the ladder record gone")
    (fixed,) = _repairs(kube, node)[uuid]  # the history outlives the record, by UUID
    assert (fixed["step"], fixed["result"], fixed["gpu"], fixed["reason"]) == (
        "GPUReset",
        "Succeeded",
        3,
        "EccUncorrected",
    )

    kube.put_report(node, ecc(3))  # the same GPU faults again, well within the default 168h
    wait_for(lambda: ladder(kube, node, 3).get("phase") == "AwaitingRepair", timeout=40, what="straight to Replace")
    record = ladder(kube, node, 3)
    assert record["step"] == "Replace" and "a repeat offender" in record["message"]
    assert len(_resets(kube, node)) == 1, "no second reset Job"
    wait_for(lambda: device(kube, node, 3).get("state") == "AwaitingRepair", timeout=30, what="GPU 3 awaits a human")
    assert list(rules_of(kube, node)) == [rule], "only GPU 3 held out"
    (msg,) = [e.message for e in kube.await_events(node, "RepeatOffender")]
    assert uuid in msg and "repaired 1 time(s) within 168h" in msg
    assert operator.metric("gpuhealth_repeat_offenders_total") == offenders + 1
    text = ok(plugin(cluster, "describe", node))
    assert "Repairs by GPU UUID" in text and uuid in text


def test_manual_approval_runs_no_job_until_approved_then_exactly_one(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    node = _manual(kube, cluster, group, validation={"enabled": True, "jobTemplate": validation_job_template(3)})
    out = ok(plugin(cluster, "approve", node, "--gpu", "3"))
    # The CLI records who approved, as the API server knows it (the test's admin user).
    assert "gpuhealth.dev/approver-gpu-3." in out and "GPU 3: GPUReset" in out
    # The approval is consumed by the write-ahead record (the Job's name) and announced right after
    # it (a background post: a kill before it lands would lose it, so wait for it); SIGKILL right then.
    wait_for(lambda: ladder(kube, node, 3).get("job"), timeout=30, what="the approved reset recorded")
    wait_for(lambda: kube.node_events(node, "StepApproved"), timeout=30, what="the approval announced")
    operator.kill()
    operator.start()
    wait_for(lambda: _resets(kube, node) and job_done(_resets(kube, node)[0], "Complete"), timeout=60, what="reset")
    wait_for(lambda: _no_approval_left(kube, node), timeout=30, what="the annotation removed once consumed")
    assert len(_resets(kube, node)) == 1, "one Job across the restart"
    assert len(kube.node_events(node, "StepApproved")) == 1, "the resumed pass does not announce it again"

    wait_for(lambda: ladder(kube, node, 3).get("phase") == "Verifying", timeout=20, what="waiting for clean facts")
    kube.put_report(node, healthy_spec())
    # The validation waits for an approval of its own: the reset's was used up.
    wait_for(lambda: ladder(kube, node, 3).get("phase") == "PendingApproval", timeout=30, what="validation waits")
    assert (ladder(kube, node, 3).get("validation") or {}).get("result") == "Pending"
    assert not _validations(kube, node) and RULE.format(node=node) in rules_of(kube, node)
    ok(plugin(cluster, "approve", node))  # the whole node: GPU 3's validation is all that waits
    wait_for(lambda: RULE.format(node=node) not in rules_of(kube, node), timeout=60, what="GPU 3 back in service")
    assert len(_validations(kube, node)) == 1 and len(_resets(kube, node)) == 1
    assert device(kube, node, 3).get("state") == "InService"
    wait_for(lambda: _no_approval_left(kube, node), timeout=30, what="the node-wide annotation removed")


def test_reject_sends_the_gpu_to_awaiting_repair(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    node = _manual(kube, cluster, group)
    ok(plugin(cluster, "reject", node, "--gpu", "3"))
    wait_for(lambda: ladder(kube, node, 3).get("phase") == "AwaitingRepair", timeout=30, what="the ladder at Replace")
    record = ladder(kube, node, 3)
    assert record["step"] == "Replace" and [(h["step"], h["result"]) for h in record["history"]] == [
        ("GPUReset", "Rejected")
    ]
    wait_for(lambda: device(kube, node, 3).get("state") == "AwaitingRepair", timeout=30, what="GPU 3 awaits a human")
    wait_for(lambda: _no_approval_left(kube, node), timeout=30, what="the annotation removed")
    assert not _resets(kube, node), "a rejected reset never runs"
    kube.await_events(node, "StepRejected")
    # Nothing waits any more: a second reject is refused, naming why.
    refused = plugin(cluster, "reject", node, "--gpu", "3")
    assert refused.returncode == 2 and "no step waiting for approval" in refused.stderr
