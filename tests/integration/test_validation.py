"""Proof before return: a reset GPU is validated before it returns (spec.validation), on the real
control plane with KWOK.

An ECC fault on GPU 3 of an 8-GPU DRA node: gpuhealth holds it out, drains it, resets it (KWOK ends
the reset pod, ``devkit/kwok/pod-remediation.yaml``); the test plays the GPU and reports clean
counters. Then ONE validation Job runs for GPU 3 only, and KWOK ends its pod with the termination
message a DCGM level-2 diagnostic leaves (``devkit/kwok/pod-validation.yaml``, the JSON from
``devkit.ladder.dcgm_diag_json``): a pass returns the GPU; a failure (PCIe width on GPU 3) takes the
ladder's next step. The other seven GPUs serve throughout: only GPU 3's DeviceTaintRule exists.
"""

from __future__ import annotations

from typing import Any

from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, healthy_spec, wait_for
from devkit.ladder import validation_job_template
from tests.integration.conftest import policy_spec
from tests.integration.test_device_quarantine import device, ecc, rules_of
from tests.integration.test_remediation_ladder import NS, job_done, jobs_of, ladder, start

RULE = "gpuhealth-{node}-gpu-3"


def _validations(kube: Kube, node: str) -> list[Any]:
    return [j for j in jobs_of(kube, node) if "gpuhealth.dev/validation-level" in (j.metadata.labels or {})]


def _resets(kube: Kube, node: str) -> list[Any]:
    return [j for j in jobs_of(kube, node) if "gpuhealth.dev/validation-level" not in (j.metadata.labels or {})]


def _validation_counts(operator: OperatorProcess, result: str) -> tuple[float, float]:
    """The operator's validations with ``result`` so far, and how many validations it has timed."""
    return (
        operator.metric("gpuhealth_validations_total", {"result": result}) or 0.0,
        operator.metric("gpuhealth_validation_duration_seconds_count") or 0.0,
    )


def _validating(kube: Kube, cluster: LocalCluster, group: str, fail: bool, **remediation: Any) -> str:
    node = start(kube, cluster, group, **remediation)
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"probation": "2s", "maxUnhealthyGPUs": 8},
            remediation={"enabled": True, **remediation},
            validation={"enabled": True, "level": 2, "jobTemplate": validation_job_template(3, fail=fail)},
        ),
    )
    rule = RULE.format(node=node)
    kube.put_report(node, ecc(3))
    wait_for(lambda: list(rules_of(kube, node)) == [rule], timeout=30, what="GPU 3 held out, and only GPU 3")
    wait_for(lambda: _resets(kube, node), timeout=30, what="a reset Job")
    wait_for(lambda: job_done(_resets(kube, node)[0], "Complete"), timeout=60, what="the reset Job succeeded")
    wait_for(lambda: ladder(kube, node, 3).get("phase") == "Verifying", timeout=20, what="waiting for clean facts")
    assert not _validations(kube, node), "no validation before the facts are clean"
    kube.put_report(node, healthy_spec())  # the reset cleared the volatile counters
    (job,) = wait_for(lambda: _validations(kube, node), timeout=30, what="one validation Job")
    pod = job.spec.template.spec
    assert pod.node_name == node and job.metadata.labels["gpuhealth.dev/gpu"] == "3"
    (container,) = pod.containers
    assert container.command == ["dcgmi", "diag", "-r", "2", "-i", "3", "--json"]
    assert not (container.resources and container.resources.limits), "a validation requests no GPU"
    record = ladder(kube, node, 3)
    assert record["phase"] == "Validating" and record["validation"]["job"] == f"{NS}/{job.metadata.name}"
    assert record["validation"]["level"] == 2
    assert list(rules_of(kube, node)) == [rule], "GPU 3 still held out while it is validated; the others serve"
    return node


def test_a_passing_validation_returns_the_gpu(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    # The session's operator has validated GPUs for other modules too: this test's own count is the change.
    passed, timed = _validation_counts(operator, "Passed")
    node = _validating(kube, cluster, group, fail=False)
    wait_for(lambda: job_done(_validations(kube, node)[0], "Complete"), timeout=60, what="the diag pod ended (KWOK)")
    wait_for(lambda: RULE.format(node=node) not in rules_of(kube, node), timeout=40, what="GPU 3 back in service")
    assert device(kube, node, 3).get("state") == "InService"
    assert len(_validations(kube, node)) == 1 and len(_resets(kube, node)) == 1
    kube.await_events(
        node, "GPUReset", "ValidationPending", "ValidationStarted", "ValidationPassed", "ReturnedToService"
    )
    assert _validation_counts(operator, "Passed") == (passed + 1, timed + 1)


def test_a_failing_validation_takes_the_next_step_with_its_findings(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    steps = [{"type": "GPUReset", "attempts": 1, "timeout": "1m"}, {"type": "Replace"}]
    failed, _ = _validation_counts(operator, "Failed")
    node = _validating(kube, cluster, group, fail=True, ladders=[{"reasons": ["EccUncorrected"], "steps": steps}])
    wait_for(lambda: ladder(kube, node, 3).get("phase") == "AwaitingRepair", timeout=60, what="the ladder at Replace")
    record = ladder(kube, node, 3)
    assert [(h["step"], h["result"]) for h in record["history"]] == [("GPUReset", "ValidationFailed")]
    assert record["validation"]["result"] == "Failed"
    assert "GPU 3 pcie Fail (DCGM error 46)" in record["validation"]["findings"]
    assert "DCGM error 46" in record["message"]
    wait_for(lambda: device(kube, node, 3).get("state") == "AwaitingRepair", timeout=30, what="GPU 3 awaits a human")
    assert list(rules_of(kube, node)) == [RULE.format(node=node)]
    assert len(_validations(kube, node)) == 1
    msgs = [e.message for e in kube.await_events(node, "ValidationFailed")]
    assert any("DCGM error 46" in m for m in msgs), msgs
    assert _validation_counts(operator, "Failed")[0] == failed + 1


def test_a_failed_validation_requarantines_the_gpu_for_the_next_reset(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    steps = [{"type": "GPUReset", "attempts": 2, "timeout": "1m"}, {"type": "Replace"}]
    node = _validating(kube, cluster, group, fail=True, ladders=[{"reasons": ["EccUncorrected"], "steps": steps}])
    # Attempt 1's validation fails: the GPU goes back to Quarantined and is reset again, then validated again.
    wait_for(lambda: len(_resets(kube, node)) == 2, timeout=60, what="a second reset after the failed validation")
    kube.await_events(node, "ValidationFailed")
    wait_for(lambda: ladder(kube, node, 3).get("phase") == "AwaitingRepair", timeout=90, what="the ladder at Replace")
    record = ladder(kube, node, 3)
    assert [(h["step"], h["attempt"], h["result"]) for h in record["history"]] == [
        ("GPUReset", 1, "ValidationFailed"),
        ("GPUReset", 2, "ValidationFailed"),
    ]
    assert len(_validations(kube, node)) == 2 and len(_resets(kube, node)) == 2
    assert list(rules_of(kube, node)) == [RULE.format(node=node)]


def test_operator_killed_during_a_validation_resumes_without_a_second_job(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    node = start(kube, cluster, group)
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"probation": "2s", "maxUnhealthyGPUs": 8},
            remediation={"enabled": True},
            validation={"enabled": True, "jobTemplate": validation_job_template(3)},
        ),
    )
    kube.put_report(node, ecc(3))
    wait_for(lambda: _resets(kube, node) and job_done(_resets(kube, node)[0], "Complete"), timeout=60, what="reset")
    wait_for(lambda: ladder(kube, node, 3).get("phase") == "Verifying", timeout=20, what="waiting for clean facts")
    kube.put_report(node, healthy_spec())
    wait_for(lambda: (ladder(kube, node, 3).get("validation") or {}).get("job"), timeout=30, what="the recorded name")
    operator.kill()  # SIGKILL the instant the record names the validation Job
    recorded = ladder(kube, node, 3)["validation"]["job"]
    before = [(j.metadata.name, j.metadata.uid) for j in _validations(kube, node)]
    assert len(before) <= 1
    operator.start()
    wait_for(lambda: RULE.format(node=node) not in rules_of(kube, node), timeout=60, what="GPU 3 back in service")
    jobs = _validations(kube, node)
    assert len(jobs) == 1 and f"{NS}/{jobs[0].metadata.name}" == recorded
    if before:
        assert before == [(jobs[0].metadata.name, jobs[0].metadata.uid)], "the same Job, found again by name"
    assert device(kube, node, 3).get("state") == "InService"


def test_the_default_dcgm_job_on_kwok(cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str) -> None:
    """No template: the default Job (dcgmi through the sh wrapper, the hostengine by env) for GPU 3 only;
    KWOK's default stage leaves a DCGM pass for that GPU."""
    node = start(kube, cluster, group)
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"probation": "2s", "maxUnhealthyGPUs": 8},
            remediation={"enabled": True},
            validation={"enabled": True, "level": 1},
        ),
    )
    kube.put_report(node, ecc(3))
    wait_for(lambda: _resets(kube, node) and job_done(_resets(kube, node)[0], "Complete"), timeout=60, what="reset")
    wait_for(lambda: ladder(kube, node, 3).get("phase") == "Verifying", timeout=20, what="waiting for clean facts")
    kube.put_report(node, healthy_spec())
    (job,) = wait_for(lambda: _validations(kube, node), timeout=30, what="one validation Job")
    (container,) = job.spec.template.spec.containers
    env = {e.name: e.value for e in container.env}
    assert env["LEVEL"] == "1" and env["GPU"] == "3" and env["DCGM_HOSTENGINE"] == "nvidia-dcgm.gpu-operator.svc:5555"
    assert container.command[:2] == ["/bin/sh", "-c"] and "dcgmi diag" in container.command[2]
    assert container.termination_message_policy == "File"
    wait_for(lambda: RULE.format(node=node) not in rules_of(kube, node), timeout=60, what="GPU 3 back in service")
    kube.await_events(node, "ValidationPassed")
    reasons = [e.reason for e in kube.node_events(node)]
    assert "ValidationFailed" not in reasons, reasons
