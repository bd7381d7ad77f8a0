"""The soak's slopes: a least-squares fit that sees a leak and calls a flat series flat."""

from __future__ import annotations

from hack.chaos.soak import Series, slope, trend


def test_slope_of_a_line_and_of_noise() -> None:
    xs = [float(x) for x in range(100)]
    assert abs(slope(xs, [3.0 + 0.5 * x for x in xs]) - 0.5) < 1e-9
    assert abs(slope(xs, [10.0 + (1 if x % 2 else -1) for x in xs])) < 0.01
    assert slope([1.0], [5.0]) == 0.0


def test_a_leak_shows_per_hour_and_relative_to_the_mean() -> None:
    xs = [10.0 * i for i in range(60)]  # ten minutes, a sample every 10 s
    leak = trend(xs, [100.0 + x / 60.0 for x in xs])  # 1 MB a minute
    assert abs(leak["per_hour"] - 60.0) < 0.01 and leak["per_hour_pct_of_mean"] > 50
    flat = trend(xs, [100.0] * len(xs))
    assert flat["per_hour"] == 0.0


def test_warm_up_samples_are_left_out() -> None:
    s = Series()
    for i in range(20):
        s.add(10.0 * i, rss=500.0 if i < 6 else 100.0)  # start-up spike, then flat
    assert s.trends(after=60.0)["rss"]["per_hour"] == 0.0
