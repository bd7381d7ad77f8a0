"""P2P-aware repair end to end, on the real control plane with KWOK: ``DrainAndReset`` on an 8-GPU
NVSwitch DRA node, where every GPU is every other's NVLink peer (``spec.devices[].nvlink.peers``).

GPU 3 reports XID 154 with recovery action ``DrainAndReset``. gpuhealth holds GPU 3 and its 7 peers out
with one DeviceTaintRule each (one breaker decision), drains the pod that holds a peer (checkpoint
handshake), and only then creates ONE reset Job, for GPU 3's UUID alone. KWOK ends the Job's pod
(``devkit/kwok/pod-remediation.yaml``); the test plays the GPU: the agent's next reading shows no
recovery action. The peers' rules go at once, GPU 3's after its probation.
"""

from __future__ import annotations

from typing import Any

from devkit import dra
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, ensure_namespace, healthy_spec, utcnow, wait_for
from gpuhealth.api.names import CHECKPOINT_COMPLETED, CHECKPOINT_REQUESTED
from tests.integration.test_device_quarantine import device, gone_or_deleting, pod_annotations, rules_of
from tests.integration.test_remediation_ladder import job_done, jobs_of, ladder, start

GPUS = range(8)


def nvswitch(xid_time: str, action: str | None = None) -> dict[str, Any]:
    """The node's report: every GPU reaches the 7 others over NVLink; GPU 3 asks for ``action`` after
    the XID 154 of ``xid_time`` (the agent keeps it in its history after the reset)."""
    spec = healthy_spec(xids=[{"xid": 154, "time": xid_time, "gpu": 3, "source": "nvml"}])
    for d in spec["devices"]:
        d["nvlink"] = {"links": 18, "active": 18, "peers": [p for p in GPUS if p != d["index"]]}
    if action is not None:
        spec["devices"][3]["recoveryAction"] = action
    return spec


def test_drain_and_reset_drains_the_peers_runs_one_reset_and_returns_every_gpu(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    node = start(kube, cluster, group)
    kube.apply_policy(
        group,
        {
            "nodeSelector": {"matchLabels": {"gpuhealth-test": group}},
            "safety": {"probation": "2s", "maxUnhealthyGPUs": 8},
            "remediation": {"enabled": True},
            "actions": {"drain": {"checkpointMode": "annotation"}},
        },
    )
    ns = ensure_namespace(kube, f"pp-{group}"[:60])
    dra.create_claim_template(kube, ns, "one-gpu", 1)
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "rank-0", "one-gpu", node))
    (held,) = dra.wait_allocated(kube, ns, "rank-0")
    if held == "gpu-3":  # the pod must hold a peer, not the faulted GPU: take another
        kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "rank-1", "one-gpu", node))
        (held,) = dra.wait_allocated(kube, ns, "rank-1")
        pod = "rank-1"
    else:
        pod = "rank-0"
    peer = int(held.removeprefix("gpu-"))

    fault = utcnow()
    kube.put_report(node, nvswitch(fault, "DrainAndReset"))
    every = {f"gpuhealth-{node}-gpu-{i}" for i in GPUS}
    wait_for(lambda: every <= set(rules_of(kube, node)), timeout=40, what="a DeviceTaintRule for GPU 3 and each peer")
    assert {i: device(kube, node, i).get("reason") for i in GPUS if i != 3} == dict.fromkeys(
        (i for i in GPUS if i != 3), "NVLinkPeer"
    )
    status = kube.report(node)["status"]
    assert status["state"] == "Degraded" and kube.our_taint(node) is None, "the peers are not bad GPUs"
    # No reset while the pod still holds a peer: it is asked to checkpoint first.
    wait_for(lambda: CHECKPOINT_REQUESTED in pod_annotations(kube, ns, pod), timeout=30, what="checkpoint asked")
    assert not jobs_of(kube, node), "no reset while a peer is busy"
    kube.core.patch_namespaced_pod(pod, ns, {"metadata": {"annotations": {CHECKPOINT_COMPLETED: utcnow()}}})
    wait_for(lambda: gone_or_deleting(kube, ns, pod), timeout=30, what="the pod on the peer evicted")

    (job,) = wait_for(lambda: jobs_of(kube, node), timeout=60, what="ONE reset Job once the peers are idle")
    (container,) = job.spec.template.spec.containers
    assert container.command == ["nvidia-smi", "-r", "-i", dra.report_uuid(3)]
    assert all(device(kube, node, i).get("state") == "Quarantined" for i in GPUS), "all drained, all held"
    assert device(kube, node, peer).get("reason") == "NVLinkPeer"

    wait_for(lambda: job_done(jobs_of(kube, node)[0], "Complete"), timeout=60, what="the reset Job succeeded (KWOK)")
    kube.put_report(node, nvswitch(fault, "None"))  # the agent's next reading: no recovery action any more
    peers = every - {f"gpuhealth-{node}-gpu-3"}
    wait_for(lambda: not (peers & set(rules_of(kube, node))), timeout=40, what="the peers' rules lifted")
    wait_for(lambda: not (every & set(rules_of(kube, node))), timeout=40, what="GPU 3's rule lifted after probation")
    assert all(device(kube, node, i).get("state") == "InService" for i in GPUS)
    assert len(jobs_of(kube, node)) == 1, "one reset Job in all"
    reasons = [e.reason for e in kube.await_events(node, "GPUReset", "PeerReturned", "RemediationSucceeded")]
    assert reasons.count("GPUReset") == 1, reasons
    wait_for(lambda: not ladder(kube, node, 3), timeout=20, what="the ladder record gone")
