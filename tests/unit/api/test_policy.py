"""GPUHealthPolicy parsing, circuit-breaker arithmetic, selectors and policy selection; durations."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.api.durations import format_duration, parse_duration
from gpuhealth.api.names import Action, Mode
from gpuhealth.api.policy import Policy, PolicyError, breaker_limit, select_policy
from gpuhealth.api.selector import LabelSelector, parse_selector
from tests.unit.builders import make_policy

# --- durations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        ("1.5h", 5400.0),
        ("2m30s", 150.0),
        ("0s", 0.0),
        ("1h0m1s", 3601.0),
        ("1s500ms", 1.5),
    ],
)
def test_parse_duration_accepts_crd_spellings(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "30", "s", "5 m", "-5m", "1d", "1.h", ".5s", "5M", "1us", " 5m", "5m "])
def test_parse_duration_refuses_what_the_crd_pattern_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.parametrize("value", [None, 30, 1.5, ["5m"]])
def test_parse_duration_refuses_non_strings(value: Any) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


def test_parse_duration_refuses_trailing_newline() -> None:
    with pytest.raises(ValueError):
        parse_duration("5m\n")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0ms"),
        (0.25, "250ms"),
        (1, "1s"),
        (59, "59s"),
        (60, "1m"),
        (90, "1m30s"),
        (3600, "1h"),
        (3661, "1h1m1s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_duration_clamps_negative_to_zero() -> None:
    assert format_duration(-5) == "0ms"


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=1, max_value=10 * 86400))
def test_format_then_parse_round_trips_whole_seconds(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


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


# --- LabelSelector -----------------------------------------------------------------------------


def _sel(labels: dict[str, str] | None = None, *exprs: tuple[str, str, tuple[str, ...]]) -> LabelSelector:
    return LabelSelector(labels or {}, tuple(exprs))


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        (_sel(), {}, True),
        (_sel(), {"any": "thing"}, True),
        (_sel({"pool": "h100"}), {"pool": "h100", "zone": "a"}, True),
        (_sel({"pool": "h100"}), {"pool": "a100"}, False),
        (_sel({"pool": "h100"}), {}, False),
        (_sel({"pool": "h100", "zone": "a"}), {"pool": "h100"}, False),
        (_sel(None, ("zone", "In", ("a", "b"))), {"zone": "b"}, True),
        (_sel(None, ("zone", "In", ("a", "b"))), {"zone": "c"}, False),
        (_sel(None, ("zone", "In", ("a", "b"))), {}, False),
        (_sel(None, ("zone", "NotIn", ("a",))), {"zone": "b"}, True),
        (_sel(None, ("zone", "NotIn", ("a",))), {}, True),
        (_sel(None, ("zone", "NotIn", ("a",))), {"zone": "a"}, False),
        (_sel(None, ("gpu", "Exists", ())), {"gpu": ""}, True),
        (_sel(None, ("gpu", "Exists", ())), {}, False),
        (_sel(None, ("gpu", "DoesNotExist", ())), {}, True),
        (_sel(None, ("gpu", "DoesNotExist", ())), {"gpu": "x"}, False),
        (
            _sel({"pool": "h100"}, ("zone", "In", ("a",)), ("spot", "DoesNotExist", ())),
            {"pool": "h100", "zone": "a"},
            True,
        ),
        (
            _sel({"pool": "h100"}, ("zone", "In", ("a",)), ("spot", "DoesNotExist", ())),
            {"pool": "h100", "zone": "a", "spot": "1"},
            False,
        ),
    ],
)
def test_label_selector_matches(selector: LabelSelector, labels: dict[str, str], expected: bool) -> None:
    assert selector.matches(labels) is expected


def test_parse_selector_builds_expressions() -> None:
    sel = parse_selector(
        {
            "matchLabels": {"a": "1"},
            "matchExpressions": [
                {"key": "b", "operator": "Exists"},
                {"key": "c", "operator": "In", "values": ["x"]},
            ],
        }
    )
    assert sel == LabelSelector({"a": "1"}, (("b", "Exists", ()), ("c", "In", ("x",))))
    assert parse_selector(None) == LabelSelector()
    assert parse_selector({}) == LabelSelector()


# --- select_policy -----------------------------------------------------------------------------


def _p(name: str, priority: int = 0, labels: dict[str, str] | None = None) -> Policy:
    return Policy(name=name, priority=priority, selector=LabelSelector(labels or {}))


def test_select_policy_highest_priority_wins() -> None:
    low, high, mid = _p("a-low", 1), _p("z-high", 10), _p("m-mid", 5)
    chosen, others = select_policy([low, high, mid], {})
    assert chosen is high
    assert others == [mid, low]


def test_select_policy_ties_go_to_the_lowest_name() -> None:
    b, a, c = _p("beta", 3), _p("alpha", 3), _p("gamma", 3)
    chosen, others = select_policy([b, c, a], {})
    assert chosen is a
    assert others == [b, c]


def test_select_policy_ignores_policies_that_do_not_match() -> None:
    h100, a100, catchall = _p("h100", 10, {"pool": "h100"}), _p("a100", 10, {"pool": "a100"}), _p("all", -5)
    chosen, others = select_policy([h100, a100, catchall], {"pool": "a100"})
    assert chosen is a100
    assert others == [catchall]


def test_select_policy_none_matching() -> None:
    assert select_policy([_p("h100", 0, {"pool": "h100"})], {"pool": "a100"}) == (None, [])
    assert select_policy([], {}) == (None, [])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(min_value=-3, max_value=3), st.sampled_from(["a", "b", "c", "d", "e", "f"])),
        min_size=1,
        max_size=8,
        unique_by=lambda t: t[1],
    )
)
def test_select_policy_is_order_independent(entries: list[tuple[int, str]]) -> None:
    policies = [_p(name, prio) for prio, name in entries]
    chosen, others = select_policy(policies, {})
    assert chosen is not None
    assert chosen.name == min(entries, key=lambda e: (-e[0], e[1]))[1]
    chosen_rev, _ = select_policy(list(reversed(policies)), {})
    assert chosen_rev is chosen
    assert len(others) == len(entries) - 1


def test_breaker_limit_refuses_trailing_newline() -> None:
    with pytest.raises(PolicyError):
        breaker_limit("10%\n", 10)


def test_durations_beyond_ten_years_are_refused_not_overflowed() -> None:
    with pytest.raises(ValueError, match="longer than 10 years"):
        parse_duration("99999999999h")
    with pytest.raises(PolicyError, match=r"spec\.rules\.thermal\.sustainedFor"):
        make_policy({"rules": {"thermal": {"sustainedFor": "99999999999h"}}})
