"""The fabric rules (rules.nvlink, rules.pcie, rules.fabric, rules.nic) as parsed: NVSentinel's
nic-health-monitor defaults, and every refused value naming its field."""

from __future__ import annotations

import pytest

from gpuhealth.api.names import Action, Scope
from gpuhealth.api.policy import PolicyError
from tests.unit.builders import make_policy


def test_defaults_keep_new_work_off_for_slow_and_drain_for_broken() -> None:
    f = make_policy().fabric
    assert f.nvlink.enabled and f.nvlink.degraded.action == Action.CORDON and not f.nvlink.degraded.at_next_checkpoint
    assert f.pcie.enabled and f.pcie.generation and f.pcie.degraded.finding_action == Action.CORDON
    assert f.fabric.degraded.action == Action.CORDON and f.fabric.broken_action == Action.DRAIN
    assert f.nic.action == Action.DRAIN and f.nic.degraded.action == Action.CORDON
    nic = f.nic
    assert (
        nic.symbol_errors_fatal_per_hour,
        nic.symbol_errors_degraded_per_second,
        nic.link_error_recovery_per_minute,
        nic.port_rcv_errors_per_second,
    ) == (120, 10, 5, 10)


def test_settings_are_read() -> None:
    p = make_policy(
        {
            "rules": {
                "nvlink": {"action": "drain", "scope": "Node"},
                "pcie": {"enabled": False, "judgeGeneration": False},
                "fabric": {"moveRunningWork": "AtNextCheckpoint", "brokenAction": "cordon"},
                "nic": {"degradedAction": "observe", "linkErrorRecoveryPerMinute": 30},
            }
        }
    )
    assert p.fabric.nvlink.degraded.action == Action.DRAIN and p.devices.rule_scopes["nvlink"] == Scope.NODE
    assert not p.fabric.pcie.enabled and not p.fabric.pcie.generation
    assert p.fabric.fabric.degraded.finding_action == Action.DRAIN and p.fabric.fabric.broken_action == Action.CORDON
    assert p.fabric.nic.degraded.action == Action.OBSERVE and p.fabric.nic.link_error_recovery_per_minute == 30
    assert p.drain_for("FabricDegraded").on_checkpoint_timeout == "Wait"  # patient: at the next checkpoint
    assert p.drain_for("NVLinkDegraded") == p.drain


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"rules": {"nvlink": {"action": "repair"}}}, r"spec\.rules\.nvlink\.action"),
        ({"rules": {"nvlink": {"moveRunningWork": "Now"}}}, r"spec\.rules\.nvlink\.moveRunningWork"),
        ({"rules": {"nvlink": {"scope": "Rack"}}}, r"spec\.rules\.nvlink\.scope"),
        ({"rules": {"pcie": {"judgeGeneration": "yes"}}}, r"spec\.rules\.pcie\.judgeGeneration"),
        ({"rules": {"pcie": {"enabled": "no"}}}, r"spec\.rules\.pcie\.enabled"),
        ({"rules": {"fabric": {"brokenAction": "panic"}}}, r"spec\.rules\.fabric\.brokenAction"),
        ({"rules": {"nic": {"degradedAction": "repair"}}}, r"spec\.rules\.nic\.degradedAction"),
        ({"rules": {"nic": {"action": "explode"}}}, r"spec\.rules\.nic\.action"),
        ({"rules": {"nic": {"symbolErrorsFatalPerHour": 0}}}, r"spec\.rules\.nic\.symbolErrorsFatalPerHour"),
        ({"rules": {"nic": {"portRcvErrorsPerSecond": 1.5}}}, r"spec\.rules\.nic\.portRcvErrorsPerSecond"),
        ({"rules": {"nic": "on"}}, r"spec\.rules\.nic"),
    ],
)
def test_invalid_settings_name_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(PolicyError, match=field):
        make_policy(spec)
