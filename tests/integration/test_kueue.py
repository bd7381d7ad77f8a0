"""gpuhealth as a Kueue AdmissionCheck, against the real Kueue manager (v0.17, ``devkit/kueue.py``).

A ClusterQueue with gpuhealth's AdmissionCheck and a ResourceFlavor for the test's fake GPU nodes;
indexed Jobs under Kueue's batch/job integration (created suspended, with the queue label), whose
ranks KWOK runs and the test acknowledges like a checkpointing trainer. Kueue must build and start:
a missing build fails these tests, it never skips them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from devkit import dra
from devkit.cluster import LocalCluster
from devkit.k8s import (
    GPUHEALTH_NAMESPACE,
    Kube,
    OperatorProcess,
    healthy_spec,
    holds,
    install_gpuhealth,
    refusals,
    remove_gpuhealth_workloads,
    service_account_token,
    token_kubeconfig,
    wait_for,
)
from devkit.k8s import ensure_namespace as namespace
from devkit.k8s import xid_event as xid
from devkit.kueue import (
    Kueue,
    claiming,
    cond,
    cq_active,
    evictions,
    kueue_queue,
    our_check,
    queued_job,
    workload,
    workload_events,
)
from devkit.ranks import acknowledge_all, live_pods, requested, running
from tests.integration.conftest import make_dra_node, make_nodes, policy_spec

# Kueue's DRA quota accounting (alpha in v0.17, feature gate DynamicResourceAllocation): claims of a
# mapped DeviceClass count as the mapping's quota resource, which the operator is told to count as GPUs.
DRA_CLASS = "kueue-whole-gpu"
DRA_QUOTA = "example.com/whole-gpu"


@pytest.fixture(scope="module")
def kueue(cluster: LocalCluster) -> Iterator[Kueue]:
    k = Kueue(
        cluster,
        feature_gates=("DynamicResourceAllocation=true",),
        device_class_mappings=[{"name": DRA_QUOTA, "deviceClassNames": [DRA_CLASS]}],
    ).start()
    try:
        yield k
    finally:
        k.stop()


@pytest.fixture(scope="module")
def kueue_operator(
    cluster: LocalCluster,
    kube: Kube,
    kueue: Kueue,
    operator: OperatorProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """The operator with its Kueue room on, under its service account's token with the RBAC of
    manifests/overlays/example-kueue (the base plus the Kueue component): every scenario here is
    also a least-privilege proof. The session's own operator is paused meanwhile (one acts at a time)."""
    install_gpuhealth(cluster, "overlays/example-kueue")
    remove_gpuhealth_workloads(cluster)
    d = tmp_path_factory.mktemp("kueue-operator")
    kubeconfig = token_kubeconfig(
        cluster, service_account_token(kube, GPUHEALTH_NAMESPACE, "gpuhealth-operator"), d / "kc"
    )
    operator.stop()
    op = OperatorProcess(
        cluster,
        d / "operator.log",
        extra_args=[f"--kubeconfig={kubeconfig}", "--kueue=on", f"--gpu-resources=nvidia.com/gpu,{DRA_QUOTA}"],
    )
    try:
        yield op.start()
    finally:
        op.stop()
        # The component's cluster-wide Event permission is not the base's: leave the base as it was.
        cluster.kubectl(
            "delete",
            "--ignore-not-found",
            "clusterrole/gpuhealth-operator-kueue",
            "clusterrolebinding/gpuhealth-operator-kueue",
        )
        operator.start()


def setup_running_job(
    cluster: LocalCluster, kube: Kube, group: str, app: str
) -> tuple[list[str], str, str, dict[str, Any], list[Any]]:
    """Three nodes, a policy, a queue with gpuhealth's check, and a 4-rank job admitted and running on
    the first node. Returns (nodes, namespace, check, workload, ranks)."""
    nodes = make_nodes(cluster, group, 3)
    ns = namespace(kube, f"kq-{group}"[:60])
    kube.apply_policy(
        group, policy_spec(group, safety={"maxUnhealthy": 1}, actions={"drain": {"checkpointTimeout": "2m"}})
    )
    for n in nodes:
        kube.put_report(n, healthy_spec())
    check = kueue_queue(cluster, group, ns, gpus=24)
    wait_for(lambda: cq_active(cluster, group), what="the ClusterQueue active (gpuhealth's check Active)")
    kube.batch.create_namespaced_job(ns, queued_job(app, nodes[0], ns, group))
    wl = wait_for(
        lambda: cond(w := workload(kube, ns, app), "Admitted") and w, timeout=60, what="the Workload admitted"
    )
    assert our_check(wl, check)["state"] == "Ready", wl["status"]
    assert "no capacity gpuhealth holds out" in our_check(wl, check)["message"]
    ranks = wait_for(lambda: running(kube, ns, app, 4), timeout=60, what="4 ranks running")
    assert {p.spec.node_name for p in ranks} == {nodes[0]}
    return nodes, ns, check, wl, ranks


def assert_moved_once(kube: Kube, ns: str, app: str, check: str, bad: str, old: set[str]) -> dict[str, Any]:
    """Kueue evicted the Workload once (reason AdmissionCheck), requeued and re-admitted it, and its 4
    ranks run again, none on the bad node; returns the Workload."""

    def readmitted() -> dict[str, Any] | None:
        w = workload(kube, ns, app)
        ready = our_check(w, check).get("state") == "Ready"
        return w if evictions(w) and cond(w, "Admitted") and not cond(w, "Evicted") and ready else None

    wl = wait_for(readmitted, timeout=90, what="the Workload evicted by its admission check and admitted again")
    assert [(e["reason"], e["count"]) for e in evictions(wl)] == [("AdmissionCheck", 1)], evictions(wl)
    assert our_check(wl, check).get("retryCount") == 1, our_check(wl, check)
    again = wait_for(lambda: running(kube, ns, app, 4), timeout=90, what="4 ranks running again")
    assert bad not in {p.spec.node_name for p in again}
    assert not old & {p.metadata.uid for p in again}, "new pods, not the old ones"
    return wl


def test_xid79_moves_the_queued_job_as_a_whole_through_kueue(
    cluster: LocalCluster, kube: Kube, kueue_operator: OperatorProcess, group: str
) -> None:
    nodes, ns, check, _, ranks = setup_running_job(cluster, kube, group, "llm")
    bad = nodes[0]
    kube.put_report(bad, healthy_spec(xids=[xid(79)]))
    asked = wait_for(lambda: requested(kube, ns, "llm"), what="checkpoint requested on all 4 ranks")
    # Nothing moves before every rank has saved its checkpoint.
    holds(
        lambda: (
            our_check(workload(kube, ns, "llm"), check).get("state") == "Ready" and len(live_pods(kube, ns, "llm")) == 4
        ),
        2.0,
        what="no Retry and no eviction before the acknowledgements",
    )
    acknowledge_all(kube, ns, asked)
    moved = assert_moved_once(kube, ns, "llm", check, bad, {p.metadata.uid for p in ranks})
    # The drain record names the Workload; gpuhealth evicted no pod itself.
    drain = wait_for(
        lambda: (d := kube.report(bad)["status"].get("drain") or {}).get("phase") == "Completed" and d,
        timeout=60,
        what="the drain completed",
    )
    key = f"{ns}/{moved['metadata']['name']}"
    assert drain["workloads"][key]["retriedAt"] and drain["workloads"][key]["uid"] == moved["metadata"]["uid"]
    assert bad in drain["workloads"][key]["message"] and "79" in drain["workloads"][key]["message"]
    assert drain["evicted"] == 0
    wait_for(lambda: kube.node_events(bad, "WorkloadMoved"), what="WorkloadMoved on the Node")
    wait_for(
        lambda: workload_events(kube, ns, moved["metadata"]["name"], "MovedByGpuhealth"), what="Event on the Workload"
    )
    time.sleep(1)
    assert len(kube.node_events(bad, "WorkloadMoved")) == 1
    assert len(kube.node_events(bad, "CheckpointRequested")) == 4
    assert not kube.node_events(bad, "Evicted")


def test_a_kill_after_the_acknowledgements_writes_one_retry_and_asks_no_second_time(
    cluster: LocalCluster, kube: Kube, kueue_operator: OperatorProcess, group: str
) -> None:
    nodes, ns, check, _, _ = setup_running_job(cluster, kube, group, "ft")
    bad = nodes[0]
    kube.put_report(bad, healthy_spec(xids=[xid(79)]))
    asked = wait_for(lambda: requested(kube, ns, "ft"), what="checkpoint requested on all 4 ranks")
    stamps = {p.metadata.uid: p.metadata.annotations["gpuhealth.dev/checkpoint-requested"] for p in asked}
    # The Events follow the annotations; a SIGKILL before they are posted loses them (a loaded machine's
    # run saw one of four), and the count below is of a second handshake, so it starts from all four.
    wait_for(lambda: len(kube.node_events(bad, "CheckpointRequested")) == 4, what="four CheckpointRequested")
    kueue_operator.kill()  # SIGKILL: between the acknowledgements and the Retry write
    acknowledge_all(kube, ns, asked)
    after = {
        p.metadata.uid: p.metadata.annotations["gpuhealth.dev/checkpoint-requested"] for p in live_pods(kube, ns, "ft")
    }
    assert after == stamps
    assert our_check(workload(kube, ns, "ft"), check)["state"] == "Ready", "nothing moved while the operator was down"
    kueue_operator.start()
    moved = assert_moved_once(kube, ns, "ft", check, bad, set(stamps))
    wait_for(lambda: kube.node_events(bad, "WorkloadMoved"), what="WorkloadMoved on the Node")
    time.sleep(2)
    assert len(kube.node_events(bad, "CheckpointRequested")) == 4, "no second handshake"
    assert len(kube.node_events(bad, "WorkloadMoved")) == 1
    assert len(workload_events(kube, ns, moved["metadata"]["name"], "MovedByGpuhealth")) == 1


def test_a_workload_that_does_not_acknowledge_in_time_is_moved_anyway(
    cluster: LocalCluster, kube: Kube, kueue_operator: OperatorProcess, group: str
) -> None:
    nodes = make_nodes(cluster, group, 3)
    bad = nodes[0]
    ns = namespace(kube, f"kq-{group}"[:60])
    kube.apply_policy(
        group,
        policy_spec(
            group,
            safety={"maxUnhealthy": 1},
            actions={"drain": {"checkpointTimeout": "3s", "onCheckpointTimeout": "Evict"}},
        ),
    )
    for n in nodes:
        kube.put_report(n, healthy_spec())
    check = kueue_queue(cluster, group, ns, gpus=24)
    wait_for(lambda: cq_active(cluster, group), what="the ClusterQueue active")
    kube.batch.create_namespaced_job(ns, queued_job("slow", bad, ns, group))
    ranks = wait_for(lambda: running(kube, ns, "slow", 4), timeout=90, what="4 ranks running")
    kube.put_report(bad, healthy_spec(xids=[xid(79)]))
    wait_for(lambda: requested(kube, ns, "slow"), what="checkpoint requested")  # and never acknowledged
    wait_for(lambda: kube.node_events(bad, "CheckpointTimeout"), timeout=30, what="the gang's deadline")
    assert_moved_once(kube, ns, "slow", check, bad, {p.metadata.uid for p in ranks})


def test_admission_is_retried_while_the_flavor_counts_on_held_out_gpus(
    cluster: LocalCluster, kube: Kube, kueue_operator: OperatorProcess, group: str
) -> None:
    nodes = make_nodes(cluster, group, 2)
    ns = namespace(kube, f"kq-{group}"[:60])
    kube.apply_policy(group, policy_spec(group, safety={"maxUnhealthy": 1}))
    for n in nodes:
        kube.put_report(n, healthy_spec())
    check = kueue_queue(cluster, group, ns, gpus=16)
    wait_for(lambda: cq_active(cluster, group), what="the ClusterQueue active")
    kube.put_report(nodes[0], healthy_spec(xids=[xid(79)]))
    wait_for(lambda: kube.state(nodes[0]) in ("Quarantined", "Draining", "AwaitingRepair"), what="node out of service")
    # 16 GPUs of quota, but gpuhealth holds 8 of them out: a 16-GPU job must not start.
    kube.batch.create_namespaced_job(ns, queued_job("big", nodes[1], ns, group, ranks=8))
    wl = wait_for(
        lambda: (w := workload(kube, ns, "big")) and our_check(w, check).get("retryCount") and w,
        timeout=60,
        what="gpuhealth's check Retry at admission",
    )
    assert evictions(wl) and evictions(wl)[0]["reason"] == "AdmissionCheck"
    wait_for(lambda: workload_events(kube, ns, wl["metadata"]["name"], "CapacityHeldOut"), what="CapacityHeldOut Event")
    message = workload_events(kube, ns, wl["metadata"]["name"], "CapacityHeldOut")[0].message
    assert nodes[0] in message and "16 nvidia.com/gpu assigned" in message, message
    job = kube.batch.read_namespaced_job("big", ns)
    assert job.spec.suspend is True and not live_pods(kube, ns, "big"), "the job never started"
    # Once the node is back (here: the job shrinks to what is in service), Kueue admits it.
    kube.batch.delete_namespaced_job("big", ns, propagation_policy="Background")
    kube.batch.create_namespaced_job(ns, queued_job("small", nodes[1], ns, group, ranks=4))
    wait_for(lambda: running(kube, ns, "small", 4), timeout=60, what="a job that fits what is in service runs")
    assert {p.spec.node_name for p in running(kube, ns, "small", 4) or []} == {nodes[1]}


def test_a_workload_whose_queue_does_not_use_gpuhealths_check_keeps_the_pod_path(
    cluster: LocalCluster, kube: Kube, kueue_operator: OperatorProcess, group: str
) -> None:
    nodes = make_nodes(cluster, group, 3)
    bad = nodes[0]
    ns = namespace(kube, f"kq-{group}"[:60])
    kube.apply_policy(
        group, policy_spec(group, safety={"maxUnhealthy": 1}, actions={"drain": {"checkpointTimeout": "2m"}})
    )
    for n in nodes:
        kube.put_report(n, healthy_spec())
    kueue_queue(cluster, group, ns, gpus=24, with_check=False)
    kube.batch.create_namespaced_job(ns, queued_job("plain", bad, ns, group))
    ranks = wait_for(lambda: running(kube, ns, "plain", 4), timeout=90, what="4 ranks running")
    kube.put_report(bad, healthy_spec(xids=[xid(79)]))
    acknowledge_all(kube, ns, wait_for(lambda: requested(kube, ns, "plain"), what="checkpoint requested"))
    wait_for(lambda: len(kube.node_events(bad, "Evicted")) == 4, timeout=60, what="gpuhealth evicts the 4 ranks itself")
    # The Job controller replaces evicted pods with its pod-failure backoff (tens of seconds here).
    again = wait_for(lambda: running(kube, ns, "plain", 4), timeout=180, what="the Job's new ranks running")
    assert bad not in {p.spec.node_name for p in again} and not {p.metadata.uid for p in ranks} & {
        p.metadata.uid for p in again
    }
    assert not kube.node_events(bad, "WorkloadMoved")
    assert not evictions(workload(kube, ns, "plain")), "Kueue was not asked to evict anything"


def test_a_rank_on_a_bad_dra_gpu_moves_the_whole_workload_and_only_that_gpu_is_held_out(
    cluster: LocalCluster, kube: Kube, kueue_operator: OperatorProcess, group: str
) -> None:
    # A DRA node: no device-plugin GPUs; its 8 GPUs are published as ResourceSlices, and pods asking
    # for nvidia.com/gpu get them through a DeviceClass with extendedResourceName (so Kueue's quota,
    # which counts nvidia.com/gpu, sees them like any other GPUs).
    node = make_dra_node(cluster, group, f"{group}-dra"[:63])
    dra.publish_slices(kube, [node], uuid=dra.report_uuid)
    gpu_class = dra.device_class(f"kueue-{group}"[:63], "nvidia.com/gpu")
    kube.custom.create_cluster_custom_object(dra.G, dra.V, "deviceclasses", gpu_class)
    try:
        ns = namespace(kube, f"kq-{group}"[:60])
        kube.put_report(node, healthy_spec())
        kube.apply_policy(
            group,
            policy_spec(group, safety={"maxUnhealthyGPUs": 8}, actions={"drain": {"checkpointTimeout": "2m"}}),
        )
        check = kueue_queue(cluster, group, ns, gpus=8)
        wait_for(lambda: cq_active(cluster, group), what="the ClusterQueue active")
        job = queued_job("dra", node, ns, group)
        job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
        kube.batch.create_namespaced_job(ns, job)
        ranks = wait_for(lambda: running(kube, ns, "dra", 4), timeout=90, what="4 ranks running on DRA GPUs")
        held = {p.metadata.name: dra.wait_allocated(kube, ns, p.metadata.name)[0] for p in ranks}
        bad = int(sorted(held.values())[0].removeprefix("gpu-"))
        spec = healthy_spec()
        spec["devices"][bad]["ecc"]["volatileUncorrected"] = 1
        kube.put_report(node, spec)
        asked = wait_for(lambda: requested(kube, ns, "dra"), what="all 4 ranks asked, not only the one on the GPU")
        acknowledge_all(kube, ns, asked)
        moved = assert_moved_once(kube, ns, "dra", check, "no-such-node", {p.metadata.uid for p in ranks})
        # The device drain's record goes once the GPU is quarantined; the Workload's Event keeps the why.
        name = moved["metadata"]["name"]
        (ev,) = wait_for(lambda: workload_events(kube, ns, name, "MovedByGpuhealth"), what="the Workload's Event")
        assert f"GPU {bad}" in ev.message and node in ev.message and "EccUncorrected" in ev.message, ev.message
        again = running(kube, ns, "dra", 4) or []
        devices = {d for p in again for d in dra.wait_allocated(kube, ns, p.metadata.name)}
        assert f"gpu-{bad}" not in devices, "the moved ranks do not get the held-out GPU back"
        assert kube.our_taint(node) is None, "one GPU out, not the node"
    finally:
        kube.custom.delete_cluster_custom_object(dra.G, dra.V, "deviceclasses", gpu_class["metadata"]["name"])


def test_dra_claims_kueue_counts_under_a_mapped_name_meet_the_gpus_held_out_by_device_taint_rules(
    cluster: LocalCluster, kube: Kube, kueue_operator: OperatorProcess, group: str
) -> None:
    # Ranks claim their GPU through a ResourceClaimTemplate of a DeviceClass that Kueue's
    # deviceClassMappings map to DRA_QUOTA: the Workload's resourceUsage carries DRA_QUOTA, not
    # nvidia.com/gpu, and the ClusterQueue's quota is in DRA_QUOTA.
    node = make_dra_node(cluster, group, f"{group}-dra"[:63])
    dra.publish_slices(kube, [node], uuid=dra.report_uuid)
    kube.custom.create_cluster_custom_object(dra.G, dra.V, "deviceclasses", dra.device_class(DRA_CLASS))
    try:
        ns = namespace(kube, f"kq-{group}"[:60])
        tmpl = dra.claim_template(ns, "one-gpu", 1, device_class_name=DRA_CLASS)
        kube.custom.create_namespaced_custom_object(dra.G, dra.V, ns, "resourceclaimtemplates", tmpl)
        # Two bad GPUs stay two GPUs held out (the default, 1, would take the whole node out).
        kube.apply_policy(group, policy_spec(group, safety={"maxUnhealthyGPUs": 8}, devices={"maxBadGPUsPerNode": 2}))
        check = kueue_queue(cluster, group, ns, gpus=8, resource=DRA_QUOTA)
        wait_for(lambda: cq_active(cluster, group), what="the ClusterQueue active")
        # Two GPUs held out one by one (DeviceTaintRules); the node itself stays in service.
        spec = healthy_spec()
        for bad in (0, 1):
            spec["devices"][bad]["ecc"]["volatileUncorrected"] = 1
        kube.put_report(node, spec)

        def held_out() -> bool:
            devices = {d["index"]: d["state"] for d in (kube.report(node).get("status") or {}).get("devices") or []}
            return devices.get(0) == devices.get(1) == "Quarantined"

        wait_for(held_out, what="GPUs 0 and 1 quarantined")
        dra.wait_rule_seen(kube, f"gpuhealth-{node}-gpu-0")
        assert kube.our_taint(node) is None
        # 8 of DRA_QUOTA fit the quota, but only 6 GPUs are in service: gpuhealth says Retry.
        kube.batch.create_namespaced_job(ns, claiming(queued_job("big", node, ns, group, ranks=8), "one-gpu"))
        wl = wait_for(
            lambda: (w := workload(kube, ns, "big")) and our_check(w, check).get("retryCount") and w,
            timeout=60,
            what="gpuhealth's check Retry at admission",
        )
        assert evictions(wl) and evictions(wl)[0]["reason"] == "AdmissionCheck"
        name = wl["metadata"]["name"]
        wait_for(lambda: workload_events(kube, ns, name, "CapacityHeldOut"), what="CapacityHeldOut Event")
        message = workload_events(kube, ns, name, "CapacityHeldOut")[0].message
        assert f"8 {DRA_QUOTA} assigned" in message and f"{node} (2 GPUs" in message and "6 left" in message, message
        job = kube.batch.read_namespaced_job("big", ns)
        assert job.spec.suspend is True and not live_pods(kube, ns, "big"), "the job never started"
        # A job that fits what is in service is admitted, and its claims get the 6 GPUs left.
        kube.batch.delete_namespaced_job("big", ns, propagation_policy="Background")
        kube.batch.create_namespaced_job(ns, claiming(queued_job("fits", node, ns, group, ranks=6), "one-gpu"))
        ranks = wait_for(lambda: running(kube, ns, "fits", 6), timeout=90, what="6 ranks running on DRA GPUs")
        fits = wait_for(lambda: cond(w := workload(kube, ns, "fits"), "Admitted") and w, what="admitted")
        (psa,) = fits["status"]["admission"]["podSetAssignments"]
        assert psa["resourceUsage"] == {DRA_QUOTA: "6"}, psa
        devices = {d for p in ranks for d in dra.wait_allocated(kube, ns, p.metadata.name)}
        assert devices == {f"gpu-{i}" for i in range(2, 8)}
    finally:
        kube.custom.delete_cluster_custom_object(dra.G, dra.V, "deviceclasses", DRA_CLASS)


def test_the_operator_did_all_of_it_with_only_its_service_accounts_rbac(kueue_operator: OperatorProcess) -> None:
    """Runs last in this file: the operator above ran under the service account's token, with the base's
    RBAC and the Kueue component's; not one request was refused."""
    wait_for(lambda: "Kueue admission check" in kueue_operator.log.read_text(), what="the Kueue room started")
    text = kueue_operator.log.read_text()
    assert not refusals(text), f"refused requests in the operator's log:\n{text[-4000:]}"
