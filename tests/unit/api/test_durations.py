"""Durations as the CRDs spell them (``api/durations.py``): what parses, what is refused, how a
span is written back, and that a span too long to hold is refused rather than overflowed."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.api.durations import format_duration, parse_duration
from gpuhealth.api.policy import PolicyError
from tests.unit.builders import make_policy


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


def test_durations_beyond_ten_years_are_refused_not_overflowed() -> None:
    with pytest.raises(ValueError, match="longer than 10 years"):
        parse_duration("99999999999h")
    with pytest.raises(PolicyError, match=r"spec\.rules\.thermal\.sustainedFor"):
        make_policy({"rules": {"thermal": {"sustainedFor": "99999999999h"}}})
