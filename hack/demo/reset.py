"""The repair story (issue #24): a GPU back by itself after a reset. A DRA node with 8 full GPUs and
two serving pods; an uncorrected ECC error on the GPU one of them holds. gpuhealth holds the GPU out
(DeviceTaintRule), drains its pod (checkpoint, evict; the replacement lands on another GPU of the
node), then climbs the policy's repair ladder (``spec.remediation``): a reset Job pinned to the node
for that GPU's UUID. KWOK ends the Job's pod as succeeded (devkit/kwok/pod-remediation.yaml);
the demo then plays the GPU after ``nvidia-smi -r``: it rewrites the node's fake NVML scenario so the
volatile counters are clean. Then ONE validation Job (``spec.validation``: the default DCGM level-2
diagnostic for that GPU; KWOK's stage leaves a DCGM pass in its termination message) must pass
before the GPU returns. After the policy's probation the rule is deleted and the GPU serves.
"""

from __future__ import annotations

import time
from typing import Any

from devkit import dra
from devkit.agents import Agent
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, ensure_namespace, wait_for
from hack.demo.common import (
    REMEDIATION_NS,
    Timeline,
    allocated,
    claim_deployment,
    devices_of,
    gpuhealth_rules,
    pods_of,
    running,
)
from hack.demo.devicewatch import DeviceWatch

APP = "reset-serving"
GPUS = 8


def configure_agent(agent: Agent) -> None:
    """The node's own GPU UUIDs (the fake NVML's are the same on every node; DRA pools must differ)."""
    agent.lines += [f"gpu {i} uuid {dra.node_uuid(agent.node, i)}" for i in range(GPUS)]
    agent.write()


def setup(cluster: LocalCluster, kube: Kube, node: str, timeline: Timeline) -> tuple[str, int]:
    """Slices, the reset Jobs' namespace, two serving pods; returns the pod whose GPU will fail, and it."""
    want = {dra.node_uuid(node, i) for i in range(GPUS)}
    wait_for(
        lambda: {d.get("uuid") for d in (kube.report(node).get("spec") or {}).get("devices") or []} == want,
        timeout=30,
        what=f"{node}'s agent reporting the node's GPU UUIDs",
    )
    dra.publish_slices(kube, [node], uuid=lambda i: dra.node_uuid(node, i))
    ensure_namespace(kube, REMEDIATION_NS)
    cluster.apply_objects(
        [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "gpuhealth-remediation", "namespace": REMEDIATION_NS},
            },
            claim_deployment(APP, "one-gpu", node, 2),
        ]
    )
    held = wait_for(
        lambda: (
            (h := {p.metadata.name: allocated(kube, p) for p in running(kube, APP)})
            and len(h) == 2
            and all(h.values())
            and h
        ),
        timeout=90,
        what="two reset-serving pods running with a GPU each",
    )
    pod = sorted(held)[0]
    bad = int(held[pod][0].removeprefix("gpu-"))
    timeline.add(f"{node}: DRA node; 2 serving pods, {pod} on GPU {bad}; policy remediation enabled")
    return pod, bad


def inject(agent: Agent, bad: int, timeline: Timeline) -> float:
    at = time.time()
    agent.lines += [f"gpu {bad} ecc_volatile_uncorrected 1", f"gpu {bad} ecc_aggregate_uncorrected 1"]
    agent.write()
    timeline.add(f"{agent.node}: fault injected: uncorrected ECC error on GPU {bad} (a reset clears it)", at)
    return at


VALIDATION_LABEL = "gpuhealth.dev/validation-level"


def reset_jobs(kube: Kube, node: str) -> list[Any]:
    jobs = kube.batch.list_namespaced_job(REMEDIATION_NS, label_selector=f"gpuhealth.dev/node={node}").items
    return [j for j in jobs if VALIDATION_LABEL not in (j.metadata.labels or {})]


def validation_jobs(kube: Kube, node: str) -> list[Any]:
    return list(
        kube.batch.list_namespaced_job(
            REMEDIATION_NS, label_selector=f"gpuhealth.dev/node={node},{VALIDATION_LABEL}"
        ).items
    )


def succeeded(job: Any) -> bool:
    return any(c.type == "Complete" and c.status == "True" for c in job.status.conditions or [])


def verify(
    kube: Kube, agent: Agent, pod: str, bad: int, injected: float, watch: DeviceWatch, timeline: Timeline
) -> dict[str, Any]:
    node = agent.node
    rule = f"gpuhealth-{node}-gpu-{bad}"

    def rules() -> set[str]:
        return {r["metadata"]["name"] for r in gpuhealth_rules(kube)}

    wait_for(lambda: rule in rules(), timeout=60, what=f"GPU {bad} of {node} held out by {rule}")
    wait_for(lambda: pod not in {p.metadata.name for p in pods_of(kube, APP)}, timeout=60, what=f"{pod} evicted")
    moved = wait_for(
        lambda: (
            (r := [p for p in running(kube, APP) if p.metadata.name != pod])
            and len(r) == 2
            and all(allocated(kube, p) for p in r)
            and r
        ),
        timeout=60,
        what="the replacement serving pod running",
    )
    devs = sorted(d for p in moved for d in allocated(kube, p))
    assert f"gpu-{bad}" not in devs, f"a serving pod got the held-out gpu-{bad}: {devs}"
    timeline.add(f"{node}: {APP} serves on {', '.join(devs)}; the replacement kept off gpu-{bad}")
    (job,) = wait_for(lambda: reset_jobs(kube, node), timeout=60, what=f"a reset Job for GPU {bad}")
    cmd = job.spec.template.spec.containers[0].command
    assert cmd == ["nvidia-smi", "-r", "-i", dra.node_uuid(node, bad)], f"the reset Job runs {cmd}"
    assert job.spec.template.spec.node_name == node, f"the reset Job is not pinned to {node}"
    wait_for(lambda: succeeded(reset_jobs(kube, node)[0]), timeout=60, what="the reset Job succeeded (KWOK stage)")

    def phase() -> str:
        rec = ((kube.report(node).get("status") or {}).get("remediation") or {}).get(str(bad)) or {}
        return str(rec.get("phase", ""))

    wait_for(lambda: phase() == "Verifying", timeout=30, what="the ladder waiting for clean facts")
    assert rule in rules(), "a Job's success alone must not return the GPU: its facts must be clean"
    agent.set(f"gpu {bad} ecc_volatile_uncorrected 0")  # what nvidia-smi -r leaves: volatile counters cleared
    timeline.add(f"{node}: GPU {bad} reset: the fake NVML now reports clean volatile ECC counters (aggregate stays)")
    (vjob,) = wait_for(lambda: validation_jobs(kube, node), timeout=60, what=f"one validation Job for GPU {bad}")
    assert (vjob.metadata.labels or {}).get("gpuhealth.dev/gpu") == str(bad), "the validation is for another GPU"
    assert rule in rules(), "clean facts alone must not return the GPU while validation is enabled"

    def ladder() -> dict[str, Any]:
        return dict(((kube.report(node).get("status") or {}).get("remediation") or {}).get(str(bad)) or {})

    # The ladder's history is written when the validation passes, and the record goes when the GPU
    # returns, one probation later: read it in that window from this node's report alone (the timeline's
    # poller reads every node and, on a loaded machine, can miss a 10 s window).
    last: dict[str, Any] = {}

    def passed() -> dict[str, Any] | None:
        last["record"] = r = ladder()
        return r if r.get("phase") == "Succeeded" else None

    try:
        done = wait_for(
            passed,
            timeout=90,
            interval=0.1,
            what=f"GPU {bad}'s ladder Succeeded (validation passed), before its probation ends",
        )
    except AssertionError as e:  # say where the ladder stood and how its validation Jobs ended
        jobs = [
            (j.metadata.name, [(c.type, c.status, c.reason) for c in j.status.conditions or []])
            for j in validation_jobs(kube, node)
        ]
        raise AssertionError(
            f"{e}; the ladder's record as last read: {last.get('record')}; validation Jobs: {jobs}"
        ) from None
    wait_for(
        lambda: devices_of(kube, node).get(bad, {}).get("state") == "InService" and rule not in rules(),
        timeout=90,
        what=f"GPU {bad} back in service after probation, its DeviceTaintRule deleted",
    )
    wait_for(lambda: (node, bad) in watch.in_service_at, timeout=5, what="the timeline seeing it back")
    back = watch.in_service_at[(node, bad)]
    timeline.add(f"{node}: GPU {bad} back in service, without a human: {back - injected:.1f}s after the fault", back)
    return {"mttr_s": round(back - injected, 1), "reset_ladder": done}


def validations(kube: Kube) -> list[dict[str, Any]]:
    """From the cluster: each validation Job, the GPU it was for and how it ended."""
    jobs = kube.batch.list_namespaced_job(REMEDIATION_NS, label_selector=VALIDATION_LABEL)
    return [
        {
            "node": (j.metadata.labels or {}).get("gpuhealth.dev/node"),
            "gpu": int((j.metadata.labels or {}).get("gpuhealth.dev/gpu", -1)),
            "level": int((j.metadata.labels or {}).get(VALIDATION_LABEL, 0)),
            "job": f"{REMEDIATION_NS}/{j.metadata.name}",
            "result": "Passed" if succeeded(j) else "NotPassed",
        }
        for j in jobs.items
    ]


def gpus_reset(kube: Kube) -> list[dict[str, Any]]:
    """From the cluster: the reset Jobs that succeeded, and the GPU each was for."""
    jobs = kube.batch.list_namespaced_job(REMEDIATION_NS, label_selector="app.kubernetes.io/managed-by=gpuhealth")
    return [
        {
            "node": (j.metadata.labels or {}).get("gpuhealth.dev/node"),
            "gpu": int((j.metadata.labels or {}).get("gpuhealth.dev/gpu", -1)),
            "job": f"{REMEDIATION_NS}/{j.metadata.name}",
        }
        for j in jobs.items
        if succeeded(j) and VALIDATION_LABEL not in (j.metadata.labels or {})
    ]
