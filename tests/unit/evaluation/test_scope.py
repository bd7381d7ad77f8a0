"""Scope of a finding (Device or Node): built-in defaults, policy overrides, the fleet switch,
and the spec.devices / maxUnhealthyGPUs policy fields that go with it."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.api.device_policy import DeviceSettings
from gpuhealth.api.names import Action, Scope, Signal
from gpuhealth.api.policy import PolicyError
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.evaluation.assess import Finding, NodeView, assess
from gpuhealth.evaluation.scope import device_findings, node_findings, scope_of, xid_scope
from tests.unit.builders import T0, at, gpu, make_policy, make_report, xid_event

# --- built-in scope -----------------------------------------------------------------------------


@pytest.mark.parametrize("code", [48, 62, 64, 95, 109, 119, 120, 140, 143])
def test_xids_whose_remedy_is_a_gpu_reset_are_device_scope(code: int) -> None:
    assert xid_scope(code) == Scope.DEVICE


@pytest.mark.parametrize("code", [79, 74, 13, 31, 92, 1023])
def test_node_reboot_nvlink_and_other_xids_are_node_scope(code: int) -> None:
    assert xid_scope(code) == Scope.NODE


@pytest.mark.parametrize(
    ("recovery", "scope"),
    [
        ("Reset", Scope.DEVICE),
        ("GPU Reset Required", Scope.DEVICE),
        ("DrainAndReset", Scope.DEVICE),
        ("Reboot", Scope.NODE),
        ("Node Reboot Required", Scope.NODE),
        ("DrainP2P", Scope.NODE),
        ("BusReset", Scope.DEVICE),
        ("0x6", Scope.DEVICE),
        ("SystemReboot", Scope.NODE),
        ("System Reboot Required", Scope.NODE),
        ("RecoverImexDomain", Scope.DOMAIN),
        ("", Scope.NODE),
        ("gibberish", Scope.NODE),
    ],
)
def test_xid_154_follows_its_recovery_action(recovery: str, scope: Scope) -> None:
    assert xid_scope(154, RecoveryAction.parse(recovery)) == scope


def _f(signal: Signal, gpu_index: int | None = 2, code: int | None = None) -> Finding:
    return Finding(signal, Action.DRAIN, "x", gpu_index, "", code, T0)


@pytest.mark.parametrize(
    ("signal", "scope"),
    [
        (Signal.ECC, Scope.DEVICE),
        (Signal.ROW_REMAP_FAILURE, Scope.DEVICE),
        (Signal.PENDING_REMAP, Scope.DEVICE),
        (Signal.THERMAL, Scope.DEVICE),
        (Signal.APP_XID_REPEATED, Scope.DEVICE),
        (Signal.GPU_LOST, Scope.NODE),
        (Signal.GPU_COUNT, Scope.NODE),
        (Signal.AGENT_SILENT, Scope.NODE),
    ],
)
def test_rule_defaults(signal: Signal, scope: Scope) -> None:
    assert scope_of(_f(signal), make_policy()) == scope


def test_a_restart_loop_is_the_gpus_only_when_it_names_one() -> None:
    """restarts.py names a GPU only where every failing pod holds it; otherwise it is the node's."""
    assert scope_of(_f(Signal.RESTART_LOOP, gpu_index=None), make_policy()) == Scope.NODE
    assert scope_of(_f(Signal.RESTART_LOOP, gpu_index=2), make_policy()) == Scope.DEVICE
    assert scope_of(_f(Signal.RESTART_LOOP, gpu_index=2), make_policy({"devices": {"scope": "Node"}})) == Scope.NODE


def test_a_finding_without_a_gpu_is_node_scope_whatever_the_policy() -> None:
    policy = make_policy({"rules": {"ecc": {"scope": "Device"}}})
    assert scope_of(_f(Signal.ECC, gpu_index=None), policy) == Scope.NODE


# --- policy overrides ---------------------------------------------------------------------------


def test_per_rule_override_both_ways() -> None:
    policy = make_policy({"rules": {"thermal": {"scope": "Node"}, "gpuLost": {"scope": "Device"}}})
    assert scope_of(_f(Signal.THERMAL), policy) == Scope.NODE
    assert scope_of(_f(Signal.GPU_LOST), policy) == Scope.DEVICE
    assert scope_of(_f(Signal.ECC), policy) == Scope.DEVICE


def test_application_repeat_scope_lives_under_xid() -> None:
    policy = make_policy({"rules": {"xid": {"applicationRepeat": {"scope": "Node"}}}})
    assert policy.devices.rule_scopes == {"applicationRepeat": Scope.NODE}
    assert scope_of(_f(Signal.APP_XID_REPEATED, code=31), policy) == Scope.NODE


def test_per_xid_scope_override_without_changing_the_action() -> None:
    policy = make_policy(
        {"rules": {"xid": {"overrides": [{"code": 79, "scope": "Device"}, {"code": 48, "scope": "Node"}]}}}
    )
    assert policy.xid_overrides == {}  # actions stay the catalog's
    assert policy.devices.xid_scopes == {79: Scope.DEVICE, 48: Scope.NODE}
    assert scope_of(_f(Signal.XID, code=79), policy) == Scope.DEVICE
    assert scope_of(_f(Signal.XID, code=48), policy) == Scope.NODE


def test_fleet_switch_node_makes_everything_node_scope() -> None:
    policy = make_policy({"devices": {"scope": "Node"}, "rules": {"gpuLost": {"scope": "Device"}}})
    assert not policy.devices.enabled
    for signal in (Signal.ECC, Signal.THERMAL, Signal.GPU_LOST):
        assert scope_of(_f(signal), policy) == Scope.NODE
    assert scope_of(_f(Signal.XID, code=48), policy) == Scope.NODE


def test_assess_sets_every_findings_scope() -> None:
    report = make_report(
        devices=[gpu(0), gpu(3, ecc={"volatileUncorrected": 2}), gpu(5, lost=True)],
        xids=[xid_event(79, -5, gpu_index=5), xid_event(48, -4, gpu_index=3)],
    )
    a = assess(make_policy(), report, NodeView("n", gpu_capacity=8), at(0))
    scopes = {(f.signal, f.gpu, f.code): f.scope for f in a.findings}
    assert scopes[(Signal.ECC, 3, None)] == Scope.DEVICE
    assert scopes[(Signal.XID, 3, 48)] == Scope.DEVICE
    assert scopes[(Signal.XID, 5, 79)] == Scope.NODE
    assert scopes[(Signal.GPU_LOST, 5, None)] == Scope.NODE
    assert scopes[(Signal.GPU_COUNT, None, None)] == Scope.NODE
    assert {f.gpu for f in device_findings(a)} == {3}
    assert {f.signal for f in node_findings(a)} == {Signal.XID, Signal.GPU_LOST, Signal.GPU_COUNT}


def test_xid_154_scope_reads_the_devices_recovery_action() -> None:
    report = make_report(devices=[gpu(1, recoveryAction="Reset")], xids=[xid_event(154, -1, gpu_index=1)])
    a = assess(make_policy(), report, NodeView("n", gpu_capacity=1), at(0))
    (f,) = [f for f in a.findings if f.code == 154]
    assert f.action == Action.DRAIN and f.scope == Scope.DEVICE


# --- spec.devices and the GPU budget ------------------------------------------------------------


def test_device_defaults() -> None:
    p = make_policy()
    assert p.devices == DeviceSettings()
    assert p.devices.scope == Scope.DEVICE and p.devices.enabled
    assert p.devices.max_bad_gpus_per_node == 1
    assert p.devices.on_flapping == "AwaitingRepair"
    assert p.devices.drivers == ("gpu.nvidia.com",)
    assert p.max_unhealthy_gpus is None


def test_device_fields_parse() -> None:
    p = make_policy(
        {
            "devices": {
                "scope": "Device",
                "maxBadGPUsPerNode": 3,
                "onFlapping": "Node",
                "drivers": ["gpu.nvidia.com", "gpu.example.org"],
            },
            "safety": {"maxUnhealthyGPUs": 16},
        }
    )
    assert p.devices.max_bad_gpus_per_node == 3
    assert p.devices.on_flapping == "Node"
    assert p.devices.drivers == ("gpu.nvidia.com", "gpu.example.org")
    assert p.gpu_breaker_limit(1000, 125) == 16


@pytest.mark.parametrize(
    ("value", "total", "limit"),
    [("10%", 64, 7), ("0%", 64, 0), ("100%", 64, 64), (5, 64, 5), ("1%", 8, 1)],
)
def test_gpu_budget_rounds_up_like_the_node_breaker(value: int | str, total: int, limit: int) -> None:
    assert make_policy({"safety": {"maxUnhealthyGPUs": value}}).gpu_breaker_limit(total, total // 8) == limit


@pytest.mark.parametrize(
    ("max_unhealthy", "gpus", "nodes", "limit"),
    [
        ("10%", 64, 8, 8),  # one node's worth: a node quarantine no longer spends a budget of 7
        ("10%", 8000, 1000, 800),
        ("25%", 32, 4, 8),
        (2, 16, 2, 16),  # never more than the policy's GPUs
        ("0%", 64, 8, 0),
        ("10%", 0, 0, 0),
        ("10%", 12, 3, 4),  # uneven nodes: GPUs per node rounded up
    ],
)
def test_unset_gpu_budget_is_the_node_budget_in_gpus(
    max_unhealthy: int | str, gpus: int, nodes: int, limit: int
) -> None:
    assert make_policy({"safety": {"maxUnhealthy": max_unhealthy}}).gpu_breaker_limit(gpus, nodes) == limit


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"devices": {"scope": "Rack"}}, "spec.devices.scope"),
        ({"devices": {"maxBadGPUsPerNode": 0}}, "spec.devices.maxBadGPUsPerNode"),
        ({"devices": {"maxBadGPUsPerNode": 65}}, "spec.devices.maxBadGPUsPerNode"),
        ({"devices": {"onFlapping": "Cordon"}}, "spec.devices.onFlapping"),
        ({"devices": {"drivers": []}}, "spec.devices.drivers"),
        ({"devices": {"drivers": ["Not A Driver"]}}, "spec.devices.drivers[0]"),
        ({"devices": "yes"}, "spec.devices"),
        ({"rules": {"ecc": {"scope": "GPU"}}}, "spec.rules.ecc.scope"),
        ({"rules": {"xid": {"applicationRepeat": {"scope": "x"}}}}, "spec.rules.xid.applicationRepeat.scope"),
        ({"rules": {"xid": {"overrides": [{"code": 48, "scope": "Rack"}]}}}, "spec.rules.xid.overrides[0].scope"),
        ({"rules": {"xid": {"overrides": [{"code": 48}]}}}, "spec.rules.xid.overrides[0]"),
        (
            {"rules": {"xid": {"overrides": [{"code": 48, "scope": "Node"}, {"code": 48, "action": "drain"}]}}},
            "spec.rules.xid.overrides[1].code",
        ),
        ({"safety": {"maxUnhealthyGPUs": "120%"}}, "spec.safety.maxUnhealthyGPUs"),
    ],
)
def test_invalid_device_fields_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError) as err:
        make_policy(spec)
    assert str(err.value).startswith(field), str(err.value)
