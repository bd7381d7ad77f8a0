"""P2P-aware repair of ``DrainP2P`` end to end, on the real control plane with KWOK: an 8-GPU NVSwitch
DRA node where every GPU is every other's NVLink peer (``spec.devices[].nvlink.peers``).

GPU 3 reports XID 154 with recovery action ``DrainP2P``, which names no repair: "drain P2P traffic,
then read the field again" (``evaluation/peers.py``). gpuhealth holds GPU 3 and its 7 peers out with
one DeviceTaintRule each, drains the pod that holds a peer (checkpoint handshake) and then waits: no
reset Job while the field still says ``DrainP2P`` (a ``RemediationBlocked`` Event says why), and
``gpuhealth_peer_holds`` counts the 7 peers. The test plays the agent's next reading, ``Reset``: the
peers return at once (a plain reset needs them idle no more) and ONE reset Job runs for GPU 3 alone;
KWOK ends its pod (``devkit/kwok/pod-remediation.yaml``), the reading after it shows no recovery
action, and GPU 3 returns after its probation.
"""

from __future__ import annotations

import re

from devkit import dra
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, ensure_namespace, utcnow, wait_for
from gpuhealth.api.names import CHECKPOINT_COMPLETED, CHECKPOINT_REQUESTED
from tests.integration.test_device_quarantine import device, gone_or_deleting, pod_annotations, rules_of
from tests.integration.test_p2p_reset import GPUS, nvswitch
from tests.integration.test_remediation_ladder import job_done, jobs_of, ladder, start


def peer_holds(operator: OperatorProcess, policy: str) -> float | None:
    """``gpuhealth_peer_holds{policy}`` as the operator serves it (None: no such series)."""
    m = re.search(rf'^gpuhealth_peer_holds\{{policy="{re.escape(policy)}"\}} (\S+)$', operator.metrics(), re.M)
    return float(m.group(1)) if m else None


def test_drain_p2p_drains_the_peers_waits_for_the_next_reading_then_one_reset_returns_every_gpu(
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
    ns = ensure_namespace(kube, f"pd-{group}"[:60])
    dra.create_claim_template(kube, ns, "one-gpu", 1)
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "rank-0", "one-gpu", node))
    (held,) = dra.wait_allocated(kube, ns, "rank-0")
    if held == "gpu-3":  # the pod must hold a peer, not the faulted GPU: take another
        kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "rank-1", "one-gpu", node))
        (held,) = dra.wait_allocated(kube, ns, "rank-1")
        pod = "rank-1"
    else:
        pod = "rank-0"

    fault = utcnow()
    kube.put_report(node, nvswitch(fault, "DrainP2P"))
    every = {f"gpuhealth-{node}-gpu-{i}" for i in GPUS}
    wait_for(lambda: every <= set(rules_of(kube, node)), timeout=40, what="a DeviceTaintRule for GPU 3 and each peer")
    assert {i: device(kube, node, i).get("reason") for i in GPUS if i != 3} == dict.fromkeys(
        (i for i in GPUS if i != 3), "NVLinkPeer"
    )
    status = kube.report(node)["status"]
    assert status["state"] == "Degraded" and kube.our_taint(node) is None, "the GPU's and its peers', not the node's"
    wait_for(lambda: CHECKPOINT_REQUESTED in pod_annotations(kube, ns, pod), timeout=30, what="checkpoint asked")
    kube.core.patch_namespaced_pod(pod, ns, {"metadata": {"annotations": {CHECKPOINT_COMPLETED: utcnow()}}})
    wait_for(lambda: gone_or_deleting(kube, ns, pod), timeout=30, what="the pod on the peer evicted")

    # The group is drained; DrainP2P names no repair, so gpuhealth waits for the agent's next reading.
    wait_for(lambda: all(device(kube, node, i).get("drained") for i in GPUS), timeout=40, what="every GPU drained")
    waits = wait_for(
        lambda: [e.message for e in kube.node_events(node, "RemediationBlocked") if "DrainP2P" in (e.message or "")],
        timeout=30,
        what="the RemediationBlocked Event that says gpuhealth waits for the next reading",
    )
    assert "next reading" in waits[0]
    wait_for(lambda: peer_holds(operator, group) == 7, timeout=30, what="gpuhealth_peer_holds counting the 7 peers")
    assert not jobs_of(kube, node) and not ladder(kube, node, 3), "no reset while the field still says DrainP2P"
    assert all(device(kube, node, i).get("state") == "Quarantined" for i in GPUS), "the group stays held"

    kube.put_report(node, nvswitch(fault, "Reset"))  # the agent's next reading names a GPU reset
    peers = every - {f"gpuhealth-{node}-gpu-3"}
    wait_for(lambda: not (peers & set(rules_of(kube, node))), timeout=40, what="the peers' rules lifted")
    (job,) = wait_for(lambda: jobs_of(kube, node), timeout=60, what="ONE reset Job for GPU 3")
    (container,) = job.spec.template.spec.containers
    assert container.command == ["nvidia-smi", "-r", "-i", dra.report_uuid(3)]
    assert f"gpuhealth-{node}-gpu-3" in rules_of(kube, node), "GPU 3 stays held during its reset"
    wait_for(lambda: peer_holds(operator, group) == 0, timeout=30, what="gpuhealth_peer_holds back to 0")

    wait_for(lambda: job_done(jobs_of(kube, node)[0], "Complete"), timeout=60, what="the reset Job succeeded (KWOK)")
    kube.put_report(node, nvswitch(fault, "None"))  # the reading after the reset: no recovery action any more
    wait_for(lambda: not (every & set(rules_of(kube, node))), timeout=40, what="GPU 3's rule lifted after probation")
    assert all(device(kube, node, i).get("state") == "InService" for i in GPUS)
    assert len(jobs_of(kube, node)) == 1, "one reset Job in all"
    reasons = [e.reason for e in kube.await_events(node, "GPUReset", "PeerReturned", "RemediationSucceeded")]
    assert reasons.count("GPUReset") == 1, reasons
    wait_for(lambda: not ladder(kube, node, 3), timeout=20, what="the ladder record gone")
