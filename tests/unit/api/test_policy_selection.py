"""Which policy a node gets: label selectors (matching, parsing) and ``select_policy`` (priority,
then name; only the policies whose selector matches; the same answer in any order)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.api.policy import Policy, select_policy
from gpuhealth.api.selector import LabelSelector, parse_selector

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
