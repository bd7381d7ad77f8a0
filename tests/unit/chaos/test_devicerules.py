"""The device_kills invariants fire on a violating history and stay quiet on a clean one."""

from __future__ import annotations

from typing import Any

from hack.chaos.devicerules import (
    ForeignRuleLog,
    final_rule_problems,
    foreign_rule_problems,
    healthy_gpu_evictions,
    node_mark_problems,
    partition_coverage_problems,
    sample_problems,
)

DRIVER = "gpu.nvidia.com"


def rule(name: str, pool: str, device: str, ours: bool = True, gen: int = 1, value: str = "x") -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "gpuhealth"} if ours else {"team": "sre"}
    return {
        "metadata": {"name": name, "labels": labels, "generation": gen, "resourceVersion": "999"},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": pool, "device": device},
            "taint": {"key": "k", "value": value, "effect": "None", "timeAdded": "2026-01-01T00:00:00Z"},
        },
    }


def foreign_spec(pool: str, device: str, value: str = "x") -> dict[str, Any]:
    return {
        "deviceSelector": {"driver": DRIVER, "pool": pool, "device": device},
        "taint": {"key": "k", "value": value, "effect": "None"},
    }


def test_one_deterministically_named_rule_per_device_is_clean_beside_foreign_ones() -> None:
    rules = [rule("gpuhealth-n1-gpu-3", "n1", "gpu-3"), rule("sre-1", "n1", "gpu-3", ours=False)]
    assert sample_problems(rules) == []


def test_a_duplicate_rule_for_one_device_fires() -> None:
    rules = [rule("gpuhealth-n1-gpu-3", "n1", "gpu-3"), rule("gpuhealth-n1-gpu-3-2", "n1", "gpu-3")]
    found = sample_problems(rules)
    assert any("2 gpuhealth DeviceTaintRules for gpu.nvidia.com/n1/gpu-3" in p for p in found)
    assert any("is not named gpuhealth-n1-gpu-3" in p for p in found)


def test_a_foreign_rule_left_as_written_is_clean() -> None:
    log = ForeignRuleLog()
    log.record("sre-1", 1, foreign_spec("n1", "gpu-3"))
    log.record("sre-2", 1, foreign_spec("n1", "gpu-5"))
    log.record("sre-2", 0, None)  # the writer deleted its own rule
    live = [rule("sre-1", "n1", "gpu-3", ours=False, gen=1)]
    reads = [{"verb": "list", "objectRef": {"resource": "devicetaintrules"}}]
    assert foreign_rule_problems(log.latest(), live, reads) == []


def test_a_foreign_rule_modified_or_deleted_fires() -> None:
    log = ForeignRuleLog()
    log.record("sre-1", 1, foreign_spec("n1", "gpu-3"))
    log.record("sre-2", 1, foreign_spec("n1", "gpu-5"))
    log.record("sre-3", 1, foreign_spec("n1", "gpu-6"))
    live = [
        rule("sre-1", "n1", "gpu-3", ours=False, gen=2),  # someone changed its spec after its writer
        rule("sre-3", "n1", "gpu-6", ours=False, gen=1, value="changed"),
    ]
    found = foreign_rule_problems(log.latest(), live)
    assert any("sre-1 was modified" in p for p in found)
    assert any("sre-2 was deleted" in p for p in found)
    assert any("sre-3: spec" in p for p in found)


def test_an_operator_write_on_a_foreign_rule_fires_even_if_it_failed() -> None:
    log = ForeignRuleLog()
    log.record("sre-1", 1, foreign_spec("n1", "gpu-3"))
    live = [rule("sre-1", "n1", "gpu-3", ours=False, gen=1)]
    delete = {
        "verb": "delete",
        "objectRef": {"resource": "devicetaintrules", "name": "sre-1"},
        "responseStatus": {"code": 409},
    }
    create = {
        "verb": "create",
        "objectRef": {"resource": "devicetaintrules", "name": "sre-1"},
        "responseStatus": {"code": 409},
    }
    [problem] = foreign_rule_problems(log.latest(), live, [delete, create])
    assert "the operator sent delete on foreign DeviceTaintRule sre-1" in problem


def test_a_write_in_flight_is_not_judged() -> None:
    log = ForeignRuleLog()
    log.record("sre-1", 1, foreign_spec("n1", "gpu-3"))
    log.begin("sre-1")
    live = [rule("sre-1", "n1", "gpu-3", ours=False, gen=2)]
    assert foreign_rule_problems(log.latest(), live, in_flight=log.in_flight()) == []


def test_evicting_a_pod_on_a_healthy_gpu_fires() -> None:
    held = {"ns/a": [(DRIVER, "n1", "gpu-3")], "ns/b": [(DRIVER, "n1", "gpu-4")]}
    bad = [(DRIVER, "n1", "gpu-3")]
    assert healthy_gpu_evictions(["ns/a"], held, bad) == []
    [problem] = healthy_gpu_evictions(["ns/a", "ns/b"], held, bad)
    assert "ns/b was evicted" in problem and "gpu-4" in problem


def test_final_rules_exactly_one_per_bad_gpu_and_none_on_healthy_ones() -> None:
    bad = [(DRIVER, "n1", "gpu-3")]
    clean = [rule("gpuhealth-n1-gpu-3", "n1", "gpu-3"), rule("sre", "n1", "gpu-4", ours=False)]
    assert final_rule_problems(clean, ["n1"], bad) == []
    missing = final_rule_problems([rule("sre", "n1", "gpu-3", ours=False)], ["n1"], bad)
    assert missing == ["bad GPU gpu.nvidia.com/n1/gpu-3: 0 gpuhealth DeviceTaintRules (exactly 1 wanted)"]
    extra = final_rule_problems([*clean, rule("gpuhealth-n1-gpu-4", "n1", "gpu-4")], ["n1"], bad)
    assert extra == ["healthy GPU gpu.nvidia.com/n1/gpu-4: 1 gpuhealth DeviceTaintRule(s) left"]
    assert final_rule_problems([rule("gpuhealth-x-gpu-0", "x", "gpu-0")], ["n1"], []) == []  # not our nodes


def test_a_cordoned_or_tainted_node_fires_for_a_device_fault() -> None:
    key = "gpuhealth.dev/unhealthy"
    assert node_mark_problems("n1", {"spec": {"taints": [{"key": "other"}]}}, key) == []
    found = node_mark_problems("n1", {"spec": {"unschedulable": True, "taints": [{"key": key}]}}, key)
    assert len(found) == 2


def test_a_status_write_by_the_controller_manager_is_no_modification() -> None:
    log = ForeignRuleLog()
    log.record("sre-1", 1, foreign_spec("n1", "gpu-3"))
    live = [rule("sre-1", "n1", "gpu-3", ours=False, gen=1)]  # resourceVersion moved on, generation did not
    live[0]["status"] = {"conditions": [{"type": "EvictionInProgress", "status": "False"}]}
    assert foreign_rule_problems(log.latest(), live) == []


def test_names_of_other_drivers_are_not_judged_by_the_plain_scheme() -> None:
    other = rule("gpuhealth-n1-gpu-3-1a2b3c4d5e", "n1", "gpu-3")
    other["spec"]["deviceSelector"]["driver"] = "example.com/gpu"
    assert sample_problems([other]) == []


def test_every_device_of_a_held_out_gpu_ruled_is_clean() -> None:
    held = {"n1 GPU 2": {(DRIVER, "n1", "gpu-2-mig-3g40gb-9-0"), (DRIVER, "n1", "gpu-2-mig-3g40gb-9-4")}}
    rules = [
        rule("gpuhealth-n1-gpu-2-mig-3g40gb-9-0", "n1", "gpu-2-mig-3g40gb-9-0"),
        rule("gpuhealth-n1-gpu-2-mig-3g40gb-9-4", "n1", "gpu-2-mig-3g40gb-9-4"),
    ]
    assert partition_coverage_problems(held, rules) == []
    assert partition_coverage_problems({}, []) == []


def test_a_partition_of_a_held_out_gpu_without_its_rule_fires() -> None:
    placements = {(DRIVER, "n1", d) for d in ("gpu-0", "gpu-0-mig-1g10gb-19-0", "gpu-0-mig-7g80gb-0-0")}
    rules = [
        rule("gpuhealth-n1-gpu-0", "n1", "gpu-0"),
        rule("sre-1", "n1", "gpu-0-mig-1g10gb-19-0", ours=False),  # a foreign rule holds nothing for us
    ]
    (found,) = partition_coverage_problems({"n1 GPU 0": placements}, rules)
    assert "n1 GPU 0 is recorded out of service, but 2 of its devices have no rule" in found
    assert "gpu-0-mig-1g10gb-19-0" in found and "gpu-0-mig-7g80gb-0-0" in found
