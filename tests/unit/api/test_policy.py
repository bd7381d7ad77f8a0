"""GPUHealthPolicy parsing (every default, every field, errors that name the field) and the circuit
breaker's arithmetic on ``spec.safety.maxUnhealthy``."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.api.names import Action, Mode
from gpuhealth.api.policy import Policy, PolicyError, breaker_limit
from gpuhealth.api.selector import LabelSelector
from tests.unit.builders import make_policy

# --- parse_policy: defaults --------------------------------------------------------------------


def test_empty_spec_gets_every_default() -> None:
    p = make_policy({}, name="fleet", generation=7)
    assert p == Policy(name="fleet", generation=7)
    assert p.mode == Mode.ENFORCE
    assert p.priority == 0
    assert dict(p.xid_overrides) == {}
    assert (p.app_repeat_count, p.app_repeat_window_s, p.app_repeat_action) == (3, 600.0, Action.DRAIN)
    assert (p.ecc_threshold, p.ecc_action) == (1, Action.DRAIN)
    assert p.row_remap_failure_action == Action.REPAIR
    assert p.pending_remap_action == Action.DRAIN
    assert (p.thermal_threshold_c, p.thermal_slowdown, p.thermal_sustained_s) == (90, True, 300.0)
    assert p.thermal_action == Action.CORDON
    assert p.gpu_lost_action == Action.DRAIN
    assert (p.gpu_count_expected, p.gpu_count_action) == (None, Action.CORDON)
    assert (p.silence_after_s, p.silence_action) == (120.0, Action.OBSERVE)
    assert (p.taint_effect, p.cordon) == ("NoSchedule", True)
    assert p.drain.checkpoint_timeout_s == 600.0
    assert p.drain.max_wait_s == 3600.0
    assert p.drain.force_delete_after_s == 7200.0
    assert p.drain.system_namespaces == ("kube-system", "gpuhealth-system")
    assert (p.max_unhealthy, p.max_concurrent_drains) == ("10%", 1)
    assert (p.probation_s, p.flapping_max, p.flapping_window_s) == (600.0, 3, 86400.0)
    assert p.restart_loop_window_s == 900.0
    assert (p.gpu_hourly_cost, p.currency) == (None, "USD")
    assert p.selector == LabelSelector()


@pytest.mark.parametrize("obj", [{}, {"metadata": {"name": "x"}}, {"metadata": {"name": "x"}, "spec": None}])
def test_missing_spec_or_metadata_is_all_defaults(obj: dict[str, Any]) -> None:
    from gpuhealth.api.policy import parse_policy

    p = parse_policy(obj)
    assert p.probation_s == 600.0
    assert p.max_unhealthy == "10%"


def test_explicit_nulls_fall_back_to_defaults() -> None:
    p = make_policy({"mode": None, "rules": {"ecc": {"uncorrectedThreshold": None, "action": None}}})
    assert p.mode == Mode.ENFORCE
    assert (p.ecc_threshold, p.ecc_action) == (1, Action.DRAIN)


# --- parse_policy: each field ------------------------------------------------------------------

FULL_SPEC: dict[str, Any] = {
    "mode": "DryRun",
    "priority": 50,
    "nodeSelector": {
        "matchLabels": {"pool": "h100"},
        "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}],
    },
    "rules": {
        "xid": {
            "overrides": [{"code": 13, "action": "cordon"}, {"code": 79, "action": "repair"}],
            "applicationRepeat": {"count": 5, "window": "30m", "action": "cordon"},
        },
        "ecc": {"uncorrectedThreshold": 4, "action": "repair"},
        "rowRemapFailure": {"action": "drain"},
        "pendingRemap": {"action": "cordon"},
        "thermal": {"temperatureThresholdC": 85, "slowdown": False, "sustainedFor": "2m", "action": "drain"},
        "gpuLost": {"action": "repair"},
        "gpuCount": {"expected": 4, "action": "drain"},
        "agentSilence": {"after": "90s", "action": "cordon"},
    },
    "actions": {
        "taintEffect": "NoExecute",
        "cordon": False,
        "drain": {
            "checkpointMode": "Always",
            "checkpointTimeout": "5m",
            "onCheckpointTimeout": "Wait",
            "maxWait": "2h",
            "allowForceDelete": True,
            "forceDeleteAfter": "3h",
            "gangSurvivesRankLoss": True,
            "systemNamespaces": ["kube-system"],
        },
    },
    "safety": {
        "maxUnhealthy": 7,
        "maxConcurrentDrains": 3,
        "probation": "15m",
        "flapping": {"maxQuarantines": 4, "window": "12h"},
    },
    "restartLoop": {
        "enabled": False,
        "window": "20m",
        "minWorkloads": 3,
        "minRestarts": 5,
        "action": "drain",
    },
    "cost": {"gpuHourly": 2.5, "currency": "EUR"},
}


def test_every_field_is_parsed() -> None:
    p = make_policy(FULL_SPEC, name="h100", generation=3)
    assert (p.name, p.generation, p.mode, p.priority) == ("h100", 3, Mode.DRY_RUN, 50)
    assert p.selector.matches({"pool": "h100", "zone": "a"})
    assert not p.selector.matches({"pool": "h100", "zone": "c"})
    assert dict(p.xid_overrides) == {13: Action.CORDON, 79: Action.REPAIR}
    assert (p.app_repeat_count, p.app_repeat_window_s, p.app_repeat_action) == (5, 1800.0, Action.CORDON)
    assert (p.ecc_threshold, p.ecc_action) == (4, Action.REPAIR)
    assert p.row_remap_failure_action == Action.DRAIN
    assert p.pending_remap_action == Action.CORDON
    assert (p.thermal_threshold_c, p.thermal_slowdown, p.thermal_sustained_s) == (85, False, 120.0)
    assert p.thermal_action == Action.DRAIN
    assert p.gpu_lost_action == Action.REPAIR
    assert (p.gpu_count_expected, p.gpu_count_action) == (4, Action.DRAIN)
    assert (p.silence_after_s, p.silence_action) == (90.0, Action.CORDON)
    assert (p.taint_effect, p.cordon) == ("NoExecute", False)
    d = p.drain
    assert (d.checkpoint_mode, d.checkpoint_timeout_s, d.on_checkpoint_timeout) == ("Always", 300.0, "Wait")
    assert (d.max_wait_s, d.allow_force_delete, d.force_delete_after_s) == (7200.0, True, 10800.0)
    assert (d.gang_survives_rank_loss, d.system_namespaces) == (True, ("kube-system",))
    assert (p.max_unhealthy, p.max_concurrent_drains) == (7, 3)
    assert (p.probation_s, p.flapping_max, p.flapping_window_s) == (900.0, 4, 43200.0)
    assert (p.restart_loop_enabled, p.restart_loop_window_s) == (False, 1200.0)
    assert (p.restart_loop_min_workloads, p.restart_loop_min_restarts) == (3, 5)
    assert p.restart_loop_action == Action.DRAIN
    assert (p.gpu_hourly_cost, p.currency) == (2.5, "EUR")


@pytest.mark.parametrize("value", ["0%", "5%", "100%", 0, 12])
def test_max_unhealthy_accepts_counts_and_percents(value: int | str) -> None:
    assert make_policy({"safety": {"maxUnhealthy": value}}).max_unhealthy == value


# --- parse_policy: errors name the field -------------------------------------------------------

BAD_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"mode": "Sometimes"}, "spec.mode"),
    ({"priority": 5000}, "spec.priority"),
    ({"priority": "high"}, "spec.priority"),
    ({"priority": True}, "spec.priority"),
    (
        {"rules": {"xid": {"applicationRepeat": {"window": "10 minutes"}}}},
        "spec.rules.xid.applicationRepeat.window",
    ),
    ({"rules": {"xid": {"applicationRepeat": {"count": 1}}}}, "spec.rules.xid.applicationRepeat.count"),
    (
        {"rules": {"xid": {"applicationRepeat": {"action": "panic"}}}},
        "spec.rules.xid.applicationRepeat.action",
    ),
    ({"rules": {"xid": {"overrides": [{"code": 0, "action": "drain"}]}}}, "spec.rules.xid.overrides[0].code"),
    (
        {"rules": {"xid": {"overrides": [{"code": 1024, "action": "drain"}]}}},
        "spec.rules.xid.overrides[0].code",
    ),
    (
        {"rules": {"xid": {"overrides": [{"code": 79, "action": "reboot"}]}}},
        "spec.rules.xid.overrides[0].action",
    ),
    ({"rules": {"ecc": {"uncorrectedThreshold": 0}}}, "spec.rules.ecc.uncorrectedThreshold"),
    ({"rules": {"ecc": {"action": "fix"}}}, "spec.rules.ecc.action"),
    ({"rules": {"ecc": "drain"}}, "spec.rules.ecc"),
    ({"rules": {"thermal": {"sustainedFor": "5"}}}, "spec.rules.thermal.sustainedFor"),
    ({"rules": {"thermal": {"temperatureThresholdC": 20}}}, "spec.rules.thermal.temperatureThresholdC"),
    ({"rules": {"gpuCount": {"expected": 0}}}, "spec.rules.gpuCount.expected"),
    ({"rules": {"agentSilence": {"after": "2 m"}}}, "spec.rules.agentSilence.after"),
    ({"rules": {"agentSilence": {"action": "drain"}}}, "spec.rules.agentSilence.action"),
    ({"actions": {"taintEffect": "PreferNoSchedule"}}, "spec.actions.taintEffect"),
    ({"actions": {"taintEffect": "noexecute"}}, "spec.actions.taintEffect"),
    # "false" as a string would read as true: a taint-only platform would get its node cordoned.
    ({"actions": {"cordon": "false"}}, "spec.actions.cordon"),
    ({"actions": {"cordon": 0}}, "spec.actions.cordon"),
    ({"actions": "cordon"}, "spec.actions"),
    ({"actions": {"drain": {"maxWait": "forever"}}}, "spec.actions.drain.maxWait"),
    ({"actions": {"drain": {"checkpointTimeout": "1d"}}}, "spec.actions.drain.checkpointTimeout"),
    ({"actions": {"drain": {"forceDeleteAfter": ""}}}, "spec.actions.drain.forceDeleteAfter"),
    ({"safety": {"maxUnhealthy": "150%"}}, "spec.safety.maxUnhealthy"),
    ({"safety": {"maxUnhealthy": "ten"}}, "spec.safety.maxUnhealthy"),
    ({"safety": {"maxUnhealthy": "5"}}, "spec.safety.maxUnhealthy"),
    ({"safety": {"maxConcurrentDrains": 0}}, "spec.safety.maxConcurrentDrains"),
    ({"safety": {"probation": "10"}}, "spec.safety.probation"),
    ({"safety": {"flapping": {"window": "1 day"}}}, "spec.safety.flapping.window"),
    ({"safety": {"flapping": {"maxQuarantines": 0}}}, "spec.safety.flapping.maxQuarantines"),
    ({"restartLoop": {"window": "x"}}, "spec.restartLoop.window"),
    ({"restartLoop": {"minWorkloads": 1}}, "spec.restartLoop.minWorkloads"),
    (
        {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}},
        "spec.nodeSelector.matchExpressions[0]",
    ),
    ({"nodeSelector": ["pool=h100"]}, "spec.nodeSelector"),
]


@pytest.mark.parametrize(("spec", "field"), BAD_FIELDS, ids=[f for _, f in BAD_FIELDS])
def test_invalid_field_raises_policy_error_naming_it(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError) as err:
        make_policy(spec)
    assert str(err.value).startswith(field), str(err.value)


def test_duplicate_xid_override_is_refused() -> None:
    overrides = [
        {"code": 79, "action": "drain"},
        {"code": 13, "action": "ignore"},
        {"code": 79, "action": "repair"},
    ]
    with pytest.raises(PolicyError, match=r"spec\.rules\.xid\.overrides\[2\]\.code: duplicate XID 79"):
        make_policy({"rules": {"xid": {"overrides": overrides}}})


@pytest.mark.parametrize(("probation", "window"), [("10m", "10m"), ("2h", "1h"), ("24h", "86400s")])
def test_flapping_window_must_exceed_probation(probation: str, window: str) -> None:
    with pytest.raises(PolicyError, match=r"spec\.safety\.flapping\.window"):
        make_policy({"safety": {"probation": probation, "flapping": {"window": window}}})


def test_flapping_window_just_above_probation_is_fine() -> None:
    p = make_policy({"safety": {"probation": "10m", "flapping": {"window": "10m1s"}}})
    assert (p.probation_s, p.flapping_window_s) == (600.0, 601.0)


def test_flapping_default_window_against_long_probation() -> None:
    with pytest.raises(PolicyError, match=r"longer than spec\.safety\.probation"):
        make_policy({"safety": {"probation": "25h"}})


def test_policy_error_is_a_value_error() -> None:
    assert issubclass(PolicyError, ValueError)


# --- breaker_limit -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_unhealthy", "total", "limit"),
    [
        (5, 1000, 5),
        (0, 10, 0),
        (50, 3, 50),
        (-2, 10, 0),
        ("5%", 1000, 50),
        ("10%", 4, 1),
        ("10%", 10, 1),
        ("10%", 11, 2),
        ("0%", 1000, 0),
        ("100%", 7, 7),
        ("1%", 1, 1),
        ("33%", 3, 1),
        ("34%", 3, 2),
        ("50%", 0, 0),
        ("99%", 100, 99),
    ],
)
def test_breaker_limit(max_unhealthy: int | str, total: int, limit: int) -> None:
    assert breaker_limit(max_unhealthy, total) == limit


@pytest.mark.parametrize("bad", ["101%", "5", "%", "-5%", "05%", "5.5%", "five%", ""])
def test_breaker_limit_refuses_bad_values(bad: str) -> None:
    with pytest.raises(PolicyError, match=r"spec\.safety\.maxUnhealthy"):
        breaker_limit(bad, 10)


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=100), st.integers(min_value=0, max_value=5000))
def test_percent_limit_is_the_smallest_count_covering_the_percent(pct: int, total: int) -> None:
    limit = breaker_limit(f"{pct}%", total)
    assert limit * 100 >= pct * total  # rounds up ...
    assert (limit - 1) * 100 < pct * total or limit == 0  # ... by less than one node
    assert 0 <= limit <= total


def test_policy_breaker_limit_uses_its_max_unhealthy() -> None:
    assert make_policy({"safety": {"maxUnhealthy": "5%"}}).breaker_limit(1000) == 50
    assert make_policy().breaker_limit(4) == 1


def test_breaker_limit_refuses_trailing_newline() -> None:
    with pytest.raises(PolicyError):
        breaker_limit("10%\n", 10)


def test_nvml_unresponsive_action_is_observe_cordon_or_drain() -> None:
    assert make_policy({"rules": {"nvmlUnresponsive": {"action": "drain"}}}).nvml_unresponsive_action == "drain"
    with pytest.raises(PolicyError, match=r"spec\.rules\.nvmlUnresponsive\.action"):
        make_policy({"rules": {"nvmlUnresponsive": {"action": "repair"}}})
