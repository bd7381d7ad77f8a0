"""How long a repair waits on gpuhealth itself, on the real control plane with KWOK.

A pod holds one GPU of an 8-GPU DRA node; the GPU reports an uncorrected ECC error. gpuhealth holds
it out, asks the pod to checkpoint (the test acknowledges at once) and evicts it, resets the GPU
(KWOK ends the reset pod), and, once the agent (the test) reports clean counters, validates it
(KWOK ends the DCGM pod with a pass) and returns it. The test polls the API and notes when it first
sees each step (``hack/latency.py`` names them), writes the run to ``build/latency/latency.json``
(``python -m hack.latency --add`` files it and renders the table in docs/remediation.md), then
asserts that the two waits that are gpuhealth's own, from the GPU's last pod gone to its reset Job
and from the reset's success to the validation Job, are short.

The operator runs at its production sweep tick (5 s, not the suite's 1 s): a step that waits for
the sweeper, or for an unrelated event, shows as what it costs in a cluster.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from devkit import dra
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, ensure_namespace, healthy_spec, utcnow
from devkit.ladder import validation_job_template
from gpuhealth.actions.remediation_jobs import STEP_LABEL
from gpuhealth.actions.validation_jobs import LEVEL_LABEL
from gpuhealth.api.names import CHECKPOINT_COMPLETED, CHECKPOINT_REQUESTED
from hack import latency
from tests.integration.conftest import policy_spec
from tests.integration.test_device_quarantine import ecc, rules_of
from tests.integration.test_remediation_ladder import NS, jobs_of, start

PRODUCTION_TICK_S = 5.0  # the operator's default --tick (controller/process/main.py)
# Below the 29 s an outside try saw from the last pod gone to the reset Job (issue 37), and clear of a
# loaded 2-core machine: idle runs take about 1 s (results/latency/), and a make test beside other test
# runs (load 9 on 2 cores, fault to rule 6.0 s where idle takes 1.8 s) took 14.4 s, the claim
# controller clearing the claim late and the remediator looking again at growing intervals
# (remediator.py HANDOVER_S).
BOUND_S = 20.0
DEADLINE_S = 240.0
POLL_S = 0.2


@pytest.fixture(scope="module")
def production_operator(
    cluster: LocalCluster, operator: OperatorProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The operator at its default tick, alone (the suite's own is stopped meanwhile)."""
    operator.stop()
    op = OperatorProcess(
        cluster,
        tmp_path_factory.mktemp("latency-operator") / "operator.log",
        extra_args=[f"--tick={PRODUCTION_TICK_S:g}"],
    )
    try:
        yield op.start()
    finally:
        op.stop()
        operator.start()


def _succeeded(pods: list[Any], label: str) -> bool:
    return any(label in (p.metadata.labels or {}) and p.status.phase == "Succeeded" for p in pods)


def _first_events(kube: Kube, node: str) -> dict[str, float]:
    """When the operator first posted each reason (its eventTime has microseconds)."""
    out: dict[str, float] = {}
    for e in kube.node_events(node):
        when = e.event_time or e.first_timestamp
        if when is not None and e.reason:
            out[e.reason] = min(out.get(e.reason, when.timestamp()), when.timestamp())
    return out


def test_a_drained_gpu_is_reset_and_a_reset_gpu_validated_without_waiting(
    cluster: LocalCluster, kube: Kube, production_operator: OperatorProcess, group: str
) -> None:
    node = start(kube, cluster, group)
    ns = ensure_namespace(kube, f"lat-{group}"[:60])
    dra.create_claim_template(kube, ns, "one-gpu", 1)
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "trainer", "one-gpu", node))
    (dev,) = dra.wait_allocated(kube, ns, "trainer")
    bad = int(dev.removeprefix("gpu-"))
    rule = f"gpuhealth-{node}-gpu-{bad}"
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"probation": "2s", "maxUnhealthyGPUs": 8},
            actions={"drain": {"checkpointMode": "annotation"}},
            remediation={"enabled": True},
            validation={"enabled": True, "level": 2, "jobTemplate": validation_job_template(bad)},
        ),
    )

    marks: dict[str, float] = {}
    kube.put_report(node, ecc(bad))
    marks["fault"] = time.time()
    deadline = time.monotonic() + DEADLINE_S
    while "back" not in marks and time.monotonic() < deadline:
        now = time.time()
        rules = set(rules_of(kube, node))
        if "rule" not in marks and rule in rules:
            marks["rule"] = now
        if "rule" in marks and "back" not in marks and rule not in rules:
            marks["back"] = now
        if "pod_gone" not in marks:
            pods = {p.metadata.name: p for p in kube.core.list_namespaced_pod(ns).items}
            if "trainer" not in pods:
                marks["pod_gone"] = now
            elif "checkpointed" not in marks and CHECKPOINT_REQUESTED in (pods["trainer"].metadata.annotations or {}):
                # the trainer saves its state at once and says so; the drain then evicts it
                done = {"metadata": {"annotations": {CHECKPOINT_COMPLETED: utcnow()}}}
                kube.core.patch_namespaced_pod("trainer", ns, done)
                marks["checkpointed"] = time.time()
        if "claim_released" not in marks:
            claims = kube.custom.list_namespaced_custom_object(dra.G, dra.V, ns, "resourceclaims")["items"]
            if not any(
                r.get("name") == "trainer" for c in claims for r in (c.get("status") or {}).get("reservedFor") or []
            ):
                marks["claim_released"] = now
        if "validation_job" not in marks:
            for j in jobs_of(kube, node):
                kind = "validation_job" if LEVEL_LABEL in (j.metadata.labels or {}) else "reset_job"
                marks.setdefault(kind, now)
        if "reset_job" in marks and "validation_done" not in marks:
            pods = kube.core.list_namespaced_pod(NS, label_selector=f"gpuhealth.dev/node={node}").items
            if "reset_done" not in marks and _succeeded(pods, STEP_LABEL):
                marks["reset_done"] = now
                kube.put_report(node, healthy_spec())  # the agent: the reset cleared the volatile counters
                marks["clean_report"] = time.time()
            if _succeeded(pods, LEVEL_LABEL):
                marks["validation_done"] = now
        time.sleep(POLL_S)

    rep = latency.measurement(marks, PRODUCTION_TICK_S, _first_events(kube, node))
    path = latency.save(rep)
    print(f"latency run written to {path}: {rep['marks']}")
    assert "back" in marks, f"the GPU did not come back within {DEADLINE_S:g} s: {rep}"
    resets = [j for j in jobs_of(kube, node) if LEVEL_LABEL not in (j.metadata.labels or {})]
    assert len(resets) == 1 and len(jobs_of(kube, node)) == 2, "one reset Job, one validation Job"
    for begin, end in latency.BOUNDED:
        took = latency.delay(rep, begin, end)
        assert took is not None and took < BOUND_S, f"{begin} -> {end} took {took} s (bound {BOUND_S:g} s): {rep}"
