"""Pure Kueue decisions: the topology assignment's nodes, the admission verdict, moves instead of evictions."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpuhealth.drain import kueue as K
from gpuhealth.drain.plan import Step

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
CHECK = "gpuhealth"


def wl(
    *,
    gpus: int = 8,
    flavor: str = "h100",
    topology: dict[str, Any] | None = None,
    conditions: tuple[str, ...] = ("QuotaReserved",),
    state: str = "Pending",
) -> dict[str, Any]:
    psa: dict[str, Any] = {
        "name": "main",
        "flavors": {"nvidia.com/gpu": flavor},
        "resourceUsage": {"nvidia.com/gpu": str(gpus)},
    }
    if topology:
        psa["topologyAssignment"] = topology
    return {
        "metadata": {
            "name": "job-llm",
            "namespace": "ml",
            "uid": "u1",
            "resourceVersion": "7",
            "ownerReferences": [{"kind": "Job", "name": "llm", "controller": True}],
        },
        "status": {
            "conditions": [{"type": c, "status": "True"} for c in conditions],
            "admission": {"clusterQueue": "cq", "podSetAssignments": [psa]},
            "admissionChecks": [{"name": CHECK, "state": state}],
        },
    }


def node(name: str, out: int = 0, gpus: int = 8, pool: str = "a") -> K.NodeCapacity:
    return K.NodeCapacity(name, {"pool": pool}, gpus, out, "Draining: XidFatal" if out else "")


def test_hosts_decodes_universal_and_individual_values_at_the_hostname_level() -> None:
    ta = {
        "levels": ["rack", "kubernetes.io/hostname"],
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [
                    {"universal": "r1"},
                    {"individual": {"prefix": "gpu-", "suffix": "-x", "roots": ["1", "2"]}},
                ],
                "podCounts": {"universal": 2},
            },
            {
                "domainCount": 1,
                "valuesPerLevel": [{"universal": "r2"}, {"universal": "gpu-9"}],
                "podCounts": {"universal": 4},
            },
        ],
    }
    assert K.hosts({"topologyAssignment": ta}) == ["gpu-1-x", "gpu-2-x", "gpu-9"]
    assert K.hosts({"topologyAssignment": {"levels": ["rack"], "slices": []}}) is None
    assert K.hosts({}) is None


def test_ready_when_nothing_assigned_is_held_out() -> None:
    v = K.admission_verdict(wl(), {"h100": {"pool": "a"}}, [node("n1"), node("n2")], {})
    assert v.state == K.READY and v.requeue_after_s is None


def test_retry_when_the_flavor_cannot_hold_the_assignment_without_held_out_gpus() -> None:
    nodes = [node("n1", out=8), node("n2"), node("other", out=8, pool="b")]
    v = K.admission_verdict(wl(gpus=16), {"h100": {"pool": "a"}}, nodes, {})
    assert v.state == K.RETRY and v.requeue_after_s == K.ADMISSION_REQUEUE_S
    assert "n1 (8 GPUs: Draining: XidFatal)" in v.message and "other" not in v.message
    assert "16 nvidia.com/gpu assigned" in v.message and "8 left" in v.message
    # What other admitted Workloads use counts against what is left.
    assert K.admission_verdict(wl(gpus=8), {"h100": {"pool": "a"}}, nodes, {}).state == K.READY
    assert K.admission_verdict(wl(gpus=8), {"h100": {"pool": "a"}}, nodes, {"h100": 4}).state == K.RETRY


def test_a_topology_assignment_on_a_held_out_node_is_retried_and_elsewhere_ready() -> None:
    def on(host: str) -> dict[str, Any]:
        return {
            "levels": ["kubernetes.io/hostname"],
            "slices": [{"domainCount": 1, "valuesPerLevel": [{"universal": host}], "podCounts": {"universal": 4}}],
        }

    nodes = [node("n1", out=2), node("n2")]
    bad = K.admission_verdict(wl(topology=on("n1")), {"h100": {"pool": "a"}}, nodes, {})
    assert bad.state == K.RETRY and "topology assignment" in bad.message and "n1" in bad.message
    assert K.admission_verdict(wl(topology=on("n2")), {"h100": {"pool": "a"}}, nodes, {}).state == K.READY


def test_an_unreadable_flavor_is_left_to_kueue() -> None:
    assert K.admission_verdict(wl(gpus=16), {"h100": None}, [node("n1", out=8), node("n2")], {}).state == K.READY


def dra_wl(usage: dict[str, int], flavor: str = "h100") -> dict[str, Any]:
    """A Workload whose podSets Kueue accounted by quota name (``whole-gpus``: a DRA DeviceClass mapped
    by Kueue's ``deviceClassMappings``), one podSet per name."""
    w = wl(flavor=flavor)
    w["status"]["admission"]["podSetAssignments"] = [
        {"name": f"ps-{i}", "flavors": {name: flavor}, "resourceUsage": {name: str(n)}}
        for i, (name, n) in enumerate(sorted(usage.items()))
    ]
    return w


def dra_node(name: str, held: int) -> K.NodeCapacity:
    """A DRA node with ``held`` GPUs held out one by one (DeviceTaintRules; the node is not tainted)."""
    return K.NodeCapacity(name, {"pool": "a"}, 8, held, f"{held} GPUs held out one by one" if held else "")


def test_a_mapped_dra_quota_name_counts_only_when_configured() -> None:
    both = ("nvidia.com/gpu", "whole-gpus")
    nodes = [dra_node("d1", held=1), dra_node("d2", held=0)]
    w = dra_wl({"whole-gpus": 16})
    assert K.gpu_demand(w) == {} and K.gpu_demand(w, both) == {"h100": 16}
    # Not one of the configured names: nothing to count, Kueue's quota alone decides.
    assert K.admission_verdict(w, {"h100": {"pool": "a"}}, nodes, {}).state == K.READY
    v = K.admission_verdict(w, {"h100": {"pool": "a"}}, nodes, {}, both)
    assert v.state == K.RETRY and "16 whole-gpus assigned" in v.message and "15 left" in v.message
    assert "d1 (1 GPUs: 1 GPUs held out one by one)" in v.message and "d2" not in v.message
    assert K.admission_verdict(dra_wl({"whole-gpus": 15}), {"h100": {"pool": "a"}}, nodes, {}, both).state == K.READY


def test_device_plugin_and_dra_quota_names_on_one_flavor_add_up() -> None:
    both = ("nvidia.com/gpu", "whole-gpus")
    w = dra_wl({"nvidia.com/gpu": 8, "whole-gpus": 8})
    assert K.gpu_usage(w, both) == {"h100": {"nvidia.com/gpu": 8, "whole-gpus": 8}}
    # A node tainted (all 8 out) and a DRA node with 2 GPUs under DeviceTaintRules: 14 of 24 left.
    nodes = [node("n1", out=8), dra_node("d1", held=2), dra_node("d2", held=0)]
    v = K.admission_verdict(w, {"h100": {"pool": "a"}}, nodes, {}, both)
    assert v.state == K.RETRY and "16 nvidia.com/gpu + whole-gpus assigned" in v.message, v.message
    assert "holds out 10 of the flavor's 24" in v.message and "14 left" in v.message
    assert K.admission_verdict(dra_wl({"whole-gpus": 14}), {"h100": {"pool": "a"}}, nodes, {}, both).state == K.READY


def test_conditions_and_our_check() -> None:
    assert K.reserved(wl()) and not K.running(wl())
    assert K.running(wl(conditions=("QuotaReserved", "Admitted")))
    assert not K.running(wl(conditions=("QuotaReserved", "Admitted", "Evicted")))
    assert not K.reserved(wl(conditions=("QuotaReserved", "Finished")))
    assert K.check_of(wl(), [CHECK]) == {"name": CHECK, "state": "Pending"}
    assert K.check_of(wl(), ["someone-else"]) is None
    assert K.workload_owner(wl()) == "ml/Job=llm"


def test_check_apply_sets_only_our_entry_with_the_workloads_resource_version() -> None:
    body = K.check_apply(wl(), CHECK, K.Verdict(K.RETRY, "x" * 40000, 30), T0)
    assert body["metadata"] == {"name": "job-llm", "namespace": "ml", "resourceVersion": "7"}
    (entry,) = body["status"]["admissionChecks"]
    assert entry["state"] == "Retry" and entry["requeueAfterSeconds"] == 30
    assert len(entry["message"]) == K.MAX_MESSAGE and entry["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    assert (
        "requeueAfterSeconds"
        not in K.check_apply(wl(), CHECK, K.Verdict(K.READY, "ok"), T0)["status"]["admissionChecks"][0]
    )


def test_pods_are_matched_by_kueues_annotation_or_their_owner() -> None:
    pod = {
        "metadata": {
            "name": "llm-0",
            "namespace": "ml",
            "annotations": {K.WORKLOAD_ANNOTATION: "job-llm"},
            "ownerReferences": [{"kind": "Job", "name": "llm", "controller": True}],
        }
    }
    assert K.pod_refs(pod) == ("ml/job-llm", "ml/Job=llm")
    assert K.pod_refs({"metadata": {"name": "p", "namespace": "ml"}}) == (None, None)


def test_evictions_of_movable_pods_become_one_move_per_workload() -> None:
    def pod(name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ml", "uid": name}}

    steps = [
        Step("request", pod("a0"), "ask"),
        Step("evict", pod("a1"), "acked"),
        Step("evict", pod("a2"), "acked"),
        Step("evict", pod("plain"), "acked"),
    ]
    moves = K.split_moves(steps, lambda p: "ml/wl-a" if p["metadata"]["name"].startswith("a") else None)
    assert [s.key for s in moves.pod_steps] == ["ml/a0", "ml/plain"]
    assert {k: [s.key for s in v] for k, v in moves.workloads.items()} == {"ml/wl-a": ["ml/a1", "ml/a2"]}


def test_the_move_message_names_the_node_the_fault_and_why_now() -> None:
    m = K.move_message("n1", "XID79: GPU 3 (GPU-3): XID 79", "checkpoint not acknowledged within 3s: evicting anyway")
    assert m == (
        "gpuhealth is taking n1 out of service (XID79: GPU 3 (GPU-3): XID 79); "
        "checkpoint not acknowledged within 3s: moving the Workload as a whole"
    )
