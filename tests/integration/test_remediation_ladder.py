"""Repair, not only quarantine: the ladder end to end, on the real control plane with KWOK.

A DRA node whose GPU 3 (or the GPU a pod holds) reports an uncorrected ECC error: gpuhealth holds it
out with a DeviceTaintRule, drains it, and then, with ``spec.remediation.enabled``, creates a reset
Job pinned to that node for that GPU's UUID. KWOK ends the Job's pod by its stages
(``devkit/kwok/pod-remediation.yaml``: success, or failure for pods the test's template
labels ``gpuhealth-test/outcome=fail``). The test plays the GPU: once the Job succeeded it rewrites
the agent's report with clean counters, as a reset would leave them.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from devkit import dra
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, ensure_namespace, healthy_spec, holds, wait_for
from devkit.ladder import reset_job_template
from gpuhealth.api.names import RELEASE_ANNOTATION
from tests.integration.conftest import make_nodes, policy_spec
from tests.integration.test_device_quarantine import device, ecc, rules_of

NS = "gpuhealth-remediation"
STATE_LABEL = "gpuhealth.dev/state"


def setup_namespace(kube: Kube) -> None:
    ensure_namespace(kube, NS)
    try:
        kube.core.create_namespaced_service_account(NS, {"metadata": {"name": "gpuhealth-remediation"}})
    except client.ApiException as e:
        if e.status != 409:
            raise


def jobs_of(kube: Kube, node: str) -> list[Any]:
    batch = client.BatchV1Api(kube.core.api_client)
    return list(batch.list_namespaced_job(NS, label_selector=f"gpuhealth.dev/node={node}").items)


def job_done(job: Any, kind: str) -> bool:
    return any(c.type == kind and c.status == "True" for c in (job.status.conditions or []))


def ladder(kube: Kube, node: str, index: int) -> dict[str, Any]:
    return dict(((kube.report(node).get("status") or {}).get("remediation") or {}).get(str(index)) or {})


def start(kube: Kube, cluster: LocalCluster, group: str, **remediation: Any) -> str:
    (node,) = make_nodes(cluster, group, 1)
    setup_namespace(kube)
    dra.publish_device_classes(kube)
    dra.publish_slices(kube, [node], uuid=dra.report_uuid)
    kube.put_report(node, healthy_spec())
    mode = remediation.pop("mode", "Enforce")
    kube.apply_policy(
        group,
        policy_spec(
            group,
            mode=mode,
            safety={"probation": "2s", "maxUnhealthyGPUs": 8},
            remediation={"enabled": True, **remediation},
        ),
    )
    return node


def test_a_reset_returns_the_gpu_to_service_without_a_human(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    node = start(kube, cluster, group)
    rule = f"gpuhealth-{node}-gpu-3"
    kube.put_report(node, ecc(3))
    wait_for(lambda: rule in rules_of(kube, node), timeout=30, what="the GPU held out")
    (job,) = wait_for(lambda: jobs_of(kube, node), timeout=30, what="a reset Job")
    pod = job.spec.template.spec
    assert pod.node_name == node
    (container,) = pod.containers
    assert container.command == ["nvidia-smi", "-r", "-i", dra.report_uuid(3)]
    env = {e.name: e.value for e in container.env}
    assert env == {"NVIDIA_VISIBLE_DEVICES": dra.report_uuid(3), "NVIDIA_DRIVER_CAPABILITIES": "utility"}
    assert any(t.key == "gpuhealth.dev/unhealthy" for t in pod.tolerations)
    assert job.metadata.labels["gpuhealth.dev/gpu"] == "3"
    record = ladder(kube, node, 3)
    assert record["step"] == "GPUReset" and record["attempt"] == 1 and record["job"] == f"{NS}/{job.metadata.name}"
    assert device(kube, node, 3)["state"] == "Quarantined"  # drained, still held out while it resets

    wait_for(
        lambda: job_done(jobs_of(kube, node)[0], "Complete"), timeout=60, what="the reset Job succeeded (KWOK stage)"
    )
    wait_for(lambda: ladder(kube, node, 3).get("phase") == "Verifying", timeout=20, what="waiting for clean facts")
    assert rule in rules_of(kube, node), "a Job's success alone returns nothing: the facts must be clean"
    kube.put_report(node, healthy_spec())  # the reset cleared the volatile counters
    wait_for(lambda: rule not in rules_of(kube, node), timeout=40, what="the rule deleted after probation")
    assert device(kube, node, 3).get("state") == "InService"
    wait_for(lambda: not ladder(kube, node, 3), timeout=20, what="the ladder record gone")
    assert len(jobs_of(kube, node)) == 1
    kube.await_events(node, "GPUReset", "RemediationSucceeded", "ReturnedToService")
    metrics = operator.metrics()
    assert 'gpuhealth_remediations_total{result="Succeeded",step="GPUReset"}' in metrics
    assert 'gpuhealth_remediation_mttr_seconds_count{step="GPUReset"}' in metrics


def test_a_failing_reset_climbs_to_a_node_reboot_then_replace(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    steps = [{"type": "GPUReset", "attempts": 1, "timeout": "1m"}, {"type": "NodeReboot"}, {"type": "Replace"}]
    node = start(
        kube,
        cluster,
        group,
        ladders=[{"reasons": ["EccUncorrected"], "steps": steps}],
        jobTemplate=reset_job_template(fail=True),
    )
    kube.put_report(node, ecc(3))
    (job,) = wait_for(lambda: jobs_of(kube, node), timeout=30, what="a reset Job")
    assert job.spec.template.spec.node_name == node
    wait_for(lambda: job_done(jobs_of(kube, node)[0], "Failed"), timeout=60, what="the reset Job failed (KWOK)")
    # Next step: the node goes to its remediator, drained, exactly as NodeHealthCheck keys on it.
    wait_for(
        lambda: kube.node(node)["metadata"]["labels"].get(STATE_LABEL) == "AwaitingRepair",
        timeout=40,
        what="the node handed off for a reboot",
    )
    assert kube.report(node)["status"]["reason"] == "NodeRebootRequested"
    record = ladder(kube, node, 3)
    assert record["step"] == "NodeReboot" and record["phase"] == "HandedOff"
    assert [(h["step"], h["result"]) for h in record["history"]] == [("GPUReset", "Failed")]
    assert len(jobs_of(kube, node)) == 1, "one attempt, one Job"

    # The remediator "reboots" and releases the node, but the GPU still reports the error: Replace.
    kube.core.patch_node(node, {"metadata": {"annotations": {RELEASE_ANNOTATION: "rebooted"}}})
    wait_for(lambda: ladder(kube, node, 3).get("step") == "Replace", timeout=30, what="the ladder at Replace")
    wait_for(lambda: device(kube, node, 3).get("state") == "AwaitingRepair", timeout=30, what="GPU awaits a human")
    record = ladder(kube, node, 3)
    assert [(h["step"], h["result"]) for h in record["history"]] == [
        ("GPUReset", "Failed"),
        ("NodeReboot", "NotClean"),
    ]
    wait_for(lambda: kube.node_events(node, "LadderExhausted"), timeout=20, what="the LadderExhausted Event")
    assert 'gpuhealth_remediations_total{result="HandedOff",step="Replace"}' in operator.metrics()


def test_a_pod_holding_the_gpu_blocks_the_reset(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    node = start(kube, cluster, group)
    # A pod that the drain never moves (a system namespace) holds a GPU; that GPU goes bad.
    ns = "kube-system"
    tmpl = f"{group}-gpu"[:60]
    dra.create_claim_template(kube, ns, tmpl, 1)
    pod = f"{group}-holder"[:60]
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, pod, tmpl, node))
    (dev,) = dra.wait_allocated(kube, ns, pod)
    bad = int(dev.removeprefix("gpu-"))
    kube.put_report(node, ecc(bad))
    wait_for(lambda: device(kube, node, bad).get("state") == "Quarantined", timeout=30, what="drained (pod skipped)")
    msgs = wait_for(
        lambda: [e.message for e in kube.node_events(node, "RemediationBlocked")], timeout=30, what="blocked Event"
    )
    assert any(f"{ns}/{pod}" in m for m in msgs), msgs
    holds(lambda: not jobs_of(kube, node), seconds=3, what="no reset Job while a pod holds the GPU")
    kube.core.delete_namespaced_pod(pod, ns)
    (job,) = wait_for(lambda: jobs_of(kube, node), timeout=60, what="the reset Job once the pod is gone")
    assert job.metadata.labels["gpuhealth.dev/gpu"] == str(bad)


def test_operator_killed_during_a_reset_resumes_without_a_second_job(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    node = start(kube, cluster, group)
    kube.put_report(node, ecc(5))
    wait_for(lambda: ladder(kube, node, 5).get("job"), timeout=30, what="the write-ahead record")
    operator.kill()  # SIGKILL the instant the record names the Job
    record = ladder(kube, node, 5)
    before = [(j.metadata.name, j.metadata.uid) for j in jobs_of(kube, node)]
    assert len(before) <= 1
    operator.start()
    wait_for(lambda: jobs_of(kube, node) and job_done(jobs_of(kube, node)[0], "Complete"), timeout=60, what="done")
    jobs = jobs_of(kube, node)
    assert len(jobs) == 1 and f"{NS}/{jobs[0].metadata.name}" == record["job"]
    if before:
        assert before == [(jobs[0].metadata.name, jobs[0].metadata.uid)], "the same Job, found again by name"
    wait_for(lambda: ladder(kube, node, 5).get("phase") == "Verifying", timeout=20, what="the ladder resumed")
    assert ladder(kube, node, 5)["step"] == "GPUReset" and ladder(kube, node, 5)["attempt"] == 1
    kube.put_report(node, healthy_spec())
    wait_for(lambda: device(kube, node, 5).get("state") == "InService", timeout=40, what="back in service")
    assert len(jobs_of(kube, node)) == 1


def test_dry_run_announces_the_step_and_creates_no_job(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    node = start(kube, cluster, group, mode="DryRun")
    kube.put_report(node, ecc(2))
    msgs = wait_for(
        lambda: [e.message for e in kube.node_events(node, "RemediationDryRun")], timeout=30, what="DryRun Event"
    )
    assert "GPUReset" in msgs[0] and "no Job was created" in msgs[0]
    assert ladder(kube, node, 2)["phase"] == "DryRun"
    holds(lambda: not jobs_of(kube, node), seconds=3, what="no Job under DryRun")
