"""A bad GPU is all of its partitions: static MIG and partitionable (DynamicMIG) GPUs end to end, on
the real API server (which validates the driver's slice shapes) and its real scheduler; a MIG GPU's
repair and validation once all its instances are drained.

Slices are published for KWOK nodes exactly as NVIDIA's DRA driver shapes them
(devkit/dra_shapes.py). Judged by Kubernetes objects: DeviceTaintRules, the Node, pods, the
claims the scheduler allocates, the GPUNodeHealth status and Events.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
from typing import Any

from devkit import dra
from devkit import dra_shapes as S
from devkit.cluster import LocalCluster
from devkit.gpunodes import gpu_node_manifest
from devkit.k8s import Kube, OperatorProcess, ensure_namespace, healthy_spec, utcnow, wait_for
from devkit.ladder import validation_job_template
from gpuhealth.api.names import CHECKPOINT_COMPLETED, CHECKPOINT_REQUESTED
from tests.integration.conftest import make_nodes, policy_spec
from tests.integration.test_cli import ok, plugin
from tests.integration.test_device_quarantine import device, gone_or_deleting, pod_annotations, rules_of
from tests.integration.test_remediation_ladder import job_done, jobs_of, ladder, setup_namespace

MIG2 = ("gpu-2-mig-3g40gb-9-0", "gpu-2-mig-3g40gb-9-4")


def healthy(node: str) -> dict[str, Any]:
    return dra.with_node_uuids(healthy_spec(), node)


def ecc(node: str, bad: int) -> dict[str, Any]:
    spec = healthy(node)
    spec["devices"][bad]["ecc"]["volatileUncorrected"] = 1
    return spec


def gpus(node: str, n: int) -> list[S.Gpu]:
    return [S.Gpu(i, dra.node_uuid(node, i)) for i in range(n)]


def ours(kube: Kube, node: str) -> dict[str, str]:
    """gpuhealth's rules of the node: name -> the device it selects."""
    return {
        n: r["spec"]["deviceSelector"]["device"]
        for n, r in rules_of(kube, node).items()
        if (r["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "gpuhealth"
    }


def static_mig_node(node: str) -> S.Published:
    """Eight GPUs; GPU 2 MIG-enabled with two 3g.40gb devices (and no full gpu-2 device)."""
    mig = (("3g.40gb", 0), ("3g.40gb", 4))
    return S.static_slices(node, [S.Gpu(i, dra.node_uuid(node, i), mig if i == 2 else ()) for i in range(8)])


def setup(kube: Kube, group: str, ns_prefix: str, **policy: Any) -> str:
    ns = ensure_namespace(kube, f"{ns_prefix}-{group}"[:60])
    dra.publish_device_classes(kube)
    dra.create_claim_template(kube, ns, "mig", 1, cel=dra.MIG_CEL)
    dra.create_claim_template(kube, ns, "full", 1, cel=dra.FULL_GPU_CEL)
    safety = {"probation": "2s", "maxUnhealthyGPUs": 8}
    kube.apply_policy(group, policy_spec(group, safety=safety, **policy))
    return ns


def test_the_real_scheduler_allocates_both_shapes_and_honours_the_counters(
    cluster: LocalCluster, kube: Kube, group: str
) -> None:
    static, part = make_nodes(cluster, group, 2)
    ns = ensure_namespace(kube, f"ps-{group}"[:60])
    dra.publish_device_classes(kube)
    dra.create_claim_template(kube, ns, "mig", 1, cel=dra.MIG_CEL)
    dra.create_claim_template(kube, ns, "full", 1, cel=dra.FULL_GPU_CEL)
    dra.publish(kube, static_mig_node(static))
    pub = S.partitionable_slices(part, gpus(part, 2), profiles=["3g.40gb", "7g.80gb"])
    dra.publish(kube, pub)
    for name, template, node in (("m0", "mig", static), ("m1", "mig", static), ("f0", "full", static)):
        kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, name, template, node))
    got = {n: dra.wait_allocated(kube, ns, n) for n in ("m0", "m1", "f0")}
    assert sorted(got["m0"] + got["m1"]) == sorted(MIG2)
    assert got["f0"][0] in {f"gpu-{i}" for i in range(8) if i != 2}
    # Partitionable: two whole GPUs consume both counter sets; no placement is left.
    for name in ("w0", "w1"):
        kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, name, "full", part))
    whole = {n: dra.wait_allocated(kube, ns, n)[0] for n in ("w0", "w1")}
    assert sorted(whole.values()) == ["gpu-0", "gpu-1"]
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "p0", "mig", part))
    dra.wait_unschedulable(kube, ns, "p0")
    kube.core.delete_namespaced_pod("w1", ns)
    assert dra.wait_allocated(kube, ns, "p0", timeout=90)[0].startswith(f"{whole['w1']}-mig-")


def test_static_mig_gpu_is_held_out_with_its_mig_devices_only_and_returns(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.put_report(node, healthy(node))
    ns = setup(kube, group, "pm", actions={"drain": {"checkpointMode": "annotation"}})
    dra.publish(kube, static_mig_node(node))
    for name, template in (("mig-a", "mig"), ("mig-b", "mig"), ("full", "full")):
        kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, name, template, node))
        dra.wait_allocated(kube, ns, name)
    foreign: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": f"sre-{group}"[:60]},
        "spec": {
            "deviceSelector": {"driver": dra.DRIVER, "pool": node, "device": MIG2[1]},
            "taint": {"key": "example.com/suspect", "value": "fan", "effect": "None"},
        },
    }
    kube.custom.create_cluster_custom_object(dra.G, dra.V, "devicetaintrules", foreign)

    kube.put_report(node, ecc(node, 2))
    want = {f"gpuhealth-{node}-{d}": d for d in MIG2}
    wait_for(lambda: ours(kube, node) == want, timeout=30, what="rules for exactly GPU 2's MIG devices")
    for name in want:
        taint = rules_of(kube, node)[name]["spec"]["taint"]
        assert (taint["key"], taint["value"], taint["effect"]) == (
            "gpuhealth.dev/unhealthy",
            "EccUncorrected",
            "NoSchedule",
        )
    rec = device(kube, node, 2)
    assert rec["devices"] == [f"{dra.DRIVER}/{node}/{d}" for d in MIG2] and rec["taintRules"] == sorted(want)
    status = kube.report(node)["status"]
    assert status["state"] == "Degraded" and status["inServiceGPUs"] == 7
    assert kube.our_taint(node) is None and not kube.node(node)["spec"].get("unschedulable")
    events = " ".join(e.message for e in kube.await_events(node, "DeviceQuarantined"))
    assert f"GPU 2 ({dra.node_uuid(node, 2)})" in events and f"its 2 MIG devices {MIG2[0]}, {MIG2[1]}" in events

    # Both pods on GPU 2's MIG devices are asked to checkpoint, then evicted; the full-GPU pod stays.
    def asked(pod: str) -> bool:
        return CHECKPOINT_REQUESTED in pod_annotations(kube, ns, pod)

    wait_for(lambda: asked("mig-a") and asked("mig-b"), timeout=30, what="both MIG pods asked to checkpoint")
    for pod in ("mig-a", "mig-b"):
        kube.core.patch_namespaced_pod(pod, ns, {"metadata": {"annotations": {CHECKPOINT_COMPLETED: utcnow()}}})
    wait_for(
        lambda: gone_or_deleting(kube, ns, "mig-a") and gone_or_deleting(kube, ns, "mig-b"),
        timeout=30,
        what="both MIG pods evicted",
    )
    assert CHECKPOINT_REQUESTED not in pod_annotations(kube, ns, "full") and not gone_or_deleting(kube, ns, "full")
    wait_for(lambda: device(kube, node, 2).get("state") == "Quarantined", timeout=30, what="device drain done")

    # A new MIG claim cannot get them: GPU 2's are the node's only MIG devices.
    for name in want:
        dra.wait_rule_seen(kube, name)
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "fresh", "mig", node))
    dra.wait_unschedulable(kube, ns, "fresh")
    kube.core.delete_namespaced_pod("fresh", ns)

    # Probation: every rule of the GPU goes; the foreign rule on one of its devices stays.
    kube.put_report(node, healthy(node))
    wait_for(lambda: ours(kube, node) == {}, timeout=40, what="GPU 2's rules deleted after probation")
    assert foreign["metadata"]["name"] in rules_of(kube, node)
    assert rules_of(kube, node)[foreign["metadata"]["name"]]["spec"]["taint"]["key"] == "example.com/suspect"
    wait_for(lambda: device(kube, node, 2).get("state") == "InService", timeout=20, what="GPU 2 in service")
    assert "taintRules" not in device(kube, node, 2)
    kube.custom.delete_cluster_custom_object(dra.G, dra.V, "devicetaintrules", foreign["metadata"]["name"])


def mig_spec(node: str, xids: list[tuple[int, int]]) -> dict[str, Any]:
    """GPU 2 MIG-enabled with the two instances static_mig_node publishes (GI 1 on MIG2[0], GI 2 on
    MIG2[1]), and XID 13 once per (seconds ago, GPU instance) in ``xids``, attributed by NVML."""
    spec = healthy(node)
    gpu2 = spec["devices"][2]
    gpu2["migMode"] = "Enabled"
    gpu2["migDevices"] = [
        {"index": i, "uuid": mig, "gpuInstanceId": i + 1, "computeInstanceId": 0, "profile": "3g.40gb"}
        for i, mig in enumerate(S.mig_uuid(gpu2["uuid"], "3g.40gb", start) for start in (0, 4))
    ]
    now = dt.datetime.now(dt.UTC)
    spec["xidEvents"] = [
        {
            "xid": 13,
            "gpu": 2,
            "uuid": gpu2["uuid"],
            "time": (now - dt.timedelta(seconds=ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "source": "nvml",
            "gpuInstanceId": gi,
            "computeInstanceId": 0,
        }
        for ago, gi in xids
    ]
    return spec


def test_application_xids_repeated_on_one_mig_instance_hold_out_that_mig_device_only(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.put_report(node, healthy(node))
    ns = setup(kube, group, "pi", actions={"drain": {"maxWait": "1s"}})
    dra.publish(kube, static_mig_node(node))
    for name in ("tenant-a", "tenant-b"):
        kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, name, "mig", node))
    held = {name: dra.wait_allocated(kube, ns, name)[0] for name in ("tenant-a", "tenant-b")}
    assert sorted(held.values()) == sorted(MIG2)
    a_device, b_device = held["tenant-a"], held["tenant-b"]
    a_gi = MIG2.index(a_device) + 1
    b_gi = 3 - a_gi
    a_uuid = S.mig_uuid(dra.node_uuid(node, 2), "3g.40gb", (0, 4)[a_gi - 1])

    # Three XID 13 on GPU 2, two on A's instance and one on B's: the GPU's sum reaches the repeat
    # count (3), neither instance does. Once the operator has judged that report, nothing is out.
    kube.put_report(node, mig_spec(node, [(30, a_gi), (20, b_gi), (10, a_gi)]))
    wait_for(lambda: kube.report(node).get("status", {}).get("lastXid") == "13 (GPU 2)", timeout=30, what="judged")
    status = kube.report(node)["status"]
    assert status["state"] == "Healthy" and status["inServiceGPUs"] == 8, status
    assert device(kube, node, 2).get("state", "InService") == "InService"
    assert ours(kube, node) == {}

    # A third on A's instance: A's MIG device alone is held out.
    kube.put_report(node, mig_spec(node, [(30, a_gi), (20, b_gi), (10, a_gi), (1, a_gi)]))
    want = {f"gpuhealth-{node}-{a_device}": a_device}
    wait_for(lambda: ours(kube, node) == want, timeout=30, what="a rule for A's MIG device only")
    taint = rules_of(kube, node)[f"gpuhealth-{node}-{a_device}"]["spec"]["taint"]
    assert (taint["key"], taint["value"], taint["effect"]) == (
        "gpuhealth.dev/unhealthy",
        "RepeatedAppXID",
        "NoSchedule",
    )
    rec = device(kube, node, 2)
    assert rec["reason"] == "RepeatedAppXID" and rec["instances"] == [a_uuid]
    assert rec["devices"] == rec["partitions"] == [f"{dra.DRIVER}/{node}/{a_device}"]
    assert f"MIG device GI {a_gi} CI 0 (3g.40gb, {a_uuid})" in rec["message"]
    status = kube.report(node)["status"]
    assert status["state"] == "Degraded" and status["inServiceGPUs"] == 8  # GPU 2 serves on with B
    assert kube.our_taint(node) is None and not kube.node(node)["spec"].get("unschedulable")

    # A's pod leaves; B's pod and B's device are untouched.
    wait_for(lambda: gone_or_deleting(kube, ns, "tenant-a"), timeout=30, what="A's pod drained")
    wait_for(lambda: device(kube, node, 2).get("state") == "Quarantined", timeout=30, what="device drain done")
    assert not gone_or_deleting(kube, ns, "tenant-b")
    assert CHECKPOINT_REQUESTED not in pod_annotations(kube, ns, "tenant-b")
    assert all(r["spec"]["deviceSelector"]["device"] != b_device for r in rules_of(kube, node).values())
    assert ours(kube, node) == want
    assert kube.our_taint(node) is None and not kube.node(node)["spec"].get("unschedulable")


def test_describe_shows_each_mig_instance_with_its_pod_and_the_held_out_one_marked(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    """The real plugin against the real API: the pods the scheduler put on each MIG device, and the
    instance an application XID repeated on held out by its own rule (cordon: the pods stay)."""
    (node,) = make_nodes(cluster, group, 1)
    kube.put_report(node, healthy(node))
    ns = setup(kube, group, "pd", rules={"xid": {"applicationRepeat": {"action": "cordon"}}})
    dra.publish(kube, static_mig_node(node))
    for name, template in (("tenant-a", "mig"), ("tenant-b", "mig"), ("whole", "full")):
        kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, name, template, node))
    held = {name: dra.wait_allocated(kube, ns, name)[0] for name in ("tenant-a", "tenant-b")}
    a_device, b_device = held["tenant-a"], held["tenant-b"]
    a_gi = MIG2.index(a_device) + 1
    kube.put_report(node, mig_spec(node, [(30, a_gi), (20, a_gi), (10, a_gi)]))
    rule = f"gpuhealth-{node}-{a_device}"
    wait_for(lambda: ours(kube, node) == {rule: a_device}, timeout=30, what="a rule for A's MIG device only")

    lines = ok(plugin(cluster, "describe", node)).splitlines()
    start = lines.index("MIG layout (each instance, whether it is held out, the pods on it):")
    assert lines[start + 1].strip() == f"GPU 2 ({dra.node_uuid(node, 2)}): MIG Enabled, DRA devices"
    rows = {ln.split()[0]: ln for ln in lines[start + 3 : start + 5]}
    assert set(rows) == set(MIG2), lines[start : start + 6]
    assert f"HELD OUT ({rule})" in rows[a_device] and rows[a_device].endswith(f"{ns}/tenant-a")
    assert "HELD OUT" not in rows[b_device] and rows[b_device].endswith(f"{ns}/tenant-b")
    b_uuid = S.mig_uuid(dra.node_uuid(node, 2), "3g.40gb", (0, 4)[2 - a_gi])
    assert rows[b_device].split()[1:5] == ["3g.40gb", str(3 - a_gi), "0", b_uuid]
    assert f"{ns}/whole" not in "\n".join(lines[start:])  # its full GPU is not MIG: no layout

    (gpu,) = json.loads(ok(plugin(cluster, "describe", node, "-o", "json")))["migLayout"]
    by_device = {i["device"]: i for i in gpu["instances"]}
    assert by_device[a_device]["pods"] == [f"{ns}/tenant-a"] and by_device[a_device]["taintRule"] == rule
    assert by_device[b_device]["pods"] == [f"{ns}/tenant-b"] and not by_device[b_device]["heldOut"]


def test_partitionable_gpu_is_held_out_with_every_placement(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.put_report(node, healthy(node))
    ns = setup(kube, group, "pp", actions={"drain": {"maxWait": "1s"}})
    pub = S.partitionable_slices(node, gpus(node, 2))
    dra.publish(kube, pub)
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "slice", "mig", node))
    (placement,) = dra.wait_allocated(kube, ns, "slice")
    bad = int(placement.split("-")[1])
    other = 1 - bad

    kube.put_report(node, ecc(node, bad))
    want = {f"gpuhealth-{node}-{d}": d for d in pub.devices[dra.node_uuid(node, bad)]}
    assert f"gpu-{bad}" in want.values() and len(want) == 15
    wait_for(lambda: ours(kube, node) == want, timeout=30, what=f"rules for gpu-{bad} and every gpu-{bad}-mig-*")
    wait_for(lambda: gone_or_deleting(kube, ns, "slice"), timeout=30, what="the pod on the placement moved")
    assert kube.our_taint(node) is None
    assert device(kube, node, bad)["device"] == f"{dra.DRIVER}/{node}/gpu-{bad}"  # the full device first

    for name in want:
        dra.wait_rule_seen(kube, name)
    for i in range(2):
        kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, f"fresh-{i}", "mig", node))
        (dev,) = dra.wait_allocated(kube, ns, f"fresh-{i}")
        assert dev.startswith(f"gpu-{other}-mig-"), f"a new MIG claim got {dev} of the held-out GPU {bad}"
    metric = f'gpuhealth_device_rules{{kind="mig",policy="{group}"}} 14.0'
    wait_for(lambda: metric in operator.metrics(), timeout=30, what="the rule gauge by kind")


def test_operator_killed_between_rule_writes_converges_with_one_rule_per_device(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    kube.put_report(node, healthy(node))
    ns = setup(kube, group, "pk", actions={"drain": {"checkpointMode": "annotation"}})
    pub = S.partitionable_slices(node, gpus(node, 1), profiles=["3g.40gb", "7g.80gb"])
    dra.publish(kube, pub)
    kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, "rank-0", "mig", node))
    dra.wait_allocated(kube, ns, "rank-0")
    kube.put_report(node, ecc(node, 0))
    want = {f"gpuhealth-{node}-{d}": d for d in pub.devices[dra.node_uuid(node, 0)]}
    wait_for(lambda: ours(kube, node) == want, timeout=30, what="all four rules")
    wait_for(lambda: CHECKPOINT_REQUESTED in pod_annotations(kube, ns, "rank-0"), timeout=30, what="checkpoint")
    wait_for(lambda: len(kube.node_events(node, "CheckpointRequested")) == 1, timeout=20, what="request announced")
    # Killed between two rule writes: the record names all four rules, two of them were never written.
    operator.kill()
    lost = sorted(want)[1:3]
    for name in lost:
        kube.custom.delete_cluster_custom_object(dra.G, dra.V, "devicetaintrules", name)
    assert device(kube, node, 0)["taintRules"] == sorted(want)
    operator.start()
    wait_for(lambda: ours(kube, node) == want, timeout=30, what="the missing rules written after the restart")
    kube.core.patch_namespaced_pod("rank-0", ns, {"metadata": {"annotations": {CHECKPOINT_COMPLETED: utcnow()}}})
    wait_for(lambda: gone_or_deleting(kube, ns, "rank-0"), timeout=30, what="the pod evicted")
    wait_for(lambda: device(kube, node, 0).get("state") == "Quarantined", timeout=30, what="device drain done")
    selected = collections.Counter(
        r["spec"]["deviceSelector"]["device"]
        for r in dra_rules(kube)
        if r["spec"]["deviceSelector"].get("pool") == node and r["spec"]["taint"]["key"] == "gpuhealth.dev/unhealthy"
    )
    assert selected == collections.Counter(want.values()), "exactly one rule per device"
    assert len(kube.node_events(node, "CheckpointRequested")) == 1, "asked once, not again after the restart"
    wait_for(lambda: len(kube.node_events(node, "Evicted")) == 1, timeout=20, what="eviction announced")


def dra_rules(kube: Kube) -> list[dict[str, Any]]:
    return list(kube.custom.list_cluster_custom_object(dra.G, dra.V, "devicetaintrules").get("items") or [])


def test_device_plugin_mig_takes_the_node_and_says_why(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    node = f"{group}-plugin-mig"[:63]
    manifest = gpu_node_manifest(node, labels={"gpuhealth-test": group, "nvidia.com/mig.strategy": "mixed"})
    for key in ("capacity", "allocatable"):
        manifest["status"][key]["nvidia.com/gpu"] = "7"
        manifest["status"][key]["nvidia.com/mig-3g.40gb"] = "2"
    cluster.kubectl("create", "--validate=false", "-f", "-", input=json.dumps(manifest))  # as add_gpu_nodes
    cluster.wait_nodes_ready(1, selector=f"gpuhealth-test={group}")
    kube.put_report(node, healthy(node))
    kube.apply_policy(group, policy_spec(group, safety={"maxUnhealthyGPUs": 8}))
    kube.put_report(node, ecc(node, 2))
    wait_for(lambda: kube.our_taint(node) is not None, timeout=30, what="node quarantine")
    msgs = wait_for(
        lambda: [e.message for e in kube.node_events(node, "NodeScopeFallback")], timeout=20, what="fallback Event"
    )
    assert "GPU 2:" in msgs[0] and "published through the device plugin (nvidia.com/mig-3g.40gb)" in msgs[0]
    assert "no per-device API" in msgs[0] and "whole node is quarantined" in msgs[0]
    assert not rules_of(kube, node)


def test_a_mig_gpu_is_reset_and_validated_alone_once_all_its_instances_are_drained(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, group: str
) -> None:
    """ECC on MIG-enabled GPU 2: both its instances held out and drained, ONE reset, then ONE validation
    Job for GPU 2 alone (DCGM diagnoses a MIG GPU only with every instance idle), a pass, both back."""
    (node,) = make_nodes(cluster, group, 1)
    kube.put_report(node, healthy(node))
    setup_namespace(kube)
    ns = setup(
        kube,
        group,
        "pv",
        actions={"drain": {"checkpointMode": "annotation"}},
        remediation={"enabled": True},
        validation={"enabled": True, "level": 2, "jobTemplate": validation_job_template(2)},
    )
    dra.publish(kube, static_mig_node(node))
    for name, template in (("mig-a", "mig"), ("mig-b", "mig"), ("full", "full")):
        kube.core.create_namespaced_pod(ns, dra.claim_pod(ns, name, template, node))
        dra.wait_allocated(kube, ns, name)

    def validations() -> list[Any]:
        return [j for j in jobs_of(kube, node) if "gpuhealth.dev/validation-level" in (j.metadata.labels or {})]

    def resets() -> list[Any]:
        return [j for j in jobs_of(kube, node) if "gpuhealth.dev/validation-level" not in (j.metadata.labels or {})]

    kube.put_report(node, ecc(node, 2))
    want = {f"gpuhealth-{node}-{d}": d for d in MIG2}
    wait_for(lambda: ours(kube, node) == want, timeout=30, what="rules for both of GPU 2's MIG devices")
    wait_for(
        lambda: all(CHECKPOINT_REQUESTED in pod_annotations(kube, ns, p) for p in ("mig-a", "mig-b")),
        timeout=30,
        what="both MIG pods asked to checkpoint",
    )
    assert not jobs_of(kube, node), "nothing runs on the GPU while its instances' pods run"
    for pod in ("mig-a", "mig-b"):
        kube.core.patch_namespaced_pod(pod, ns, {"metadata": {"annotations": {CHECKPOINT_COMPLETED: utcnow()}}})
    (reset,) = wait_for(resets, timeout=60, what="one reset Job for GPU 2, once both instances are drained")
    assert gone_or_deleting(kube, ns, "mig-a") and gone_or_deleting(kube, ns, "mig-b")
    assert reset.metadata.labels["gpuhealth.dev/gpu"] == "2"
    wait_for(lambda: job_done(resets()[0], "Complete"), timeout=60, what="the reset Job succeeded (KWOK)")
    wait_for(lambda: ladder(kube, node, 2).get("phase") == "Verifying", timeout=30, what="waiting for clean facts")
    kube.put_report(node, healthy(node))
    (job,) = wait_for(validations, timeout=30, what="one validation Job")
    assert job.metadata.labels["gpuhealth.dev/gpu"] == "2"
    (container,) = job.spec.template.spec.containers
    assert container.command == ["dcgmi", "diag", "-r", "2", "-i", "2", "--json"], "GPU 2 alone"
    assert ours(kube, node) == want, "every instance still held out while it is validated"
    wait_for(lambda: ours(kube, node) == {}, timeout=60, what="GPU 2's instances back after the pass")
    wait_for(lambda: device(kube, node, 2).get("state") == "InService", timeout=20, what="GPU 2 in service")
    assert len(validations()) == 1 and len(resets()) == 1
    assert not gone_or_deleting(kube, ns, "full"), "the other GPUs served throughout"
    kube.await_events(node, "ValidationPassed")
