"""A restart loop on one MIG instance costs that instance: two workloads whose pods crash-loop on one
MIG device (a shared ResourceClaim) while they run fine on another node. On the real API server and
scheduler, with slices shaped as NVIDIA's DRA driver publishes them (devkit/dra_shapes.py);
judged by the DeviceTaintRules, the Node, the pods and the GPUNodeHealth status."""

from __future__ import annotations

from typing import Any

from devkit import dra
from devkit import dra_shapes as S
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, wait_for
from tests.integration.conftest import make_nodes
from tests.integration.test_device_quarantine import device, gone_or_deleting
from tests.integration.test_drain import _crash
from tests.integration.test_partitions import MIG2, healthy, mig_spec, ours, setup, static_mig_node

JOB = "training.kubeflow.org/job-name"  # the workload a bare pod belongs to


def shared_claim(ns: str, name: str) -> dict[str, Any]:
    """One ResourceClaim for one MIG device, to be shared by several pods."""
    spec = dra.claim_template(ns, name, 1, cel=dra.MIG_CEL)["spec"]["spec"]
    return {
        "apiVersion": f"{dra.G}/{dra.V}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def on_shared(ns: str, name: str, job: str, claim: str, node: str) -> dict[str, Any]:
    pod = dra.claim_pod(ns, name, "unused", node)
    pod["metadata"]["labels"][JOB] = job
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    return pod


def allocated(kube: Kube, ns: str, claim: str) -> list[str] | None:
    obj = kube.custom.get_namespaced_custom_object(dra.G, dra.V, ns, "resourceclaims", claim)
    return dra.allocated_devices(obj) if ((obj.get("status") or {}).get("allocation") or {}).get("devices") else None


def plain(ns: str, name: str, job: str, node: str) -> dict[str, Any]:
    """The same workload's pod on another node, running fine (no GPU needed for that)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {JOB: job}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "trainer"}],
        },
    }


def test_two_workloads_crash_looping_on_one_mig_device_hold_out_that_device_only(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    node, other = make_nodes(cluster, group, 2)
    kube.put_report(node, mig_spec(node, []))
    kube.put_report(other, healthy(other))
    ns = setup(kube, group, "pr", restartLoop={"minWorkloads": 2, "minRestarts": 3, "window": "10m"})
    dra.publish(kube, static_mig_node(node))
    kube.custom.create_namespaced_custom_object(dra.G, dra.V, ns, "resourceclaims", shared_claim(ns, "shared"))
    for job in ("job-a", "job-b"):
        kube.core.create_namespaced_pod(ns, on_shared(ns, f"{job}-here", job, "shared", node))
        kube.core.create_namespaced_pod(ns, plain(ns, f"{job}-there", job, other))
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "tenant-c", "mig", node))
    (loop_device,) = wait_for(lambda: allocated(kube, ns, "shared"), timeout=60, what="the shared claim allocated")
    (c_device,) = dra.wait_allocated(kube, ns, "tenant-c")
    assert {loop_device, c_device} == set(MIG2)

    for name in ("job-a-there", "job-b-there", "job-a-here", "job-b-here"):

        def running(name: str = name) -> bool:
            return bool(kube.core.read_namespaced_pod(name, ns).status.phase == "Running")

        wait_for(running, timeout=60, what=f"{name} running")
    shared = kube.custom.get_namespaced_custom_object(dra.G, dra.V, ns, "resourceclaims", "shared")
    assert {r["name"] for r in shared["status"]["reservedFor"]} == {"job-a-here", "job-b-here"}
    for name in ("job-a-here", "job-b-here"):
        _crash(kube, kube.core.read_namespaced_pod(name, ns))

    rule = f"gpuhealth-{node}-{loop_device}"
    wait_for(lambda: ours(kube, node) == {rule: loop_device}, timeout=30, what="a rule for the looping MIG device")
    rec = device(kube, node, 2)
    start = (0, 4)[MIG2.index(loop_device)]
    assert rec["reason"] == "RestartLoop" and rec["instances"] == [S.mig_uuid(dra.node_uuid(node, 2), "3g.40gb", start)]
    assert rec["devices"] == [f"{dra.DRIVER}/{node}/{loop_device}"]
    assert "job-a" in rec["message"] and "job-b" in rec["message"]
    status = kube.report(node)["status"]
    assert status["state"] == "Degraded" and status["inServiceGPUs"] == 8, status
    assert kube.our_taint(node) is None and not kube.node(node)["spec"].get("unschedulable")
    assert not gone_or_deleting(kube, ns, "tenant-c")
    assert c_device not in ours(kube, node).values()
