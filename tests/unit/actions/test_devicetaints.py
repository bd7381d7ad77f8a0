"""DeviceTaintRule builder and planner; which pods hold a device (from claims and pods)."""

from __future__ import annotations

from typing import Any

from gpuhealth.actions.devicetaints import build_rule, is_ours, plan_rules, rule_name, taint_value
from gpuhealth.actions.slices import DeviceRef
from gpuhealth.drain.claims import claim_devices, pod_claim_names, pods_holding

GPU3 = DeviceRef("gpu.nvidia.com", "node-a", "gpu-3")
GPU5 = DeviceRef("gpu.nvidia.com", "node-a", "gpu-5")


def existing(rule: dict[str, Any], uid: str = "u1") -> dict[str, Any]:
    out = dict(rule)
    out["metadata"] = {**rule["metadata"], "uid": uid}
    return out


# --- builder -----------------------------------------------------------------------------------


def test_rule_for_one_gpu() -> None:
    r = build_rule(GPU3, "EccUncorrected", index=3, uuid="GPU-3")
    assert r["apiVersion"] == "resource.k8s.io/v1" and r["kind"] == "DeviceTaintRule"
    assert r["metadata"]["name"] == "gpuhealth-node-a-gpu-3"
    assert r["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "gpuhealth",
        "gpuhealth.dev/node": "node-a",
        "gpuhealth.dev/gpu": "3",
        "gpuhealth.dev/device-kind": "gpu",
    }
    assert r["metadata"]["annotations"] == {"gpuhealth.dev/uuid": "GPU-3"}
    assert r["spec"] == {
        "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-3"},
        "taint": {"key": "gpuhealth.dev/unhealthy", "value": "EccUncorrected", "effect": "NoSchedule"},
    }


def test_dry_run_rule_has_effect_none() -> None:
    assert build_rule(GPU3, "XID48", dry_run=True)["spec"]["taint"]["effect"] == "None"


def test_names_are_deterministic_distinct_and_valid() -> None:
    assert rule_name(GPU3) == rule_name(DeviceRef("gpu.nvidia.com", "node-a", "gpu-3"))
    other_driver = rule_name(DeviceRef("gpu.example.org", "node-a", "gpu-3"))
    assert other_driver != rule_name(GPU3) and other_driver.startswith("gpuhealth-node-a-gpu-3-")
    long = rule_name(DeviceRef("gpu.nvidia.com", "n" * 250, "gpu-3"))
    assert len(long) <= 253 and long != rule_name(DeviceRef("gpu.nvidia.com", "n" * 251, "gpu-3"))
    assert rule_name(DeviceRef("gpu.nvidia.com", "Node_A", "gpu-3")).startswith("gpuhealth-node-a-gpu-3-")


def test_long_pool_name_gets_no_node_label_and_reasons_become_label_values() -> None:
    r = build_rule(DeviceRef("gpu.nvidia.com", "n" * 70, "gpu-0"), "a reason with spaces!")
    assert "gpuhealth.dev/node" not in r["metadata"]["labels"]
    assert r["spec"]["taint"]["value"] == "a-reason-with-spaces"
    assert taint_value("!!!") == "Unhealthy" and len(taint_value("x" * 100)) == 63


# --- planner -----------------------------------------------------------------------------------


def test_creates_what_is_missing_and_deletes_what_is_no_longer_wanted() -> None:
    old = existing(build_rule(GPU5, "Thermal"), uid="u5")
    plan = plan_rules([build_rule(GPU3, "EccUncorrected")], [old])
    assert plan.delete == (("gpuhealth-node-a-gpu-5", "u5"),)
    assert [r["metadata"]["name"] for r in plan.create] == ["gpuhealth-node-a-gpu-3"]


def test_converged_is_empty_and_idempotent() -> None:
    want = [build_rule(GPU3, "EccUncorrected")]
    assert plan_rules(want, [existing(want[0])]).empty


def test_changed_effect_is_recreated() -> None:
    dry = existing(build_rule(GPU3, "XID48", dry_run=True), uid="u3")
    plan = plan_rules([build_rule(GPU3, "XID48")], [dry])
    assert plan.delete == (("gpuhealth-node-a-gpu-3", "u3"),)
    assert plan.create[0]["spec"]["taint"]["effect"] == "NoSchedule"


def test_foreign_rules_are_never_touched() -> None:
    foreign = existing(build_rule(GPU3, "Theirs"), uid="f1")
    foreign["metadata"] = {"name": "sre-gpu-3", "uid": "f1", "labels": {"team": "sre"}}
    same_name = existing(build_rule(GPU5, "Theirs"), uid="f2")
    same_name["metadata"] = {"name": "gpuhealth-node-a-gpu-5", "uid": "f2"}
    assert not is_ours(foreign) and not is_ours(same_name)
    plan = plan_rules([], [foreign, same_name])
    assert plan.empty
    plan = plan_rules([build_rule(GPU5, "EccUncorrected")], [foreign, same_name])
    assert plan.delete == ()  # the create will answer 409; the other owner's rule stays


# --- which pods hold a device ------------------------------------------------------------------


def claim(name: str, devices: list[DeviceRef], reserved: tuple[str, ...] = (), ns: str = "team") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": d.driver, "pool": d.pool, "device": d.device} for d in devices
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in reserved],
        },
    }


def pod(name: str, ns: str = "team", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {}, "status": status}


def test_claim_devices() -> None:
    assert claim_devices(claim("c", [GPU3, GPU5])) == {GPU3, GPU5}
    assert claim_devices({"metadata": {"name": "pending"}}) == set()


def test_reserved_for_names_the_pods() -> None:
    claims = [claim("c3", [GPU3], ("rank-0",)), claim("c5", [GPU5], ("rank-1",))]
    assert pods_holding([GPU3], claims) == {"team/rank-0"}
    assert pods_holding([GPU3, GPU5], claims) == {"team/rank-0", "team/rank-1"}
    assert pods_holding([DeviceRef("gpu.nvidia.com", "node-b", "gpu-3")], claims) == set()


def test_pod_status_names_claims_from_templates_and_extended_resources() -> None:
    claims = [claim("rank-0-gpu-x7", [GPU3]), claim("ext-claim", [GPU5]), claim("rank-0-gpu-x7", [GPU5], ns="other")]
    pods = [
        pod("rank-0", resourceClaimStatuses=[{"name": "gpu", "resourceClaimName": "rank-0-gpu-x7"}]),
        pod("plugin-style", extendedResourceClaimStatus={"resourceClaimName": "ext-claim", "requestMappings": []}),
        pod("bystander", resourceClaimStatuses=[{"name": "gpu", "resourceClaimName": "other-claim"}]),
        pod("rank-0", ns="elsewhere", resourceClaimStatuses=[{"name": "gpu", "resourceClaimName": "rank-0-gpu-x7"}]),
    ]
    assert pods_holding([GPU3], claims, pods) == {"team/rank-0"}
    assert pods_holding([GPU5], claims, pods) == {"team/plugin-style"}


def test_shared_claim_referenced_in_spec() -> None:
    p = {
        "metadata": {"name": "p", "namespace": "team"},
        "spec": {"resourceClaims": [{"name": "g", "resourceClaimName": "shared"}]},
    }
    assert pod_claim_names(p) == {"shared"}
    assert pods_holding([GPU3], [claim("shared", [GPU3])], [p]) == {"team/p"}
