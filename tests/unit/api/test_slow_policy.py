"""The "slow, not broken" rules (rules.powerBrake, rules.hwSlowdown) and spec.topology, as parsed."""

from __future__ import annotations

import pytest

from gpuhealth.api.names import Action, Scope
from gpuhealth.api.policy import PolicyError
from gpuhealth.api.slow_policy import DOMAIN_LABEL, RACK_LABEL
from tests.unit.builders import make_policy


def test_defaults_keep_new_work_off_and_correlate_a_rack_of_three() -> None:
    p = make_policy()
    assert p.power_brake.enabled and p.power_brake.action == Action.CORDON and p.power_brake.sustained_s == 60
    assert p.power_brake.rack.min_nodes == 3 and p.power_brake.rack.action == Action.OBSERVE
    assert p.hw_slowdown.enabled and p.hw_slowdown.action == Action.CORDON and p.hw_slowdown.sustained_s == 300
    assert (p.topology.domain_label, p.topology.rack_label) == (DOMAIN_LABEL, RACK_LABEL)
    assert p.devices.rule_scopes == {}


def test_settings_are_read() -> None:
    p = make_policy(
        {
            "rules": {
                "powerBrake": {"sustainedFor": "30s", "action": "drain", "scope": "Node", "rack": {"minNodes": 2}},
                "hwSlowdown": {"enabled": False, "action": "observe"},
            },
            "topology": {"domainLabel": "example.com/nvl-domain", "rackLabel": "rack"},
        }
    )
    assert p.power_brake.sustained_s == 30 and p.power_brake.action == Action.DRAIN
    assert p.power_brake.rack.min_nodes == 2
    assert p.devices.rule_scopes["powerBrake"] == Scope.NODE
    assert not p.hw_slowdown.enabled and p.hw_slowdown.action == Action.OBSERVE
    assert p.topology.domain_label == "example.com/nvl-domain" and p.topology.rack_label == "rack"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"rules": {"powerBrake": {"action": "repair"}}}, r"spec\.rules\.powerBrake\.action"),
        ({"rules": {"hwSlowdown": {"action": "repair"}}}, r"spec\.rules\.hwSlowdown\.action"),
        ({"rules": {"powerBrake": {"sustainedFor": "soon"}}}, r"spec\.rules\.powerBrake\.sustainedFor"),
        ({"rules": {"powerBrake": {"rack": {"minNodes": 1}}}}, r"spec\.rules\.powerBrake\.rack\.minNodes"),
        ({"rules": {"powerBrake": {"rack": {"action": "drain"}}}}, r"spec\.rules\.powerBrake\.rack\.action"),
        ({"rules": {"powerBrake": {"scope": "Domain"}}}, r"spec\.rules\.powerBrake\.scope"),
        ({"topology": {"domainLabel": "not a label"}}, r"spec\.topology\.domainLabel"),
        ({"topology": {"rackLabel": ""}}, r"spec\.topology\.rackLabel"),
    ],
)
def test_invalid_settings_name_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(PolicyError, match=field):
        make_policy(spec)


def test_the_slow_budget_defaults_to_ten_percent_and_names_its_field() -> None:
    assert make_policy().slow_breaker_limit(40) == 4
    assert make_policy({"safety": {"maxSlow": 0}}).slow_breaker_limit(40) == 0
    with pytest.raises(PolicyError, match=r"spec\.safety\.maxSlow"):
        make_policy({"safety": {"maxSlow": "lots"}})


def test_move_running_work_at_the_next_checkpoint_drains_patiently() -> None:
    p = make_policy({"rules": {"powerBrake": {"moveRunningWork": "AtNextCheckpoint"}}})
    assert p.power_brake.at_next_checkpoint and p.power_brake.finding_action == Action.DRAIN
    assert p.hw_slowdown.finding_action == Action.CORDON
    patient = p.drain_for("PowerBrake")
    assert patient.on_checkpoint_timeout == "Wait" and patient.max_wait_s == float("inf")
    assert not patient.allow_force_delete
    assert p.drain_for("HWSlowdown") == p.drain and p.drain_for("XID79") == p.drain
    observe = make_policy({"rules": {"powerBrake": {"moveRunningWork": "AtNextCheckpoint", "action": "observe"}}})
    assert observe.power_brake.finding_action == Action.OBSERVE  # nothing held out: nothing moves
    with pytest.raises(PolicyError, match=r"spec\.rules\.hwSlowdown\.moveRunningWork"):
        make_policy({"rules": {"hwSlowdown": {"moveRunningWork": "Now"}}})
